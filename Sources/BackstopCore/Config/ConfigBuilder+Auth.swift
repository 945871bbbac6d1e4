import Yams

extension ConfigBuilder {
    static let authCommonKeys = ["type", "header", "scheme", "client_auth_header"]
    static let staticAuthKeys = authCommonKeys + ["entry"]
    static let oauth2Keys =
        authCommonKeys + [
            "token_url", "grant", "request_format", "client_id", "client_secret_entry", "scope", "keychain_prefix",
            "fields", "refresh_on", "refresh_ahead", "tls", "client_auth", "client_key_entry", "client_key_id",
        ]
    static let awsSigV4Keys = [
        "type", "region", "service", "access_key_entry", "secret_key_entry", "session_token_entry", "payload",
    ]

    mutating func auth(_ node: Node, _ label: String) -> AuthConfig {
        let path = "\(label): auth"
        guard case .mapping(let raw) = node else {
            reader.fail(node, "\(NodeReader.quoted(path)) must be a mapping, not \(NodeReader.kind(node))")
            return .none
        }
        var type = "none"
        if let typeNode = raw["type"] {
            guard let t = reader.string(typeNode, "\(path).type") else { return .none }
            guard ["none", "static", "oauth2", "aws_sigv4"].contains(t) else {
                reader.fail(typeNode, "\(path).type must be one of none | static | oauth2 | aws_sigv4, not '\(t)'")
                return .none
            }
            type = t
        }
        switch type {
        case "static": return staticAuth(node, path).map(AuthConfig.staticToken) ?? .none
        case "oauth2": return oauth2(node, path).map(AuthConfig.oauth2) ?? .none
        case "aws_sigv4": return awsSigV4(node, path).map(AuthConfig.awsSigV4) ?? .none
        default:
            _ = reader.mapping(node, path, allowed: ["type"])
            return .none
        }
    }

    private mutating func staticAuth(_ node: Node, _ path: String) -> StaticAuthConfig? {
        guard let map = reader.mapping(node, path, allowed: Self.staticAuthKeys) else { return nil }
        var entry: String?
        if let n = map["entry"] {
            entry = entryName(n, "\(path).entry", content: .headerValue)
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
            prefix = validEntryName(n, "\(path).keychain_prefix", suffixBytes: Self.longestTokenEntrySuffix)
        } else {
            reader.fail(node, "\(path): oauth2 auth needs 'keychain_prefix' (where its tokens live in the keychain)")
        }
        var config = OAuth2Config(tokenURL: tokenURL ?? "", keychainPrefix: prefix ?? "")
        if let n = map["grant"],
            let v = reader.oneOf(n, "\(path).grant", [OAuth2Grant.refreshToken, .clientCredentials])
        {
            config.grant = v
        }
        if let n = map["request_format"],
            let v = reader.oneOf(n, "\(path).request_format", [TokenRequestFormat.form, .json])
        {
            config.requestFormat = v
        }
        if let n = map["client_id"], let v = reader.string(n, "\(path).client_id"), sendable(v, n, "\(path).client_id")
        {
            config.clientID = v
        }
        if let n = map["client_secret_entry"], let v = validEntryName(n, "\(path).client_secret_entry") {
            config.clientSecretEntry = v
        }
        if let n = map["scope"], let v = reader.string(n, "\(path).scope", allowEmpty: true),
            sendable(v, n, "\(path).scope")
        {
            config.scope = v
        }
        if let v = header(map, path) { config.header = v }
        if let v = scheme(map, path) { config.scheme = v }
        if let v = clientAuthHeader(map, path) { config.clientAuthHeader = v }
        if let n = map["refresh_ahead"], let v = reader.duration(n, "\(path).refresh_ahead") { config.refreshAhead = v }
        if let n = map["refresh_on"], let items = reader.sequence(n, "\(path).refresh_on") {
            config.refreshOn = []
            for item in items {
                if let code = reader.int(item, "\(path).refresh_on[]", range: 100...599) {
                    config.refreshOn.insert(code)
                }
            }
        }
        if let n = map["fields"],
            let m = reader.mapping(n, "\(path).fields", allowed: ["access_token", "refresh_token", "expires_in"])
        {
            if let x = m["access_token"], let v = reader.string(x, "\(path).fields.access_token") {
                config.fields.accessToken = v
            }
            if let x = m["refresh_token"], let v = reader.string(x, "\(path).fields.refresh_token") {
                config.fields.refreshToken = v
            }
            if let x = m["expires_in"], let v = reader.string(x, "\(path).fields.expires_in") {
                config.fields.expiresIn = v
            }
        }
        var clientCertNode: Node?
        if let n = map["tls"], let m = reader.mapping(n, "\(path).tls", allowed: ["ca_file", "client_cert_entry"]) {
            // Only a CA file and a client certificate: verification of the token endpoint cannot be turned off.
            if let x = m["ca_file"], let v = reader.string(x, "\(path).tls.ca_file") {
                config.tls.caFile = caFile(x, v, key: "\(path).tls.ca_file")
            }
            if let x = m["client_cert_entry"],
                let v = entryName(x, "\(path).tls.client_cert_entry", content: .clientCertificate)
            {
                config.tls.clientCertEntry = v
                clientCertNode = x
            }
        }
        if config.grant == .clientCredentials && map["client_id"] == nil {
            reader.fail(map["grant"] ?? node, "\(path): grant client_credentials needs 'client_id'")
        }
        clientAuthentication(map, node, path, into: &config, clientCertNode: clientCertNode)
        guard tokenURL != nil, prefix != nil else { return nil }
        return config
    }

    /// `client_auth` and the keys it needs (docs/reference/config.md#client-authentication-at-the-token-endpoint):
    /// each method needs its own credential and refuses the others' (a key that would be ignored is a mistake).
    private mutating func clientAuthentication(
        _ map: MappingView, _ node: Node, _ path: String, into config: inout OAuth2Config, clientCertNode: Node?
    ) {
        let explicit = map["client_auth"]
        if let n = explicit, let v = reader.oneOf(n, "\(path).client_auth", OAuth2ClientAuth.allCases) {
            config.clientAuth = v
        }
        if let n = map["client_key_entry"],
            let v = entryName(n, "\(path).client_key_entry", content: .assertionSigningKey)
        {
            config.clientKeyEntry = v
        }
        if let n = map["client_key_id"], let v = reader.string(n, "\(path).client_key_id") {
            if v.unicodeScalars.contains(where: { $0.properties.generalCategory == .control }) {
                reader.fail(n, "\(path).client_key_id must not contain control characters")
            } else {
                config.clientKeyID = v
            }
        }
        let at = explicit ?? node
        let method = config.clientAuth.rawValue
        switch config.clientAuth {
        case .clientSecretPost:
            break
        case .clientSecretBasic:
            if map["client_secret_entry"] == nil {
                reader.fail(at, "\(path): client_auth client_secret_basic needs 'client_secret_entry'")
            }
        case .privateKeyJWT:
            if map["client_key_entry"] == nil {
                reader.fail(
                    at,
                    "\(path): client_auth private_key_jwt needs 'client_key_entry' (a keychain entry "
                        + "holding the PEM private key that signs the assertions)")
            }
        case .tlsClientAuth:
            if clientCertNode == nil {
                reader.fail(
                    at,
                    "\(path): client_auth tls_client_auth needs 'tls.client_cert_entry' under 'auth' "
                        + "(the certificate the token endpoint authenticates the client by)")
            }
        }
        if let clientCertNode, !config.tokenURL.isEmpty, !config.tokenURL.lowercased().hasPrefix("https:") {
            reader.fail(
                clientCertNode,
                "\(path).tls.client_cert_entry needs an https token_url (a client certificate "
                    + "is presented in the TLS handshake)")
        }
        if [.clientSecretBasic, .privateKeyJWT, .tlsClientAuth].contains(config.clientAuth), map["client_id"] == nil {
            reader.fail(at, "\(path): client_auth \(method) needs 'client_id'")
        }
        if let n = map["client_secret_entry"], [.privateKeyJWT, .tlsClientAuth].contains(config.clientAuth) {
            reader.fail(n, "\(path).client_secret_entry is not used with client_auth \(method); remove it")
        }
        for key in ["client_key_entry", "client_key_id"] where config.clientAuth != .privateKeyJWT {
            if let n = map[key] {
                reader.fail(n, "\(path).\(key) is only used with client_auth private_key_jwt, not \(method)")
            }
        }
        if let secret = config.clientSecretEntry, let n = map["client_secret_entry"], explicit != nil,
            [.clientSecretPost, .clientSecretBasic].contains(config.clientAuth)
        {
            // Only an explicit `client_auth` makes the secret something `check --online` must find: a default
            // config keeps its old meaning (a missing secret is sent as none).
            keychainReferences.append(
                KeychainReference(
                    entry: secret, content: .secret, key: "\(path).client_secret_entry", location: reader.location(n)))
        }
    }

    private mutating func awsSigV4(_ node: Node, _ path: String) -> AWSSigV4Config? {
        guard let map = reader.mapping(node, path, allowed: Self.awsSigV4Keys) else { return nil }
        func name(_ key: String, _ what: String) -> String? {
            guard let n = map[key] else { return nil }
            guard let v = reader.string(n, "\(path).\(key)") else { return nil }
            // Both go into the credential scope and the signing key: AWS names are lowercase letters, digits, '-'.
            guard v.utf8.allSatisfy({ (97...122).contains($0) || (48...57).contains($0) || $0 == 45 }) else {
                reader.fail(n, "\(path).\(key) '\(v)' is not an AWS \(what) name (lowercase letters, digits, '-')")
                return nil
            }
            return v
        }
        let region = name("region", "region")
        let service = name("service", "service")
        if map["region"] == nil { reader.fail(node, "\(path): aws_sigv4 needs 'region' (e.g. eu-west-1)") }
        if map["service"] == nil { reader.fail(node, "\(path): aws_sigv4 needs 'service' (e.g. execute-api, s3)") }
        var entries: [String: String] = [:]
        for key in ["access_key_entry", "secret_key_entry", "session_token_entry"] {
            if let n = map[key], let v = entryName(n, "\(path).\(key)", content: .headerValue) { entries[key] = v }
        }
        for key in ["access_key_entry", "secret_key_entry"] where map[key] == nil {
            reader.fail(node, "\(path): aws_sigv4 needs '\(key)' (a keychain entry name)")
        }
        var payload = AWSPayloadSigning.signed
        if let n = map["payload"], let v = reader.oneOf(n, "\(path).payload", AWSPayloadSigning.allCases) {
            payload = v
        }
        guard let region, let service, let access = entries["access_key_entry"],
            let secret = entries["secret_key_entry"]
        else { return nil }
        return AWSSigV4Config(
            region: region, service: service, accessKeyEntry: access, secretKeyEntry: secret,
            sessionTokenEntry: entries["session_token_entry"], payload: payload)
    }

    /// A keychain entry name, recorded with what it must hold for `check --online`.
    mutating func entryName(_ node: Node, _ path: String, content: KeychainReference.Content) -> String? {
        guard let v = validEntryName(node, path) else { return nil }
        keychainReferences.append(
            KeychainReference(entry: v, content: content, key: path, location: reader.location(node)))
        return v
    }

    /// The longest name under an oauth2 `keychain_prefix` adds to it: `<prefix>/last_refresh_failure`.
    static let longestTokenEntrySuffix = "/last_refresh_failure".utf8.count

    /// A string that is a keychain entry name (or, with `suffixBytes`, the start of one): 1–255 bytes with no
    /// whitespace and no control characters, the keychain's own rule, so what `check` passes the keychain takes,
    /// and `keychain list` prints one line per entry (docs/reference/cli.md#keychain).
    mutating func validEntryName(_ node: Node, _ path: String, suffixBytes: Int = 0) -> String? {
        guard let v = reader.string(node, path) else { return nil }
        let shown = DisplayText.oneLine(v)
        guard
            !v.unicodeScalars.contains(where: {
                $0.properties.isWhitespace || $0.properties.generalCategory == .control
                    || $0.properties.generalCategory == .format
            })
        else {
            reader.fail(
                node,
                "\(NodeReader.quoted(path)): '\(shown)' is not a keychain entry name (no spaces, control or format "
                    + "characters)")
            return nil
        }
        let limit = 255 - suffixBytes
        guard v.utf8.count <= limit else {
            reader.fail(
                node,
                "\(NodeReader.quoted(path)): '\(shown.prefix(40))…' is \(v.utf8.count) bytes; at most \(limit)"
                    + (suffixBytes > 0 ? " (its longest entry name adds \(suffixBytes) to it, within 255)" : ""))
            return nil
        }
        return v
    }

    private mutating func header(_ map: MappingView, _ path: String) -> String? {
        guard let n = map["header"], let v = reader.string(n, "\(path).header") else { return nil }
        guard headerName(v, n, "\(path).header") else { return nil }
        if Self.managedHeaderNames.contains(v.asciiLowercased()) {
            reader.fail(
                n, "\(path): '\(v)' is a header Backstop sets or removes itself; the credential cannot go in it")
            return nil
        }
        return v
    }

    /// Fields a forwarded request's head is framed or routed by, which Backstop writes or drops itself
    /// (docs/reference/behaviour.md#forwarding): a credential in one would be dropped or break the request.
    static let managedHeaderNames: Set<String> = [
        "host", "via", "content-length", "transfer-encoding", "connection", "keep-alive", "proxy-connection", "te",
        "trailer", "upgrade", "expect",
    ]

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
            let name =
                switch scalar.value {
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
