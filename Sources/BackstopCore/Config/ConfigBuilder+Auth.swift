import Yams

extension ConfigBuilder {
    static let authCommonKeys = ["type", "header", "scheme", "client_auth_header"]
    static let staticAuthKeys = authCommonKeys + ["entry"]
    static let oauth2Keys = authCommonKeys + [
        "token_url", "grant", "request_format", "client_id", "client_secret_entry", "scope", "keychain_prefix",
        "fields", "refresh_on", "refresh_ahead", "tls",
    ]

    mutating func auth(_ node: Node, _ label: String) -> AuthConfig {
        let path = "\(label): auth"
        guard case .mapping(let raw) = node else {
            reader.fail(node, "'\(path)' must be a mapping, not \(NodeReader.kind(node))")
            return .none
        }
        var type = "none"
        if let typeNode = raw["type"] {
            guard let t = reader.string(typeNode, "\(path).type") else { return .none }
            guard ["none", "static", "oauth2"].contains(t) else {
                reader.fail(typeNode, "\(path).type must be one of none | static | oauth2, not '\(t)'")
                return .none
            }
            type = t
        }
        switch type {
        case "static": return staticAuth(node, path).map(AuthConfig.staticToken) ?? .none
        case "oauth2": return oauth2(node, path).map(AuthConfig.oauth2) ?? .none
        default:
            _ = reader.mapping(node, path, allowed: ["type"])
            return .none
        }
    }

    private mutating func staticAuth(_ node: Node, _ path: String) -> StaticAuthConfig? {
        guard let map = reader.mapping(node, path, allowed: Self.staticAuthKeys) else { return nil }
        var entry: String?
        if let n = map["entry"] {
            entry = reader.string(n, "\(path).entry")
        } else {
            reader.fail(node, "\(path): static auth needs 'entry' (a keychain entry name)")
        }
        var config = StaticAuthConfig(entry: entry ?? "")
        if let v = header(map, path) { config.header = v }
        if let n = map["scheme"], let v = reader.string(n, "\(path).scheme", allowEmpty: true) { config.scheme = v }
        if let v = clientAuthHeader(map, path) { config.clientAuthHeader = v }
        return entry == nil ? nil : config
    }

    private mutating func oauth2(_ node: Node, _ path: String) -> OAuth2Config? {
        guard let map = reader.mapping(node, path, allowed: Self.oauth2Keys) else { return nil }
        var tokenURL: String?
        if let n = map["token_url"] {
            if let v = reader.string(n, "\(path).token_url") {
                switch HTTPURLParser.parse(v) {
                case .failure(let problem):
                    reader.fail(n, "\(path).token_url '\(v)' \(problem)")
                case .success(let parts) where parts.scheme != "https" && !IPAddressParser.isLoopback(parts.host):
                    // The token endpoint receives the client secret and the refresh token.
                    reader.fail(n, "\(path).token_url '\(v)' must be https (plain http only to a loopback host)")
                case .success:
                    tokenURL = v
                }
            }
        } else {
            reader.fail(node, "\(path): oauth2 auth needs 'token_url'")
        }
        var prefix: String?
        if let n = map["keychain_prefix"] {
            prefix = reader.string(n, "\(path).keychain_prefix")
        } else {
            reader.fail(node, "\(path): oauth2 auth needs 'keychain_prefix' (where its tokens live in the keychain)")
        }
        var config = OAuth2Config(tokenURL: tokenURL ?? "", keychainPrefix: prefix ?? "")
        if let n = map["grant"], let v = reader.oneOf(n, "\(path).grant", [OAuth2Grant.refreshToken, .clientCredentials]) {
            config.grant = v
        }
        if let n = map["request_format"],
            let v = reader.oneOf(n, "\(path).request_format", [TokenRequestFormat.form, .json]) {
            config.requestFormat = v
        }
        if let n = map["client_id"], let v = reader.string(n, "\(path).client_id") { config.clientID = v }
        if let n = map["client_secret_entry"], let v = reader.string(n, "\(path).client_secret_entry") {
            config.clientSecretEntry = v
        }
        if let n = map["scope"], let v = reader.string(n, "\(path).scope", allowEmpty: true) { config.scope = v }
        if let v = header(map, path) { config.header = v }
        if let n = map["scheme"], let v = reader.string(n, "\(path).scheme", allowEmpty: true) { config.scheme = v }
        if let v = clientAuthHeader(map, path) { config.clientAuthHeader = v }
        if let n = map["refresh_ahead"], let v = reader.duration(n, "\(path).refresh_ahead") { config.refreshAhead = v }
        if let n = map["refresh_on"], let items = reader.sequence(n, "\(path).refresh_on") {
            config.refreshOn = []
            for item in items {
                if let code = reader.int(item, "\(path).refresh_on[]", range: 100...599) { config.refreshOn.insert(code) }
            }
        }
        if let n = map["fields"],
            let m = reader.mapping(n, "\(path).fields", allowed: ["access_token", "refresh_token", "expires_in"]) {
            if let x = m["access_token"], let v = reader.string(x, "\(path).fields.access_token") {
                config.fields.accessToken = v
            }
            if let x = m["refresh_token"], let v = reader.string(x, "\(path).fields.refresh_token") {
                config.fields.refreshToken = v
            }
            if let x = m["expires_in"], let v = reader.string(x, "\(path).fields.expires_in") { config.fields.expiresIn = v }
        }
        if let n = map["tls"], let m = reader.mapping(n, "\(path).tls", allowed: ["ca_file"]) {
            // Only a CA file: verification of the token endpoint cannot be turned off.
            if let x = m["ca_file"], let v = reader.string(x, "\(path).tls.ca_file") { config.tls.caFile = resolve(v) }
        }
        if config.grant == .clientCredentials && map["client_id"] == nil {
            reader.fail(map["grant"] ?? node, "\(path): grant client_credentials needs 'client_id'")
        }
        guard tokenURL != nil, prefix != nil else { return nil }
        return config
    }

    private mutating func header(_ map: MappingView, _ path: String) -> String? {
        guard let n = map["header"], let v = reader.string(n, "\(path).header") else { return nil }
        guard HTTPSyntax.isToken(v) else {
            reader.fail(n, "\(path).header: '\(v)' is not a header name")
            return nil
        }
        return v
    }

    private mutating func clientAuthHeader(_ map: MappingView, _ path: String) -> ClientAuthHeaderPolicy? {
        guard let n = map["client_auth_header"] else { return nil }
        return reader.oneOf(n, "\(path).client_auth_header", [ClientAuthHeaderPolicy.replace, .keep])
    }
}
