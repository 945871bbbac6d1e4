import BackstopCore
import Testing

private let H = ConfigFixture.head
private let K = "keychain: {path: k.bkc, key_file: k.key}\n"

/// The `token_store` section (docs/reference/config.md#token_store).
@Suite("Config: token_store")
struct TokenStoreConfigTests {
    @Test("absent or type keychain: the keychain; postgres: the URL's parts and the defaults")
    func values() throws {
        #expect(try ConfigFixture.parse(H).tokenStore == .keychain)
        #expect(try ConfigFixture.parse(H + "token_store: {type: keychain}\n").tokenStore == .keychain)
        let config = try ConfigFixture.parse(
            H + K + "token_store: {type: postgres, url: \"postgres://bs@DB.internal/tokens\"}\n")
        #expect(
            config.tokenStore
                == .postgres(
                    PostgresStoreConfig(
                        host: "db.internal", port: 5432, user: "bs", database: "tokens", passwordEntry: nil,
                        tls: .verifyFull,
                        caFile: nil, table: "backstop_tokens")))
        let full = try ConfigFixture.parse(
            H + K + """
                token_store:
                  type: postgres
                  url: postgresql://backstop@127.0.0.1:6543/backstop
                  password_entry: postgres/password
                  tls: disable
                  table: fleet_tokens
                """ + "\n")
        #expect(
            full.tokenStore
                == .postgres(
                    PostgresStoreConfig(
                        host: "127.0.0.1", port: 6543, user: "backstop", database: "backstop",
                        passwordEntry: "postgres/password",
                        tls: .disable, caFile: nil, table: "fleet_tokens")))
        let verified = try ConfigFixture.parse(
            H + K + "token_store: {type: postgres, url: \"postgres://a@db/b\", ca_file: ca.pem}\n")
        guard case .postgres(let store) = verified.tokenStore else { Issue.record("postgres expected"); return }
        #expect(store.caFile == "/etc/backstop/ca.pem")
        #expect(store.displayURL == "postgres://a@db:5432/b")
    }

    @Test(
        "bad token_store values are reported where they are written",
        arguments: [
            ErrorCase(H + K + "token_store: {type: redis}\n", at: "redis", "keychain or postgres"),
            ErrorCase(H + K + "token_store: {type: postgres}\n", at: "{type", "needs 'url'"),
            ErrorCase(
                H + K + "token_store: {type: postgres, url: \"postgres://u:secret@db/x\"}\n", at: "\"postgres",
                "password"),
            ErrorCase(H + K + "token_store: {type: postgres, url: \"mysql://u@db/x\"}\n", at: "\"mysql", "postgres://"),
            ErrorCase(
                H + K + "token_store: {type: postgres, url: \"postgres://db/x\"}\n", at: "\"postgres", "needs a user"),
            ErrorCase(
                H + K + "token_store: {type: postgres, url: \"postgres://u@db\"}\n", at: "\"postgres", "database"),
            ErrorCase(
                H + K + "token_store: {type: postgres, url: \"postgres://u@db/x?sslmode=disable\"}\n", at: "\"postgres",
                "parameters"),
            ErrorCase(
                H + K + "token_store: {type: postgres, url: \"postgres://u@db/x\", tls: disable}\n", at: "disable",
                "loopback"),
            ErrorCase(
                H + K + "token_store: {type: postgres, url: \"postgres://u@db/x\", tls: require, ca_file: c.pem}\n",
                at: "c.pem", "verify-full"),
            ErrorCase(
                H + K + "token_store: {type: postgres, url: \"postgres://u@db/x\", table: \"x; drop\"}\n", at: "\"x;",
                "plain SQL name"),
            ErrorCase(H + K + "token_store: {type: keychain, table: t}\n", at: "table", "postgres only"),
            ErrorCase(
                H + "token_store: {type: postgres, url: \"postgres://u@127.0.0.1/x\"}\n", at: "{type", "keychain"),
        ])
    func badValues(c: ErrorCase) { expectSingleError(c) }
}
