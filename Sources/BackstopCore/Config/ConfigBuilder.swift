import Yams

/// Walks the node tree section by section into the typed model, reporting every problem through `reader`.
/// Sections that fail keep their defaults so later sections are still checked.
struct ConfigBuilder {
    var reader: NodeReader
    let baseDirectory: String
    /// Every upstream with a valid name, usable or not, for the cross-section checks (a broken url must not hide a
    /// duplicate name), with the positions those checks report at.
    var checkedUpstreams: [UpstreamConfig] = []
    var upstreamSites: [UpstreamSite] = []
    /// Where the `intercept` section was written, when it was.
    var interceptLocation: SourceLocation?
    /// Keychain entries named by identity settings, in file order (`Config.keychainReferences`).
    var keychainReferences: [KeychainReference] = []
    /// CA bundles the config names, in file order (`Config.caFileReferences`).
    var caFileReferences: [FileReference] = []
    /// Unix sockets the listeners bind, in file order (`Config.unixSocketReferences`).
    var unixSocketReferences: [FileReference] = []
    /// Where each `clients` entry's parts were written, for the checks against upstreams and listeners.
    var clientSites: [ClientSite] = []

    static let topKeys = [
        "version", "listen", "admin", "log", "keychain", "limits", "unmatched", "upstreams", "tunnels", "intercept",
        "token_store", "tracing", "clients", "spool",
    ]

    /// `path` made absolute against the config's directory.
    /// Whether two absolute paths name the same file as written (`.` and empty segments aside; links are not
    /// followed: the files may not exist yet).
    static func samePath(_ a: String, _ b: String?) -> Bool {
        guard let b else { return false }
        func segments(_ path: String) -> [Substring] {
            path.split(separator: "/", omittingEmptySubsequences: true).filter { $0 != "." }
        }
        return segments(a) == segments(b)
    }

    func resolve(_ path: String) -> String {
        if path.hasPrefix("/") { return path }
        var relative = Substring(path)
        while relative.hasPrefix("./") { relative = relative.dropFirst(2) }
        if relative.isEmpty || relative == "." { return baseDirectory }
        return (baseDirectory.hasSuffix("/") ? String(baseDirectory.dropLast()) : baseDirectory) + "/" + relative
    }

    /// `path` (a config value) made absolute, and noted as a CA bundle named by `key` at `node` for `check`.
    mutating func caFile(_ node: Node, _ path: String, key: String) -> String {
        let absolute = resolve(path)
        caFileReferences.append(FileReference(path: absolute, key: key, location: reader.location(node)))
        return absolute
    }

    mutating func build(_ root: Node) -> Config? {
        guard let top = reader.mapping(root, "config", allowed: Self.topKeys) else { return nil }
        var config = Config()
        if let node = top["version"] {
            if let version = reader.int(node, "version", range: Int.min...Int.max), version != 1 {
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
        if let node = top["admin"] { config.admin = admin(node, proxyListeners: config.listeners) }
        if let node = top["log"] { config.log = log(node) }
        if let node = top["keychain"] { config.keychain = keychain(node) }
        if let node = top["limits"] { config.limits = limits(node) }
        if let node = top["unmatched"],
            let policy = reader.oneOf(node, "unmatched", [UnmatchedPolicy.reject, .passthrough])
        {
            config.unmatched = policy
        }
        if let node = top["upstreams"], !NodeReader.isNull(node), let items = reader.sequence(node, "upstreams") {
            for (index, item) in items.enumerated() {
                guard let entry = upstream(item, index: index) else { continue }
                if entry.usable { config.upstreams.append(entry.upstream) }
                checkedUpstreams.append(entry.upstream)
                upstreamSites.append(entry.site)
            }
        }
        if let node = top["tunnels"], !NodeReader.isNull(node) { config.tunnels = tunnels(node) }
        if let node = top["token_store"], !NodeReader.isNull(node) {
            config.tokenStore = tokenStore(node)
            if case .postgres = config.tokenStore, config.keychain == nil {
                reader.fail(
                    node,
                    "token_store type postgres needs a 'keychain' section: tokens are encrypted under the "
                        + "keychain key, and the password entry lives there")
            }
        }
        if let node = top["tracing"], !NodeReader.isNull(node) { config.tracing = tracing(node) }
        if let node = top["spool"], !NodeReader.isNull(node) {
            config.spool = spool(node, limits: config.limits)
        }
        if let node = top["intercept"], !NodeReader.isNull(node) {
            config.intercept = intercept(node)
            interceptLocation = reader.location(node)
        }
        if let node = top["clients"] { config.clients = clients(node) }
        config.keychainReferences = keychainReferences
        config.caFileReferences = caFileReferences
        config.unixSocketReferences = unixSocketReferences
        return config
    }

    // MARK: listeners

    /// `HOST:PORT`, `[IPV6]:PORT` or `unix:PATH`. HOST is an IP literal or `localhost` (a listener binds, it does
    /// not resolve names).
    mutating func listenAddress(_ node: Node, _ path: String) -> ListenAddress? {
        guard let text = reader.string(node, path) else { return nil }
        if text.hasPrefix("unix:") {
            let socketPath = String(text.dropFirst(5))
            guard !socketPath.isEmpty else {
                reader.fail(
                    node, "\(NodeReader.quoted(path)): 'unix:' needs a socket path (unix:/run/backstop/proxy.sock)")
                return nil
            }
            let absolute = resolve(socketPath)
            // A socket address holds 107 bytes of path (`sun_path`): a longer one cannot be bound.
            guard absolute.utf8.count <= 107 else {
                reader.fail(
                    node,
                    "\(NodeReader.quoted(path)): the socket path is \(absolute.utf8.count) bytes once absolute; a "
                        + "unix socket's path holds at most 107")
                return nil
            }
            unixSocketReferences.append(FileReference(path: absolute, key: path, location: reader.location(node)))
            return .unix(path: absolute)
        }
        guard let colon = text.lastIndex(of: ":") else {
            reader.fail(node, "\(NodeReader.quoted(path)): '\(text)' is not HOST:PORT, [IPV6]:PORT or unix:PATH")
            return nil
        }
        let portText = text[text.index(after: colon)...]
        guard !portText.isEmpty, portText.count <= 5, portText.allSatisfy(\.isASCIIDigit), let port = Int(portText),
            port <= 65535
        else {
            reader.fail(node, "\(NodeReader.quoted(path)): '\(text)' needs a port from 0 to 65535 (HOST:PORT)")
            return nil
        }
        var host = String(text[..<colon])
        if host.hasPrefix("[") && host.hasSuffix("]") {
            host = String(host.dropFirst().dropLast())
            guard IPAddressParser.parse(host)?.count == 16 else {
                reader.fail(node, "\(NodeReader.quoted(path)): '\(host)' is not an IPv6 address")
                return nil
            }
        } else if host.contains(":") || host.isEmpty {
            reader.fail(
                node, "\(NodeReader.quoted(path)): '\(text)' is not HOST:PORT (write IPv6 addresses as [::1]:8080)")
            return nil
        } else if IPAddressParser.parse(host) == nil {
            guard host.asciiLowercased() == "localhost" else {
                reader.fail(node, "\(NodeReader.quoted(path)): '\(host)' is not an IP address or localhost")
                return nil
            }
            host = "localhost"
        }
        return .tcp(host: host, port: port)
    }

    mutating func listeners(_ node: Node) -> [ListenerConfig] {
        guard let items = reader.sequence(node, "listen") else { return [] }
        if items.isEmpty { reader.fail(node, "'listen' needs at least one address") }
        var out: [ListenerConfig] = []
        // Compared only with those on the same port (or path): a long list is not quadratic.
        var byPort: [Int: [ListenAddress]] = [:]
        var paths = Set<String>()
        for item in items {
            guard let (listener, addressNode) = listener(item) else { continue }
            if case .tcp(let host, _) = listener.address, !IPAddressParser.isLoopback(host), !listener.allowRemote {
                reader.fail(
                    addressNode,
                    "listen address \(listener.address) is not loopback; add 'allow_remote: true' "
                        + "to this entry (long form: {address: ..., allow_remote: true, allow_clients: [CIDR]})")
            }
            let earlier: ListenAddress?
            switch listener.address {
            case .tcp(_, let port):
                earlier = byPort[port]?.first { $0.clashes(with: listener.address) }
                byPort[port, default: []].append(listener.address)
            case .unix(let path):
                earlier = paths.insert(path).inserted ? nil : listener.address
            }
            if let earlier {
                reader.fail(
                    addressNode,
                    "duplicate listen address \(listener.address)"
                        + (earlier == listener.address ? "" : " (it binds what \(earlier) binds)"))
            }
            out.append(listener)
        }
        return out
    }

    /// One `listen` entry, short or long form, with the node its address came from.
    private mutating func listener(_ item: Node) -> (ListenerConfig, Node)? {
        guard case .mapping = item else {
            return listenAddress(item, "listen[]").map { (ListenerConfig(address: $0), item) }
        }
        guard let map = reader.mapping(item, "listen[]", allowed: ["address", "allow_remote", "allow_clients"]) else {
            return nil
        }
        guard let addressNode = map["address"] else {
            reader.fail(item, "listen entry needs 'address'")
            return nil
        }
        let parsed = listenAddress(addressNode, "listen[].address")
        var allowRemote = false
        if let node = map["allow_remote"], let value = reader.bool(node, "listen[].allow_remote") {
            allowRemote = value
        }
        let clients = map["allow_clients"].map { allowClients($0, "listen[].allow_clients") } ?? []
        guard let parsed else { return nil }
        return (ListenerConfig(address: parsed, allowRemote: allowRemote, allowClients: clients), addressNode)
    }

    /// A list of CIDRs (`allow_clients`).
    private mutating func allowClients(_ node: Node, _ path: String) -> [CIDR] {
        guard let list = reader.stringList(node, path) else { return [] }
        var clients: [CIDR] = []
        for (text, itemNode) in list {
            if let cidr = CIDRParser.parse(text) {
                clients.append(cidr)
            } else {
                reader.fail(itemNode, "\(NodeReader.quoted(path)): '\(text)' is not a CIDR (10.0.0.0/8, fd00::/8)")
            }
        }
        return clients
    }

    mutating func admin(_ node: Node, proxyListeners: [ListenerConfig]) -> AdminConfig? {
        guard let map = reader.mapping(node, "admin", allowed: ["listen", "allow_remote", "allow_clients"]) else {
            return nil
        }
        let clients = map["allow_clients"].map { allowClients($0, "admin.allow_clients") } ?? []
        var allowRemote = false
        if let n = map["allow_remote"], let v = reader.bool(n, "admin.allow_remote") { allowRemote = v }
        guard let listenNode = map["listen"] else {
            reader.fail(node, "'admin' needs 'listen' (e.g. 'listen: 127.0.0.1:9901')")
            return nil
        }
        guard let address = listenAddress(listenNode, "admin.listen") else { return nil }
        if case .tcp(let host, _) = address, !IPAddressParser.isLoopback(host), !allowRemote {
            reader.fail(listenNode, "admin listener \(address) is not loopback; add 'allow_remote: true' to 'admin'")
        }
        if let proxy = proxyListeners.first(where: { $0.address.clashes(with: address) }) {
            reader.fail(
                listenNode,
                "admin listener \(address) is also a proxy listener"
                    + (proxy.address == address ? "" : " (it binds what \(proxy.address) binds)"))
        }
        return AdminConfig(address: address, allowRemote: allowRemote, allowClients: clients)
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
        var path: String?
        var pathLocation: SourceLocation?
        if let n = map["path"] {
            path = reader.string(n, "keychain.path").map(resolve)
            pathLocation = reader.location(n)
        } else {
            reader.fail(node, "'keychain' needs 'path' (the keychain file)")
        }
        var key: (KeySource, SourceLocation)?
        switch (map["key_file"], map["key_credential"]) {
        case (let file?, nil):
            if let keyPath = reader.string(file, "keychain.key_file") {
                let resolved = resolve(keyPath)
                if Self.samePath(resolved, path) {
                    reader.fail(
                        file,
                        "'keychain.key_file' names the keychain file itself ('keychain.path'): the key lives apart")
                }
                key = (.file(path: resolved), reader.location(file))
            }
        case (nil, let credential?):
            if let name = reader.string(credential, "keychain.key_credential") {
                if name.contains("/") || name == "." || name == ".." {
                    reader.fail(credential, "'keychain.key_credential' is a credential name, not a path")
                } else {
                    key = (.credential(name: name), reader.location(credential))
                }
            }
        case (.some, .some):
            reader.fail(map.keyNode("key_credential")!, "'keychain' takes key_file or key_credential, not both")
        case (nil, nil):
            reader.fail(node, "'keychain' needs 'key_file' (or 'key_credential')")
        }
        guard let path, let key else { return nil }
        return KeychainConfig(path: path, key: key.0, keyLocation: key.1, pathLocation: pathLocation)
    }

    mutating func limits(_ node: Node) -> Limits {
        var limits = Limits()
        guard
            let map = reader.mapping(
                node, "limits",
                allowed: [
                    "max_request_body", "retry_buffer", "max_header_bytes", "client_idle_timeout", "max_connections",
                    "header_timeout", "buffer_memory",
                ])
        else { return limits }
        if let n = map["max_request_body"], let v = reader.size(n, "limits.max_request_body") {
            limits.maxRequestBody = v
        }
        if let n = map["retry_buffer"], let v = reader.size(n, "limits.retry_buffer") { limits.retryBuffer = v }
        if let n = map["max_header_bytes"], let v = reader.size(n, "limits.max_header_bytes") {
            if v < 1024 {
                reader.fail(n, "'limits.max_header_bytes' must be at least 1KiB, not \(v) bytes")
            } else if v > 64 << 20 {
                // A head's fields are 32-bit ranges of its bytes (`HeaderFields.Line`,
                // docs/performance.md#header-fields-as-bytes).
                reader.fail(n, "'limits.max_header_bytes' must be at most 64MiB, not \(v) bytes")
            } else {
                limits.maxHeaderBytes = v
            }
        }
        if let n = map["client_idle_timeout"], let v = reader.duration(n, "limits.client_idle_timeout") {
            if v <= .zero {
                reader.fail(n, "'limits.client_idle_timeout' must be above 0")
            } else {
                limits.clientIdleTimeout = v
            }
        }
        if let n = map["max_connections"], let v = reader.int(n, "limits.max_connections", range: 1...1_000_000) {
            limits.maxConnections = v
        }
        if let n = map["header_timeout"], let v = reader.duration(n, "limits.header_timeout") {
            if v <= .zero {
                reader.fail(n, "'limits.header_timeout' must be above 0")
            } else {
                limits.headerTimeout = v
            }
        }
        if let n = map["buffer_memory"], let v = reader.size(n, "limits.buffer_memory") { limits.bufferMemory = v }
        return limits
    }
}

/// Where parts of one upstream were written, for errors found only when all upstreams are known.
struct UpstreamSite {
    var name: SourceLocation
    /// The `auth.type` value (or the `auth` node), when auth is configured.
    var auth: SourceLocation?
    /// The `intercept` value, when written.
    var intercept: SourceLocation?
    /// The `tls.client_cert_entry` value, when written.
    var clientCert: SourceLocation?
    /// The `delivery` value, when written.
    var delivery: SourceLocation? = nil
}
