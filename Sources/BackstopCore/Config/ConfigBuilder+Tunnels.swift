import Yams

extension ConfigBuilder {
    /// `tunnels` (docs/reference/config.md#tunnels): blind `CONNECT` tunnels.
    mutating func tunnels(_ node: Node) -> TunnelsConfig? {
        guard let map = reader.mapping(node, "tunnels", allowed: ["allow", "deny_addresses", "idle_timeout"]) else {
            return nil
        }
        var config = TunnelsConfig()
        if let n = map["allow"], let list = reader.stringList(n, "tunnels.allow") {
            var seen = Set<TunnelPattern>()  // a lookup per entry: a long generated list is not quadratic
            for (text, itemNode) in list {
                guard let pattern = Self.tunnelPattern(text) else {
                    reader.fail(
                        itemNode,
                        "tunnels.allow: '\(text)' is not HOST[:PORT] (a host name, '*.' + name or IP "
                            + "address; [IPv6]:PORT; the port defaults to 443)")
                    continue
                }
                if !seen.insert(pattern).inserted {
                    reader.fail(itemNode, "tunnels.allow lists '\(pattern)' twice")
                    continue
                }
                config.allow.append(pattern)
            }
        } else if map["allow"] == nil {
            reader.fail(node, "'tunnels' needs 'allow' (HOST[:PORT] patterns, e.g. [\"*.github.com:443\"])")
        }
        if let n = map["deny_addresses"], let list = reader.stringList(n, "tunnels.deny_addresses") {
            config.denyAddresses = []
            for (text, itemNode) in list {
                if let cidr = CIDRParser.parse(text) {
                    config.denyAddresses.append(cidr)
                } else {
                    reader.fail(itemNode, "tunnels.deny_addresses: '\(text)' is not a CIDR (10.0.0.0/8, fc00::/7)")
                }
            }
        }
        if let n = map["idle_timeout"], let v = reader.duration(n, "tunnels.idle_timeout") {
            if v <= .zero {
                reader.fail(n, "'tunnels.idle_timeout' must be above 0")
            } else {
                config.idleTimeout = v
            }
        }
        return config
    }

    /// `HOST[:PORT]`, `[IPV6][:PORT]`; the port defaults to 443. HOST as in `match.hosts`.
    static func tunnelPattern(_ text: String) -> TunnelPattern? {
        var hostPart = Substring(text)
        var port = 443
        if text.hasPrefix("[") {
            guard let close = text.firstIndex(of: "]") else { return nil }
            hostPart = text[...close]
            let rest = text[text.index(after: close)...]
            if !rest.isEmpty {
                guard rest.hasPrefix(":"), let p = Self.port(rest.dropFirst()) else { return nil }
                port = p
            }
        } else if let colon = text.lastIndex(of: ":") {
            // An IPv6 literal without brackets has several colons and no port.
            if text.firstIndex(of: ":") == colon {
                hostPart = text[..<colon]
                guard let p = Self.port(text[text.index(after: colon)...]) else { return nil }
                port = p
            }
        }
        guard let host = hostPattern(String(hostPart)) else { return nil }
        return TunnelPattern(host: host, port: port)
    }

    private static func port(_ text: Substring) -> Int? {
        guard !text.isEmpty, text.count <= 5, text.allSatisfy(\.isASCIIDigit), let value = Int(text),
            (1...65535).contains(value)
        else { return nil }
        return value
    }

    /// `intercept` (docs/reference/config.md#intercept): the local CA of intercepting upstreams.
    mutating func intercept(_ node: Node) -> InterceptConfig? {
        guard let map = reader.mapping(node, "intercept", allowed: ["ca_entry", "leaf_lifetime"]) else { return nil }
        var config = InterceptConfig()
        if let n = map["ca_entry"], let v = validEntryName(n, "intercept.ca_entry") { config.caEntry = v }
        if let n = map["leaf_lifetime"], let v = reader.duration(n, "intercept.leaf_lifetime") {
            if v < .seconds(60) || v > .seconds(397 * 86_400) {
                // Browsers and most TLS stacks refuse leaves valid for more than 398 days; under a minute is a typo.
                reader.fail(n, "'intercept.leaf_lifetime' must be between 1m and 397 days (9528h), not \(v)")
            } else {
                config.leafLifetime = v
            }
        }
        return config
    }
}
