import Yams

#if canImport(Glibc)
import Glibc
#endif

/// Turns a YAML config file into a validated `Config`, or into every error it contains, each with the line and
/// column of the offending node (SPEC §2).
public enum ConfigLoader {
    /// Reads and parses `path`; relative paths inside resolve against the file's directory.
    public static func load(path: String) throws(ConfigErrors) -> Config {
        guard let text = readFile(path) else {
            let reason = String(cString: strerror(errno))
            throw ConfigErrors([ConfigError(
                location: SourceLocation(file: path, line: 1, column: 1), message: "cannot read config file: \(reason)")])
        }
        let directory = path.contains("/") ? String(path[..<path.lastIndex(of: "/")!]) : "."
        return try parse(yaml: text, file: path, baseDirectory: directory.isEmpty ? "/" : directory)
    }

    /// Parses YAML text; `file` is used in error messages, `baseDirectory` for relative paths.
    public static func parse(yaml: String, file: String, baseDirectory: String) throws(ConfigErrors) -> Config {
        let root: Node?
        do {
            root = try Yams.compose(yaml: yaml)
        } catch {
            throw ConfigErrors([syntaxError(error, file: file)])
        }
        guard let root else {
            throw ConfigErrors([ConfigError(location: SourceLocation(file: file, line: 1, column: 1), message: "config is empty")])
        }
        var builder = ConfigBuilder(reader: NodeReader(file: file), baseDirectory: absolute(baseDirectory))
        let config = builder.build(root)
        var errors = builder.reader.errors
        if let config { errors += ConfigValidator.validate(config, file: file) }
        errors.sort { ($0.location.line, $0.location.column) < ($1.location.line, $1.location.column) }
        guard errors.isEmpty, var result = config else { throw ConfigErrors(errors) }
        result.sourceFile = file
        return result
    }

    private static func syntaxError(_ error: any Error, file: String) -> ConfigError {
        if let yaml = error as? YamlError {
            switch yaml {
            case .scanner(_, let problem, let mark, _), .parser(_, let problem, let mark, _),
                .composer(_, let problem, let mark, _):
                return ConfigError(
                    location: SourceLocation(file: file, line: mark.line, column: mark.column),
                    message: "YAML syntax error: \(problem)")
            default: break
            }
        }
        return ConfigError(location: SourceLocation(file: file, line: 1, column: 1), message: "YAML error: \(error)")
    }

    static func absolute(_ directory: String) -> String {
        if directory.hasPrefix("/") { return directory }
        var buffer = [CChar](repeating: 0, count: 4096)
        guard getcwd(&buffer, buffer.count) != nil else { return directory }
        let cwd = String(cString: buffer)
        return directory == "." ? cwd : cwd + "/" + directory
    }

    private static func readFile(_ path: String) -> String? {
        guard let file = fopen(path, "rb") else { return nil }
        defer { fclose(file) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = fread(&chunk, 1, chunk.count, file)
            if n > 0 { bytes += chunk[0..<n] }
            if n < chunk.count { break }
            if bytes.count > 16 << 20 { return nil }
        }
        if ferror(file) != 0 { return nil }
        return String(decoding: bytes, as: UTF8.self)
    }
}

/// Walks the node tree section by section into the typed model.
struct ConfigBuilder {
    var reader: NodeReader
    let baseDirectory: String

    func resolve(_ path: String) -> String {
        if path.hasPrefix("/") { return path }
        var relative = Substring(path)
        while relative.hasPrefix("./") { relative = relative.dropFirst(2) }
        return baseDirectory + "/" + relative
    }

    mutating func build(_ root: Node) -> Config? {
        guard let top = reader.mapping(root, "config", allowed: [
            "version", "listen", "admin", "log", "keychain", "limits", "unmatched", "upstreams",
        ]) else { return nil }
        var config = Config()
        if let node = top["version"] {
            if let version = reader.int(node, "version", range: 0...Int.max), version != 1 {
                reader.fail(node, "unsupported config version \(version); this Backstop reads version 1")
            }
        } else {
            reader.fail(root, "missing required key 'version' (write 'version: 1')")
        }
        if let node = top["listen"] {
            config.listeners = listeners(node)
        } else {
            reader.fail(root, "missing required key 'listen' (e.g. 'listen: [127.0.0.1:8080]')")
        }
        if let node = top["admin"] { config.admin = admin(node) }
        if let node = top["log"] { config.log = log(node) }
        if let node = top["keychain"] { config.keychain = keychain(node) }
        if let node = top["limits"] { config.limits = limits(node) }
        if let node = top["unmatched"], let policy = reader.oneOf(node, "unmatched", [UnmatchedPolicy.reject, .passthrough]) {
            config.unmatched = policy
        }
        if let node = top["upstreams"] {
            if case .scalar(let s) = node, s.string.isEmpty || s.string == "~" || s.string == "null" {
                config.upstreams = []
            } else if let items = reader.sequence(node, "upstreams") {
                config.upstreams = items.enumerated().compactMap { upstream($0.element, index: $0.offset) }
            }
        }
        return config
    }

    // MARK: listeners

    mutating func listenAddress(_ node: Node, _ path: String) -> ListenAddress? {
        guard let text = reader.string(node, path) else { return nil }
        if text.hasPrefix("unix:") {
            let socketPath = String(text.dropFirst(5))
            guard !socketPath.isEmpty else {
                reader.fail(node, "'\(path)': 'unix:' needs a socket path")
                return nil
            }
            return .unix(path: resolve(socketPath))
        }
        guard let colon = text.lastIndex(of: ":"), let port = Int(text[text.index(after: colon)...]),
            (0...65535).contains(port)
        else {
            reader.fail(node, "'\(path)': '\(text)' is not HOST:PORT, [IPV6]:PORT or unix:PATH")
            return nil
        }
        var host = String(text[..<colon])
        if host.hasPrefix("[") && host.hasSuffix("]") {
            host = String(host.dropFirst().dropLast())
            guard IPAddressParser.parse(host)?.count == 16 else {
                reader.fail(node, "'\(path)': '\(host)' is not an IPv6 address")
                return nil
            }
        } else if host.contains(":") || host.isEmpty {
            reader.fail(node, "'\(path)': '\(text)' is not HOST:PORT (write IPv6 addresses as [::1]:8080)")
            return nil
        } else if IPAddressParser.parse(host) == nil && host.lowercased() != "localhost" {
            reader.fail(node, "'\(path)': '\(host)' is not an IP address or localhost")
            return nil
        }
        return .tcp(host: host, port: port)
    }

    mutating func listeners(_ node: Node) -> [ListenerConfig] {
        guard let items = reader.sequence(node, "listen") else { return [] }
        if items.isEmpty { reader.fail(node, "'listen' needs at least one address") }
        var out: [ListenerConfig] = []
        for item in items {
            var listener: ListenerConfig?
            var addressNode = item
            if case .mapping = item {
                guard let map = reader.mapping(item, "listen[]", allowed: ["address", "allow_remote", "allow_clients"])
                else { continue }
                guard let address = map["address"] else {
                    reader.fail(item, "listen entry needs 'address'")
                    continue
                }
                addressNode = address
                guard let parsed = listenAddress(address, "listen[].address") else { continue }
                var config = ListenerConfig(address: parsed)
                if let node = map["allow_remote"], let value = reader.bool(node, "listen[].allow_remote") {
                    config.allowRemote = value
                }
                if let node = map["allow_clients"], let list = reader.stringList(node, "listen[].allow_clients") {
                    for (text, itemNode) in list {
                        if let cidr = CIDRParser.parse(text) { config.allowClients.append(cidr) }
                        else { reader.fail(itemNode, "'listen[].allow_clients': '\(text)' is not a CIDR (e.g. 10.0.0.0/8)") }
                    }
                }
                listener = config
            } else if let parsed = listenAddress(item, "listen[]") {
                listener = ListenerConfig(address: parsed)
            }
            guard let listener else { continue }
            if case .tcp(let host, _) = listener.address, !IPAddressParser.isLoopback(host), !listener.allowRemote {
                reader.fail(addressNode, "listen address \(listener.address) is not loopback; add 'allow_remote: true' "
                    + "to this entry (long form: {address: ..., allow_remote: true, allow_clients: [CIDR]})")
            }
            if out.contains(where: { $0.address == listener.address }) {
                reader.fail(addressNode, "duplicate listen address \(listener.address)")
            }
            out.append(listener)
        }
        return out
    }

    mutating func admin(_ node: Node) -> AdminConfig? {
        guard let map = reader.mapping(node, "admin", allowed: ["listen", "allow_remote"]) else { return nil }
        guard let listenNode = map["listen"] else {
            reader.fail(node, "'admin' needs 'listen'")
            return nil
        }
        guard let address = listenAddress(listenNode, "admin.listen") else { return nil }
        var allowRemote = false
        if let n = map["allow_remote"], let v = reader.bool(n, "admin.allow_remote") { allowRemote = v }
        if case .tcp(let host, _) = address, !IPAddressParser.isLoopback(host), !allowRemote {
            reader.fail(listenNode, "admin listener \(address) is not loopback; add 'allow_remote: true' to 'admin'")
        }
        return AdminConfig(address: address)
    }

    mutating func log(_ node: Node) -> LogConfig {
        var config = LogConfig()
        guard let map = reader.mapping(node, "log", allowed: ["level", "format", "access_log"]) else { return config }
        if let n = map["level"], let v = reader.oneOf(n, "log.level", LogLevel.allCases) { config.level = v }
        if let n = map["format"], let v = reader.oneOf(n, "log.format", LogFormat.allCases) { config.format = v }
        if let n = map["access_log"], let v = reader.bool(n, "log.access_log") { config.accessLog = v }
        return config
    }

    mutating func keychain(_ node: Node) -> KeychainConfig? {
        guard let map = reader.mapping(node, "keychain", allowed: ["path", "key_file", "key_credential"]) else {
            return nil
        }
        guard let pathNode = map["path"], let path = reader.string(pathNode, "keychain.path") else {
            if map["path"] == nil { reader.fail(node, "'keychain' needs 'path'") }
            return nil
        }
        switch (map["key_file"], map["key_credential"]) {
        case (let file?, nil):
            guard let keyPath = reader.string(file, "keychain.key_file") else { return nil }
            return KeychainConfig(path: resolve(path), key: .file(path: resolve(keyPath)), keyLocation: reader.location(file))
        case (nil, let credential?):
            guard let name = reader.string(credential, "keychain.key_credential") else { return nil }
            if name.contains("/") { reader.fail(credential, "'keychain.key_credential' is a credential name, not a path") }
            return KeychainConfig(path: resolve(path), key: .credential(name: name), keyLocation: reader.location(credential))
        case (.some, .some):
            reader.fail(map.keyNode("key_credential")!, "'keychain' takes key_file or key_credential, not both")
            return nil
        case (nil, nil):
            reader.fail(node, "'keychain' needs 'key_file' (or 'key_credential')")
            return nil
        }
    }

    mutating func limits(_ node: Node) -> Limits {
        var limits = Limits()
        guard let map = reader.mapping(node, "limits", allowed: [
            "max_request_body", "retry_buffer", "max_header_bytes", "client_idle_timeout", "max_connections",
        ]) else { return limits }
        if let n = map["max_request_body"], let v = reader.size(n, "limits.max_request_body") { limits.maxRequestBody = v }
        if let n = map["retry_buffer"], let v = reader.size(n, "limits.retry_buffer") { limits.retryBuffer = v }
        if let n = map["max_header_bytes"], let v = reader.size(n, "limits.max_header_bytes") {
            if v < 1024 { reader.fail(n, "'limits.max_header_bytes' must be at least 1KiB") } else { limits.maxHeaderBytes = v }
        }
        if let n = map["client_idle_timeout"], let v = reader.duration(n, "limits.client_idle_timeout") {
            if v <= .zero { reader.fail(n, "'limits.client_idle_timeout' must be above 0") } else { limits.clientIdleTimeout = v }
        }
        if let n = map["max_connections"], let v = reader.int(n, "limits.max_connections", range: 1...1_000_000) {
            limits.maxConnections = v
        }
        return limits
    }

    // MARK: upstreams

    mutating func upstream(_ node: Node, index: Int) -> UpstreamConfig? {
        let path = "upstreams[\(index)]"
        guard let map = reader.mapping(node, path, allowed: ["name", "match", "url", "tls", "timeouts", "retry", "auth"])
        else { return nil }
        var valid = true
        var name = ""
        if let n = map["name"], let v = reader.string(n, "\(path).name") {
            if v.allSatisfy({ $0.isASCIIDigit || ("a"..."z").contains($0) || $0 == "_" || $0 == "-" }) {
                name = v
            } else {
                reader.fail(n, "upstream name '\(v)' must match [a-z0-9_-]+")
                valid = false
            }
        } else {
            if map["name"] == nil { reader.fail(node, "\(path) needs 'name'") }
            valid = false
        }
        let label = name.isEmpty ? path : "upstream '\(name)'"
        var match = MatchConfig()
        if let n = map["match"] { match = self.match(n, label) ?? match } else {
            reader.fail(node, "\(label) needs 'match' (hosts and/or path_prefix)")
            valid = false
        }
        var url: UpstreamURL?
        if let n = map["url"] { url = upstreamURL(n, "\(label): url") } else {
            reader.fail(node, "\(label) needs 'url'")
        }
        var upstream = UpstreamConfig(name: name, match: match, url: url ?? UpstreamURL(scheme: "http", host: "invalid"),
                                      location: reader.location(node))
        if let n = map["tls"] { upstream.tls = tls(n, label) }
        if let n = map["timeouts"] { upstream.timeouts = timeouts(n, label) }
        if let n = map["retry"] { upstream.retry = retry(n, label) }
        if let n = map["auth"] { upstream.auth = auth(n, label) }
        guard valid, url != nil else { return nil }
        return upstream
    }

    mutating func match(_ node: Node, _ label: String) -> MatchConfig? {
        guard let map = reader.mapping(node, "\(label): match", allowed: ["hosts", "path_prefix", "strip_prefix"]) else {
            return nil
        }
        var config = MatchConfig()
        if let n = map["hosts"], let list = reader.stringList(n, "\(label): match.hosts") {
            for (text, itemNode) in list {
                let host = text.lowercased()
                let bare = host.hasPrefix("*.") ? String(host.dropFirst(2)) : host
                let valid = !bare.isEmpty && !bare.contains("*")
                    && bare.allSatisfy { $0.isLetter || $0.isNumber || $0 == "-" || $0 == "." || $0 == "_" || $0 == ":" }
                if valid {
                    config.hosts.append(host)
                    config.hostLocations.append(reader.location(itemNode))
                } else {
                    reader.fail(itemNode, "\(label): match.hosts: '\(text)' is not a host name (one leading '*.' wildcard allowed)")
                }
            }
        }
        if let n = map["path_prefix"], let prefix = reader.string(n, "\(label): match.path_prefix") {
            if !prefix.hasPrefix("/") || prefix.contains("?") || prefix.contains("#") {
                reader.fail(n, "\(label): match.path_prefix must start with '/' and hold no query, not '\(prefix)'")
            } else {
                var p = prefix
                while p.count > 1 && p.hasSuffix("/") { p.removeLast() }
                config.pathPrefix = p
                config.pathPrefixLocation = reader.location(n)
            }
        }
        if let n = map["strip_prefix"], let v = reader.bool(n, "\(label): match.strip_prefix") { config.stripPrefix = v }
        if config.hosts.isEmpty && config.pathPrefix == nil && map["hosts"] == nil && map["path_prefix"] == nil {
            reader.fail(node, "\(label): match needs 'hosts' or 'path_prefix'")
        }
        return config
    }

    mutating func upstreamURL(_ node: Node, _ path: String) -> UpstreamURL? {
        guard let text = reader.string(node, path) else { return nil }
        guard let parsed = RequestTarget.parse(text), case .absolute(let scheme, let host, let port) = parsed.form,
            parsed.query == nil, !text.contains("#")
        else {
            reader.fail(node, "\(path): '\(text)' is not an http:// or https:// URL without query or fragment")
            return nil
        }
        var base = parsed.path
        while base.hasSuffix("/") { base.removeLast() }
        return UpstreamURL(scheme: scheme, host: host, port: port, basePath: base)
    }

    mutating func tls(_ node: Node, _ label: String) -> TLSConfig {
        var config = TLSConfig()
        guard let map = reader.mapping(node, "\(label): tls", allowed: ["ca_file", "insecure_skip_verify"]) else { return config }
        if let n = map["ca_file"], let v = reader.string(n, "\(label): tls.ca_file") { config.caFile = resolve(v) }
        if let n = map["insecure_skip_verify"], let v = reader.bool(n, "\(label): tls.insecure_skip_verify") {
            config.insecureSkipVerify = v
        }
        return config
    }

    mutating func timeouts(_ node: Node, _ label: String) -> Timeouts {
        var config = Timeouts()
        guard let map = reader.mapping(node, "\(label): timeouts", allowed: ["connect", "per_try", "total"]) else { return config }
        for key in ["connect", "per_try", "total"] {
            guard let n = map[key], let v = reader.duration(n, "\(label): timeouts.\(key)") else { continue }
            if v <= .zero {
                reader.fail(n, "\(label): timeouts.\(key) must be above 0")
                continue
            }
            switch key {
            case "connect": config.connect = v
            case "per_try": config.perTry = v
            default: config.total = v
            }
        }
        if config.perTry > config.total, let n = map["per_try"] ?? map["total"] {
            reader.fail(n, "\(label): timeouts.per_try (\(config.perTry)) is longer than timeouts.total (\(config.total))")
        }
        if config.connect > config.total, let n = map["connect"] ?? map["total"] {
            reader.fail(n, "\(label): timeouts.connect (\(config.connect)) is longer than timeouts.total (\(config.total))")
        }
        return config
    }

    mutating func retry(_ node: Node, _ label: String) -> RetryConfig {
        var config = RetryConfig()
        guard let map = reader.mapping(node, "\(label): retry", allowed: [
            "attempts", "on", "methods", "retry_non_idempotent_with_key", "backoff", "retry_after", "budget",
        ]) else { return config }
        if let n = map["attempts"], let v = reader.int(n, "\(label): retry.attempts", range: 1...100) { config.attempts = v }
        if let n = map["on"], let list = reader.stringList(n, "\(label): retry.on") {
            var on: Set<RetryCondition> = []
            for (text, itemNode) in list {
                switch text {
                case "connect-failure": on.insert(.connectFailure)
                case "reset": on.insert(.reset)
                case "timeout": on.insert(.timeout)
                default:
                    if let code = Int(text), (100...599).contains(code) { on.insert(.status(code)) } else {
                        reader.fail(itemNode, "\(label): retry.on: '\(text)' is not connect-failure, reset, timeout or a status code 100-599")
                    }
                }
            }
            config.on = on
        }
        if let n = map["methods"], let list = reader.stringList(n, "\(label): retry.methods") {
            var methods: Set<String> = []
            for (text, itemNode) in list {
                if text.allSatisfy({ $0.isLetter || $0 == "-" || $0 == "_" }) { methods.insert(text.uppercased()) } else {
                    reader.fail(itemNode, "\(label): retry.methods: '\(text)' is not an HTTP method")
                }
            }
            config.methods = methods
        }
        if let n = map["retry_non_idempotent_with_key"] {
            if case .scalar(let s) = n, s.string.isEmpty || s.string == "~" || s.string == "null" {
                config.retryNonIdempotentWithKey = nil
            } else if let v = reader.string(n, "\(label): retry.retry_non_idempotent_with_key") {
                config.retryNonIdempotentWithKey = v
            }
        }
        if let n = map["backoff"] { config.backoff = backoff(n, label) }
        if let n = map["retry_after"], let m = reader.mapping(n, "\(label): retry.retry_after", allowed: ["honor", "max"]) {
            if let h = m["honor"], let v = reader.bool(h, "\(label): retry.retry_after.honor") { config.retryAfter.honor = v }
            if let x = m["max"], let v = reader.duration(x, "\(label): retry.retry_after.max") { config.retryAfter.max = v }
        }
        if let n = map["budget"], let m = reader.mapping(n, "\(label): retry.budget", allowed: ["ratio", "min_per_second"]) {
            if let r = m["ratio"], let v = reader.double(r, "\(label): retry.budget.ratio", minimum: 0) { config.budget.ratio = v }
            if let x = m["min_per_second"], let v = reader.double(x, "\(label): retry.budget.min_per_second", minimum: 0) {
                config.budget.minPerSecond = v
            }
        }
        return config
    }

    mutating func backoff(_ node: Node, _ label: String) -> BackoffConfig {
        var config = BackoffConfig()
        guard let map = reader.mapping(node, "\(label): retry.backoff", allowed: ["strategy", "base", "max", "multiplier", "jitter"])
        else { return config }
        if let n = map["strategy"], let v = reader.oneOf(n, "\(label): retry.backoff.strategy", BackoffStrategy.allCases) {
            config.strategy = v
        }
        if let n = map["base"], let v = reader.duration(n, "\(label): retry.backoff.base") { config.base = v }
        if let n = map["max"], let v = reader.duration(n, "\(label): retry.backoff.max") { config.max = v }
        if let n = map["multiplier"], let v = reader.double(n, "\(label): retry.backoff.multiplier", minimum: 1) {
            config.multiplier = v
        }
        if let n = map["jitter"], let v = reader.oneOf(n, "\(label): retry.backoff.jitter", JitterMode.allCases) { config.jitter = v }
        if config.base > config.max, let n = map["base"] ?? map["max"] {
            reader.fail(n, "\(label): retry.backoff.base (\(config.base)) is larger than retry.backoff.max (\(config.max))")
        }
        return config
    }

    mutating func auth(_ node: Node, _ label: String) -> AuthConfig {
        let common = ["type", "header", "scheme", "client_auth_header"]
        let staticKeys = common + ["entry"]
        let oauthKeys = common + [
            "token_url", "grant", "request_format", "client_id", "client_secret_entry", "scope", "keychain_prefix",
            "fields", "refresh_on", "refresh_ahead",
        ]
        guard case .mapping = node else {
            reader.fail(node, "'\(label): auth' must be a mapping")
            return .none
        }
        var typeName = "none"
        if case .mapping(let raw) = node, let typeNode = raw["type"], let t = reader.string(typeNode, "\(label): auth.type") {
            typeName = t
            if !["none", "static", "oauth2"].contains(t) {
                reader.fail(typeNode, "\(label): auth.type must be one of none | static | oauth2, not '\(t)'")
                return .none
            }
        }
        switch typeName {
        case "static":
            guard let map = reader.mapping(node, "\(label): auth", allowed: staticKeys) else { return .none }
            guard let n = map["entry"], let entry = reader.string(n, "\(label): auth.entry") else {
                if map["entry"] == nil { reader.fail(node, "\(label): static auth needs 'entry' (a keychain entry name)") }
                return .none
            }
            var config = StaticAuthConfig(entry: entry)
            if let n = map["header"], let v = reader.string(n, "\(label): auth.header") { config.header = v }
            if let n = map["scheme"], let v = reader.string(n, "\(label): auth.scheme", allowEmpty: true) { config.scheme = v }
            if let n = map["client_auth_header"],
                let v = reader.oneOf(n, "\(label): auth.client_auth_header", [ClientAuthHeaderPolicy.replace, .keep]) {
                config.clientAuthHeader = v
            }
            return .staticToken(config)
        case "oauth2":
            guard let map = reader.mapping(node, "\(label): auth", allowed: oauthKeys) else { return .none }
            var tokenURL = ""
            if let n = map["token_url"], let v = reader.string(n, "\(label): auth.token_url") {
                if let target = RequestTarget.parse(v), case .absolute = target.form { tokenURL = v } else {
                    reader.fail(n, "\(label): auth.token_url '\(v)' is not an http:// or https:// URL")
                }
            } else if map["token_url"] == nil {
                reader.fail(node, "\(label): oauth2 auth needs 'token_url'")
            }
            var prefix = ""
            if let n = map["keychain_prefix"], let v = reader.string(n, "\(label): auth.keychain_prefix") { prefix = v } else if map["keychain_prefix"] == nil {
                reader.fail(node, "\(label): oauth2 auth needs 'keychain_prefix'")
            }
            var config = OAuth2Config(tokenURL: tokenURL, keychainPrefix: prefix)
            if let n = map["grant"], let v = reader.oneOf(n, "\(label): auth.grant", [OAuth2Grant.refreshToken, .clientCredentials]) {
                config.grant = v
            }
            if let n = map["request_format"], let v = reader.oneOf(n, "\(label): auth.request_format", [TokenRequestFormat.form, .json]) {
                config.requestFormat = v
            }
            if let n = map["client_id"], let v = reader.string(n, "\(label): auth.client_id") { config.clientID = v }
            if let n = map["client_secret_entry"], let v = reader.string(n, "\(label): auth.client_secret_entry") {
                config.clientSecretEntry = v
            }
            if let n = map["scope"], let v = reader.string(n, "\(label): auth.scope", allowEmpty: true) { config.scope = v }
            if let n = map["header"], let v = reader.string(n, "\(label): auth.header") { config.header = v }
            if let n = map["scheme"], let v = reader.string(n, "\(label): auth.scheme", allowEmpty: true) { config.scheme = v }
            if let n = map["client_auth_header"],
                let v = reader.oneOf(n, "\(label): auth.client_auth_header", [ClientAuthHeaderPolicy.replace, .keep]) {
                config.clientAuthHeader = v
            }
            if let n = map["refresh_ahead"], let v = reader.duration(n, "\(label): auth.refresh_ahead") { config.refreshAhead = v }
            if let n = map["refresh_on"], let items = reader.sequence(n, "\(label): auth.refresh_on") {
                var codes: Set<Int> = []
                for item in items {
                    if let code = reader.int(item, "\(label): auth.refresh_on[]", range: 100...599) { codes.insert(code) }
                }
                config.refreshOn = codes
            }
            if let n = map["fields"], let m = reader.mapping(n, "\(label): auth.fields", allowed: ["access_token", "refresh_token", "expires_in"]) {
                if let x = m["access_token"], let v = reader.string(x, "\(label): auth.fields.access_token") { config.fields.accessToken = v }
                if let x = m["refresh_token"], let v = reader.string(x, "\(label): auth.fields.refresh_token") { config.fields.refreshToken = v }
                if let x = m["expires_in"], let v = reader.string(x, "\(label): auth.fields.expires_in") { config.fields.expiresIn = v }
            }
            if config.grant == .clientCredentials && config.clientID == nil {
                reader.fail(node, "\(label): grant client_credentials needs 'client_id'")
            }
            return .oauth2(config)
        default:
            _ = reader.mapping(node, "\(label): auth", allowed: ["type"])
            return .none
        }
    }
}
