import Yams

extension ConfigBuilder {
    static let upstreamKeys = [
        "name", "match", "url", "endpoints", "balance", "circuit", "hedge", "tls", "timeouts", "retry", "auth",
        "intercept", "upgrades", "delivery", "queue",
    ]

    /// One `upstreams` entry, and whether it is usable; nil without a valid name. An entry with a bad match or url
    /// is still returned (not usable) so the cross-upstream checks see it too; every section is read so all its
    /// errors are reported.
    mutating func upstream(_ node: Node, index: Int) -> (upstream: UpstreamConfig, site: UpstreamSite, usable: Bool)? {
        let path = "upstreams[\(index)]"
        guard let map = reader.mapping(node, path, allowed: Self.upstreamKeys) else { return nil }
        var name: String?
        if let n = map["name"], let v = reader.string(n, "\(path).name") {
            if Self.isUpstreamName(v) {
                name = v
            } else {
                reader.fail(n, "upstream name '\(v)' must match [a-z0-9_-]+")
            }
        } else if map["name"] == nil {
            reader.fail(node, "\(path) needs 'name'")
        }
        let label = name.map { "upstream '\($0)'" } ?? path
        var match: MatchConfig?
        if let n = map["match"] {
            match = self.match(n, label)
        } else {
            reader.fail(node, "\(label) needs 'match' (hosts and/or path_prefix)")
        }
        let endpoints = self.endpoints(map, node: node, label: label)
        var upstream = UpstreamConfig(
            name: name ?? "", match: match ?? MatchConfig(),
            endpoints: endpoints ?? [UpstreamURL(scheme: "http", host: "invalid")], location: reader.location(node))
        if let n = map["balance"], let v = reader.oneOf(n, "\(label): balance", BalanceMode.allCases) {
            upstream.balance = v
        }
        if let n = map["circuit"] { upstream.circuit = circuit(n, label) }
        if let n = map["tls"] { upstream.tls = tls(n, label) }
        if let n = map["timeouts"] { upstream.timeouts = timeouts(n, label) }
        if let n = map["retry"] { upstream.retry = retry(n, label) }
        // After retry and timeouts: hedged copies count against retry.attempts and must start before per_try ends.
        if let n = map["hedge"] { upstream.hedge = hedge(n, label, retry: upstream.retry, timeouts: upstream.timeouts) }
        var authLocation: SourceLocation?
        if let n = map["auth"] {
            upstream.auth = auth(n, label)
            if case .mapping(let raw) = n, let type = raw["type"] {
                authLocation = reader.location(type)
            } else {
                authLocation = reader.location(n)
            }
        }
        var interceptLocation: SourceLocation?
        if let n = map["intercept"], let v = reader.bool(n, "\(label): intercept") {
            upstream.intercept = v
            interceptLocation = reader.location(n)
        }
        if let n = map["upgrades"], let v = reader.bool(n, "\(label): upgrades") { upstream.upgrades = v }
        let deliveryLocation = delivery(map, label, into: &upstream)
        guard name != nil, let nameNode = map["name"] else { return nil }
        var site = UpstreamSite(
            name: reader.location(nameNode), auth: authLocation, intercept: interceptLocation,
            delivery: deliveryLocation)
        if case .mapping(let tlsMap)? = map["tls"], let certNode = tlsMap["client_cert_entry"] {
            site.clientCert = reader.location(certNode)
        }
        return (upstream, site, match != nil && endpoints != nil)
    }

    static func isUpstreamName(_ text: String) -> Bool {
        !text.isEmpty
            && text.utf8.allSatisfy { (48...57).contains($0) || (97...122).contains($0) || $0 == 95 || $0 == 45 }
    }

    mutating func match(_ node: Node, _ label: String) -> MatchConfig? {
        let errorsBefore = reader.errors.count
        guard let map = reader.mapping(node, "\(label): match", allowed: ["hosts", "path_prefix", "strip_prefix"])
        else {
            return nil
        }
        var config = MatchConfig()
        if let n = map["hosts"], let list = reader.stringList(n, "\(label): match.hosts") {
            // Where each host was listed: a lookup per entry, not a search (a long generated list was quadratic).
            var seen: [String: Int] = [:]
            for (text, itemNode) in list {
                guard let host = Self.hostPattern(text) else {
                    reader.fail(
                        itemNode,
                        "\(label): match.hosts: '\(text)' is not a host name or IP address "
                            + "(no port; one leading '*.' wildcard allowed)")
                    continue
                }
                if let first = seen[host] {
                    reader.fail(
                        itemNode,
                        "\(label): match.hosts lists '\(host)' twice "
                            + "(first at line \(config.hostLocations[first].line))")
                    continue
                }
                seen[host] = config.hosts.count
                config.hosts.append(host)
                config.hostLocations.append(reader.location(itemNode))
            }
        }
        if let n = map["path_prefix"], let prefix = reader.string(n, "\(label): match.path_prefix") {
            if !prefix.hasPrefix("/") {
                reader.fail(n, "\(label): match.path_prefix must start with '/', not '\(prefix)'")
            } else if !prefix.utf8.allSatisfy({
                $0 > 0x20 && $0 < 0x7F && $0 != UInt8(ascii: "?") && $0 != UInt8(ascii: "#")
            }) {
                reader.fail(
                    n, "\(label): match.path_prefix must be a plain path (no query, fragment, spaces), not '\(prefix)'")
            } else {
                var p = prefix
                while p.count > 1 && p.hasSuffix("/") { p.removeLast() }
                config.pathPrefix = p
                config.pathPrefixLocation = reader.location(n)
            }
        }
        if let n = map["strip_prefix"], let v = reader.bool(n, "\(label): match.strip_prefix") {
            config.stripPrefix = v
        }
        // Only when nothing else was wrong with hosts/path_prefix: one error per mistake.
        if config.hosts.isEmpty && config.pathPrefix == nil && reader.errors.count == errorsBefore {
            reader.fail(node, "\(label): match needs at least one of 'hosts' or 'path_prefix'")
        }
        return config
    }

    /// A lowercased host pattern: a DNS name, an IP literal (IPv6 with or without brackets), or `*.` + DNS name.
    static func hostPattern(_ text: String) -> String? {
        var host = text.asciiLowercased()
        if host.hasPrefix("[") && host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        if host.contains(":") { return IPAddressParser.parse(host)?.count == 16 ? host : nil }
        let name = host.hasPrefix("*.") ? String(host.dropFirst(2)) : host
        let labels = name.split(separator: ".", omittingEmptySubsequences: false)
        let valid =
            !name.isEmpty
            && labels.allSatisfy { label in
                !label.isEmpty
                    && label.utf8.allSatisfy {
                        (48...57).contains($0) || (97...122).contains($0) || $0 == 45 || $0 == 95
                    }
            }
        return valid ? host : nil
    }

    /// `url` or `endpoints` (exactly one of them), checked as a set: no duplicates (same scheme, host and port), one
    /// scheme and one base path for all (they share the upstream's `tls`, and a request's path must not depend on
    /// the endpoint it lands on). nil when unusable; every problem is reported.
    mutating func endpoints(_ map: MappingView, node: Node, label: String) -> [UpstreamURL]? {
        switch (map["url"], map["endpoints"]) {
        case (nil, nil):
            reader.fail(node, "\(label) needs 'url' (or 'endpoints', a list of urls)")
            return nil
        case (.some, .some):
            reader.fail(
                map.keyNode("endpoints")!,
                "\(label) has both 'url' and 'endpoints'; write one "
                    + "('url: X' is the same as 'endpoints: [X]')")
            return nil
        case (let n?, nil):
            return upstreamURL(n, "\(label): url").map { [$0] }
        case (nil, let n?):
            guard let items = reader.sequence(n, "\(label): endpoints") else { return nil }
            guard !items.isEmpty else {
                reader.fail(n, "\(label): endpoints needs at least one url")
                return nil
            }
            var found: [(url: UpstreamURL, node: Node)] = []
            var usable = true
            for item in items {
                guard let url = upstreamURL(item, "\(label): endpoints[]") else {
                    usable = false
                    continue
                }
                if let first = found.first(where: { Self.sameEndpoint($0.url, url) }) {
                    let at = reader.location(first.node)
                    reader.fail(
                        item,
                        "\(label): endpoints lists \(url.endpointKey) twice (first at line \(at.line), "
                            + "column \(at.column); endpoints are told apart by scheme, host and port)")
                    usable = false
                    continue
                }
                if let first = found.first {
                    if url.scheme != first.url.scheme {
                        reader.fail(
                            item,
                            "\(label): endpoints mix \(first.url.scheme) and \(url.scheme); all "
                                + "endpoints of one upstream share its tls settings, so they must use one scheme "
                                + "(make another upstream for the others)")
                        usable = false
                        continue
                    }
                    if url.basePath != first.url.basePath {
                        let shown = { (p: String) in p.isEmpty ? "no base path" : "base path '\(p)'" }
                        reader.fail(
                            item,
                            "\(label): this endpoint has \(shown(url.basePath)) but the first has "
                                + "\(shown(first.url.basePath)); every endpoint of one upstream needs the same base path"
                        )
                        usable = false
                        continue
                    }
                }
                found.append((url, item))
            }
            return usable ? found.map(\.url) : nil
        }
    }

    /// Same scheme, host and port; IP literals compared as addresses (`[::1]` is `[0::1]`).
    static func sameEndpoint(_ a: UpstreamURL, _ b: UpstreamURL) -> Bool {
        guard a.scheme == b.scheme, a.effectivePort == b.effectivePort else { return false }
        if let x = IPAddressParser.parse(a.host), let y = IPAddressParser.parse(b.host) { return x == y }
        return a.host == b.host
    }

    mutating func circuit(_ node: Node, _ label: String) -> CircuitConfig {
        var config = CircuitConfig()
        let path = "\(label): circuit"
        guard let map = reader.mapping(node, path, allowed: ["failures", "open_for", "max_inflight"]) else {
            return config
        }
        if let n = map["failures"], let v = reader.int(n, "\(path).failures", range: 0...1000) { config.failures = v }
        if let n = map["open_for"], let v = reader.duration(n, "\(path).open_for") {
            if v <= .zero || v > CircuitConfig.maxOpenFor {
                reader.fail(n, "\(path).open_for must be above 0 and at most 5m (ejections double up to 5m), not \(v)")
            } else {
                config.openFor = v
            }
        }
        if let n = map["max_inflight"], let v = reader.int(n, "\(path).max_inflight", range: 1...1_000_000) {
            config.maxInflight = v
        }
        return config
    }

    mutating func hedge(_ node: Node, _ label: String, retry: RetryConfig, timeouts: Timeouts) -> HedgeConfig {
        var config = HedgeConfig()
        let path = "\(label): hedge"
        guard let map = reader.mapping(node, path, allowed: ["after", "max", "methods"]) else { return config }
        if let n = map["after"] {
            if case .scalar(let s) = n, s.string == "p95" {
                config.after = .p95
            } else if let v = reader.duration(n, "\(path).after") {
                if v <= .zero {
                    reader.fail(n, "\(path).after must be above 0 (or p95)")
                } else if v >= timeouts.perTry {
                    reader.fail(
                        n,
                        "\(path).after (\(v)) is not shorter than timeouts.per_try (\(timeouts.perTry)): the "
                            + "attempt would time out before a copy is sent")
                } else {
                    config.after = .fixed(v)
                }
            }
        }
        if let n = map["max"], let v = reader.int(n, "\(path).max", range: 0...99) {
            if v > retry.attempts - 1 {
                reader.fail(
                    n,
                    "\(path).max (\(v)) is more than retry.attempts - 1 (\(retry.attempts - 1)): hedged "
                        + "copies count as attempts; raise retry.attempts or lower hedge.max")
            } else {
                config.max = v
            }
        }
        if let n = map["methods"], let list = reader.stringList(n, "\(path).methods") {
            config.methods = []
            for (text, itemNode) in list {
                let method = text.asciiUppercased()
                if !HTTPSyntax.isToken(text) {
                    reader.fail(itemNode, "\(path).methods: '\(text)' is not an HTTP method")
                } else if !RetryConfig.defaultMethods.contains(method) {
                    reader.fail(
                        itemNode,
                        "\(path).methods: \(method) is not idempotent (RFC 9110: GET, HEAD, OPTIONS, "
                            + "TRACE, PUT, DELETE); a hedged request reaches the upstream twice")
                } else {
                    config.methods.insert(method)
                }
            }
        }
        return config
    }

    mutating func upstreamURL(_ node: Node, _ path: String) -> UpstreamURL? {
        guard let text = reader.string(node, path) else { return nil }
        switch HTTPURLParser.parse(text) {
        case .failure(let problem):
            reader.fail(node, "\(path) '\(text)' \(problem)")
            return nil
        case .success(let parts):
            if parts.query != nil {
                reader.fail(node, "\(path) '\(text)' must not have a ?query (the client's query is appended)")
                return nil
            }
            var base = parts.path
            while base.hasSuffix("/") { base.removeLast() }
            return UpstreamURL(scheme: parts.scheme, host: parts.host, port: parts.port, basePath: base)
        }
    }

    mutating func tls(_ node: Node, _ label: String) -> TLSConfig {
        var config = TLSConfig()
        guard
            let map = reader.mapping(
                node, "\(label): tls", allowed: ["ca_file", "insecure_skip_verify", "http2", "client_cert_entry"])
        else {
            return config
        }
        if let n = map["client_cert_entry"],
            let v = entryName(n, "\(label): tls.client_cert_entry", content: .clientCertificate)
        {
            config.clientCertEntry = v
        }
        if let n = map["ca_file"], let v = reader.string(n, "\(label): tls.ca_file") {
            config.caFile = caFile(n, v, key: "\(label): tls.ca_file")
        }
        if let n = map["insecure_skip_verify"], let v = reader.bool(n, "\(label): tls.insecure_skip_verify") {
            config.insecureSkipVerify = v
        }
        if let n = map["http2"], let v = reader.bool(n, "\(label): tls.http2") { config.http2 = v }
        return config
    }

    mutating func timeouts(_ node: Node, _ label: String) -> Timeouts {
        var config = Timeouts()
        guard let map = reader.mapping(node, "\(label): timeouts", allowed: ["connect", "per_try", "total", "idle"])
        else {
            return config
        }
        let keys: [(String, WritableKeyPath<Timeouts, Duration>)] = [
            ("connect", \.connect), ("per_try", \.perTry), ("total", \.total), ("idle", \.idle),
        ]
        for (key, field) in keys {
            guard let n = map[key], let v = reader.duration(n, "\(label): timeouts.\(key)") else { continue }
            if v <= .zero {
                reader.fail(n, "\(label): timeouts.\(key) must be above 0")
            } else {
                config[keyPath: field] = v
            }
        }
        // Reported at the value the rule is about (per_try, connect), or at total when that one is a default.
        if config.perTry > config.total, let n = map["per_try"] ?? map["total"] {
            reader.fail(
                n, "\(label): timeouts.per_try (\(config.perTry)) is longer than timeouts.total (\(config.total))")
        }
        if config.connect > config.total, let n = map["connect"] ?? map["total"] {
            reader.fail(
                n, "\(label): timeouts.connect (\(config.connect)) is longer than timeouts.total (\(config.total))")
        }
        return config
    }
}
