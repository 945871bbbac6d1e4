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
        if let v = scheme(map, path) { config.scheme = v }
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
        if let n = map["client_id"], let v = reader.string(n, "\(path).client_id"), sendable(v, n, "\(path).client_id") {
            config.clientID = v
        }
        if let n = map["client_secret_entry"], let v = reader.string(n, "\(path).client_secret_entry") {
            config.clientSecretEntry = v
        }
        if let n = map["scope"], let v = reader.string(n, "\(path).scope", allowEmpty: true), sendable(v, n, "\(path).scope") {
            config.scope = v
        }
        if let v = header(map, path) { config.header = v }
        if let v = scheme(map, path) { config.scheme = v }
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
        return headerName(v, n, "\(path).header") ? v : nil
    }

    /// `auth.scheme`: the value goes in front of the token in the header (`Bearer <token>`).
    private mutating func scheme(_ map: MappingView, _ path: String) -> String? {
        guard let n = map["scheme"], let v = reader.string(n, "\(path).scheme", allowEmpty: true),
            sendable(v, n, "\(path).scheme")
        else { return nil }
        return v
    }

    /// A header name the config sets (`auth.header`, `retry_non_idempotent_with_key`): an RFC 9110 token.
    mutating func headerName(_ value: String, _ node: Node, _ path: String) -> Bool {
        guard sendable(value, node, path) else { return false }
        guard HTTPSyntax.isToken(value) else {
            reader.fail(node, "\(path): '\(value)' is not a header name (letters, digits and !#$%&'*+-.^_`|~)")
            return false
        }
        return true
    }

    /// A value that is sent as written, in a header or a token request: a control character (CR, LF, NUL, …)
    /// would end the header line, or be dropped or encoded on the way, so the request would not say what the
    /// config says (docs/reference/config.md#auth). The message names the character, never prints it.
    mutating func sendable(_ value: String, _ node: Node, _ path: String) -> Bool {
        guard let problem = Self.controlCharacter(in: value) else { return true }
        reader.fail(node, "\(path) contains \(problem): it could not be sent as written")
        return false
    }

    /// `CR (U+000D) at character 7` for the first C0 control or DEL in `text`; nil when there is none.
    static func controlCharacter(in text: String) -> String? {
        for (offset, scalar) in text.unicodeScalars.enumerated() where scalar.value < 0x20 || scalar.value == 0x7F {
            let name = switch scalar.value {
            case 0x00: "NUL "
            case 0x09: "TAB "
            case 0x0A: "LF "
            case 0x0D: "CR "
            case 0x7F: "DEL "
            default: ""
            }
            let hex = String(scalar.value, radix: 16, uppercase: true)
            return "a control character, \(name)(U+\(String(repeating: "0", count: 4 - hex.count) + hex)) at character "
                + "\(offset + 1)"
        }
        return nil
    }

    private mutating func clientAuthHeader(_ map: MappingView, _ path: String) -> ClientAuthHeaderPolicy? {
        guard let n = map["client_auth_header"] else { return nil }
        return reader.oneOf(n, "\(path).client_auth_header", [ClientAuthHeaderPolicy.replace, .keep])
    }
}
