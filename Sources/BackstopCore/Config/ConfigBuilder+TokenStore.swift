import Yams

extension ConfigBuilder {
    /// `token_store` (docs/reference/config.md#token_store).
    mutating func tokenStore(_ node: Node) -> TokenStoreConfig {
        let keys = ["type", "url", "password_entry", "tls", "ca_file", "table"]
        guard let map = reader.mapping(node, "token_store", allowed: keys) else { return .keychain }
        var type = "keychain"
        if let n = map["type"], let v = reader.string(n, "token_store.type") {
            guard ["keychain", "postgres"].contains(v) else {
                reader.fail(n, "token_store.type must be keychain or postgres, not '\(v)'")
                return .keychain
            }
            type = v
        }
        guard type == "postgres" else {
            for key in keys where key != "type" {
                if let keyNode = map.keyNode(key) {
                    reader.fail(keyNode, "token_store.\(key) applies to type postgres only")
                }
            }
            return .keychain
        }
        guard let urlNode = map["url"] else {
            reader.fail(node, "token_store type postgres needs 'url' (postgres://USER@HOST:PORT/DATABASE)")
            return .keychain
        }
        guard let text = reader.string(urlNode, "token_store.url") else { return .keychain }
        var config: PostgresStoreConfig
        switch PostgresURLParser.parse(text) {
        case .failure(let problem):
            reader.fail(urlNode, "token_store.url \(problem)")
            return .keychain
        case .success(let parsed):
            config = parsed
        }
        if let n = map["password_entry"], let v = validEntryName(n, "token_store.password_entry") {
            config.passwordEntry = v
        }
        if let n = map["tls"], let v = reader.oneOf(n, "token_store.tls", PostgresTLSMode.allCases) {
            if v == .disable && !IPAddressParser.isLoopback(config.host) {
                // The store holds encrypted tokens, but the role's password and every refresh would cross the
                // network in the clear.
                reader.fail(n, "token_store.tls: disable is only allowed for a loopback host, not \(config.host)")
            } else {
                config.tls = v
            }
        }
        if let n = map["ca_file"], let v = reader.string(n, "token_store.ca_file") {
            config.caFile = caFile(n, v, key: "token_store.ca_file")
            if config.tls != .verifyFull {
                reader.fail(n, "token_store.ca_file needs tls: verify-full (the other modes verify nothing)")
            }
        }
        if let n = map["table"], let v = reader.string(n, "token_store.table") {
            if Self.isSQLIdentifier(v) {
                config.table = v
            } else {
                reader.fail(n, "token_store.table must be a plain SQL name ([a-z_][a-z0-9_]*, at most 63), not '\(v)'")
            }
        }
        return .postgres(config)
    }

    static func isSQLIdentifier(_ text: String) -> Bool {
        guard let first = text.utf8.first, text.utf8.count <= 63, first == 95 || (97...122).contains(first) else {
            return false
        }
        return text.utf8.allSatisfy { $0 == 95 || (97...122).contains($0) || (48...57).contains($0) }
    }
}

/// Parses `postgres://USER@HOST[:PORT]/DATABASE` (also `postgresql://`). A password in the URL is refused: it would
/// sit in the config file, in plain text, readable by whoever reads the config.
enum PostgresURLParser {
    static func parse(_ text: String) -> Result<PostgresStoreConfig, Problem> {
        guard text.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F }) else { return .failure(.characters) }
        guard let (scheme, rest) = text.splitOnce("://"), ["postgres", "postgresql"].contains(scheme.asciiLowercased())
        else { return .failure(.scheme) }
        if rest.contains("?") || rest.contains("#") { return .failure(.parameters) }
        guard let at = rest.firstIndex(of: "@") else { return .failure(.user) }
        let userInfo = rest[..<at]
        if userInfo.contains(":") { return .failure(.password) }
        guard !userInfo.isEmpty, userInfo.utf8.allSatisfy({ $0 != 0x2F && $0 != 0x25 }) else { return .failure(.user) }
        let afterUser = rest[rest.index(after: at)...]
        guard let slash = afterUser.firstIndex(of: "/") else { return .failure(.database) }
        let database = afterUser[afterUser.index(after: slash)...]
        guard !database.isEmpty, !database.contains("/"), !database.contains("%") else { return .failure(.database) }
        guard let (host, port) = RequestTarget.parseAuthority(String(afterUser[..<slash])) else {
            return .failure(.host)
        }
        if let port, port == 0 { return .failure(.host) }
        return .success(
            PostgresStoreConfig(host: host, port: port ?? 5432, user: String(userInfo), database: String(database)))
    }

    enum Problem: Error, Equatable, CustomStringConvertible {
        case characters, scheme, parameters, user, password, host, database

        var description: String {
            switch self {
            case .characters: "must not contain spaces, control or non-ASCII characters"
            case .scheme: "must start with postgres://"
            case .parameters: "must not have ?parameters or a #fragment (TLS is set with token_store.tls)"
            case .user: "needs a user: postgres://USER@HOST:PORT/DATABASE"
            case .password:
                "must not contain a password: store it in the keychain and name it in token_store.password_entry"
            case .host: "needs a host (and a port from 1 to 65535, if any)"
            case .database: "needs a database name: postgres://USER@HOST:PORT/DATABASE"
            }
        }
    }
}
