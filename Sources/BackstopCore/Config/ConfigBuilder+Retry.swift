import Yams

extension ConfigBuilder {
    static let retryKeys = [
        "attempts", "on", "methods", "retry_non_idempotent_with_key", "backoff", "retry_after", "budget",
        "on_network_change",
    ]

    mutating func retry(_ node: Node, _ label: String) -> RetryConfig {
        var config = RetryConfig()
        let path = "\(label): retry"
        guard let map = reader.mapping(node, path, allowed: Self.retryKeys) else { return config }
        if let n = map["attempts"], let v = reader.int(n, "\(path).attempts", range: 1...100) { config.attempts = v }
        if let n = map["on"], let list = reader.stringList(n, "\(path).on") {
            config.on = []
            for (text, itemNode) in list {
                if let condition = Self.retryCondition(text) {
                    config.on.insert(condition)
                } else {
                    reader.fail(
                        itemNode,
                        "\(path).on: '\(text)' is not connect-failure, reset, timeout or a status code 100-599")
                }
            }
        }
        if let n = map["methods"], let list = reader.stringList(n, "\(path).methods") {
            config.methods = []
            for (text, itemNode) in list {
                if HTTPSyntax.isToken(text) {
                    config.methods.insert(text.asciiUppercased())
                } else {
                    reader.fail(itemNode, "\(path).methods: '\(text)' is not an HTTP method")
                }
            }
        }
        if let n = map["retry_non_idempotent_with_key"] {
            if NodeReader.isNull(n) || NodeReader.isEmptyString(n) {
                config.retryNonIdempotentWithKey = nil
            } else if let v = reader.string(n, "\(path).retry_non_idempotent_with_key") {
                if headerName(v, n, "\(path).retry_non_idempotent_with_key") { config.retryNonIdempotentWithKey = v }
            }
        }
        if let n = map["backoff"] { config.backoff = backoff(n, path) }
        if let n = map["retry_after"], let m = reader.mapping(n, "\(path).retry_after", allowed: ["honor", "max"]) {
            if let h = m["honor"], let v = reader.bool(h, "\(path).retry_after.honor") { config.retryAfter.honor = v }
            if let x = m["max"], let v = reader.duration(x, "\(path).retry_after.max") { config.retryAfter.max = v }
        }
        if let n = map["budget"], let m = reader.mapping(n, "\(path).budget", allowed: ["ratio", "min_per_second"]) {
            if let r = m["ratio"], let v = reader.double(r, "\(path).budget.ratio", minimum: 0) {
                config.budget.ratio = v
            }
            if let x = m["min_per_second"], let v = reader.double(x, "\(path).budget.min_per_second", minimum: 0) {
                config.budget.minPerSecond = v
            }
        }
        if let n = map["on_network_change"], let v = reader.bool(n, "\(path).on_network_change") {
            config.onNetworkChange = v
        }
        return config
    }

    static func retryCondition(_ text: String) -> RetryCondition? {
        switch text {
        case "connect-failure": return .connectFailure
        case "reset": return .reset
        case "timeout": return .timeout
        default:
            guard text.count == 3, text.allSatisfy(\.isASCIIDigit), let code = Int(text), (100...599).contains(code)
            else {
                return nil
            }
            return .status(code)
        }
    }

    mutating func backoff(_ node: Node, _ retryPath: String) -> BackoffConfig {
        var config = BackoffConfig()
        let path = "\(retryPath).backoff"
        guard let map = reader.mapping(node, path, allowed: ["strategy", "base", "max", "multiplier", "jitter"]) else {
            return config
        }
        if let n = map["strategy"], let v = reader.oneOf(n, "\(path).strategy", BackoffStrategy.allCases) {
            config.strategy = v
        }
        if let n = map["base"], let v = reader.duration(n, "\(path).base") { config.base = v }
        if let n = map["max"], let v = reader.duration(n, "\(path).max") { config.max = v }
        if let n = map["multiplier"], let v = reader.double(n, "\(path).multiplier", minimum: 1) {
            config.multiplier = v
        }
        if let n = map["jitter"], let v = reader.oneOf(n, "\(path).jitter", JitterMode.allCases) { config.jitter = v }
        if config.base > config.max, let n = map["base"] ?? map["max"] {
            reader.fail(n, "\(path).base (\(config.base)) is larger than \(path).max (\(config.max))")
        }
        return config
    }
}

extension StringProtocol {
    /// Uppercases ASCII letters only (method names are ASCII tokens).
    func asciiUppercased() -> String {
        String(decoding: utf8.map { (97...122).contains($0) ? $0 - 32 : $0 }, as: UTF8.self)
    }
}
