import BackstopKeychain
import BackstopTestSupport
import Foundation
import Testing

/// OAuth2 token injection and refresh through the proxy against a real token endpoint (docs/reference/behaviour.md#token-refresh).
@Suite("Token refresh")
struct TokenRefreshTests {
    /// A keychain in a fresh directory holding `entries`.
    static func makeKeychain(_ entries: [String: String]) throws -> (FileKeychain, String) {
        let directory = try TestFiles.makeTemporaryDirectory()
        let opened = try KeychainBootstrap.open(
            path: directory + "/keychain.bkc", key: .file(path: directory + "/keychain.key"))
        for (name, value) in entries { try opened.keychain.set(name, value: Array(value.utf8)) }
        return (opened.keychain, directory)
    }

    static func config(origin: TestOrigin, auth: TestAuthServer, directory: String, extra: String = "") -> String {
        """
        \(keychainSection(directory: directory))
        \(OAuth2TestConfig.upstreams(originURL: origin.baseURL, tokenURL: auth.tokenURL))
        \(extra)
        """
    }

    /// Starts an auth server, a protected origin, a keychain holding `entries` and a proxy configured by
    /// `config` (default: one oauth2 upstream `api.test`), runs `body`, and tears everything down.
    static func withAuthProxy(
        entries: [String: String] = ["api/refresh_token": "refresh-0"],
        prepare: (TestAuthServer) -> Void = { _ in },
        config: ((TestOrigin, TestAuthServer, String) -> String)? = nil,
        _ body: (TestAuthServer, TestOrigin, FileKeychain, ProxyHarness) async throws -> Void
    ) async throws {
        let auth = try await TestAuthServer.start()
        prepare(auth)
        let origin = try await TestOrigin.start(script: auth.protectedScript())
        var values = entries
        for (name, value) in values where value == "<issued>" { values[name] = auth.issueAccessToken() }
        let (keychain, directory) = try makeKeychain(values)
        defer { TestFiles.remove(directory) }
        let yaml = config?(origin, auth, directory) ?? Self.config(origin: origin, auth: auth, directory: directory)
        let proxy = try await ProxyHarness.start(yaml, keychain: keychain)
        var failure: (any Error)?
        do { try await body(auth, origin, keychain, proxy) } catch { failure = error }
        await proxy.stop()
        try? await origin.shutdown()
        try? await auth.origin.shutdown()
        if let failure { throw failure }
    }

    @Test("first request fetches a token once; the rotated refresh token is persisted")
    func firstFetch() async throws {
        try await Self.withAuthProxy(entries: ["api/refresh_token": "refresh-0"]) { auth, origin, keychain, proxy in
            for _ in 0..<3 {
                let response = try await proxy.get("http://api.test/data", host: "api.test")
                #expect(response.status == 200)
                #expect(response.header("X-Backstop-Attempts") == "1")
            }
            #expect(auth.tokenCalls == 1)
            let v6 = try keychain.entry("api/refresh_token")
            #expect(v6?.stringValue == auth.currentRefreshToken)
            let v7 = try keychain.entry("api/access_token")
            #expect(v7?.stringValue == "access-1")
        }
    }

    @Test("revoked token → 401 → one refresh → replay; 50 concurrent requests share one refresh")
    func revokedTokenSingleFlight() async throws {
        try await Self.withAuthProxy(entries: ["api/refresh_token": "refresh-0"]) { auth, origin, keychain, proxy in
            let r1 = try await proxy.get("http://api.test/warm", host: "api.test")
            #expect(r1.status == 200)
            #expect(auth.tokenCalls == 1)
            auth.revokeAllAccessTokens()
            let statuses = try await withThrowingTaskGroup(of: Int.self) { group in
                for i in 0..<50 {
                    group.addTask { try await proxy.get("http://api.test/c\(i)", host: "api.test").status }
                }
                var all: [Int] = []
                for try await status in group { all.append(status) }
                return all
            }
            #expect(statuses.count == 50)
            #expect(statuses.allSatisfy { $0 == 200 }, "statuses: \(statuses)")
            #expect(auth.tokenCalls == 2)
            #expect(auth.rejectedRefreshTokens == 0)
        }
    }

    @Test("invalid_grant → the client gets the original 401 with token-refresh-failed; one token call")
    func invalidGrant() async throws {
        try await Self.withAuthProxy(entries: [
            "api/refresh_token": "refresh-0", "api/access_token": "<issued>",
        ]) { auth, origin, keychain, proxy in
            let r2 = try await proxy.get("http://api.test/ok", host: "api.test")
            #expect(r2.status == 200)
            #expect(auth.tokenCalls == 0)
            auth.revokeAllAccessTokens()
            auth.update { $0.invalidGrant = true }
            let response = try await proxy.get("http://api.test/denied", host: "api.test")
            #expect(response.status == 401)
            #expect(response.header("X-Backstop-Error") == "token-refresh-failed")
            #expect(response.header("WWW-Authenticate") != nil)
            #expect(response.bodyString == "denied")
            #expect(auth.tokenCalls == 1)
        }
    }

    @Test("after invalid_grant, a refresh token stored with `keychain set` is used at once, not after the hold-down")
    func reseedEndsHoldDown() async throws {
        try await Self.withAuthProxy(entries: ["api/refresh_token": "refresh-stale"]) { auth, _, keychain, proxy in
            // The keychain's refresh token is not the endpoint's current one: invalid_grant.
            let refused = try await proxy.get("http://api.test/a", host: "api.test")
            #expect(refused.status == 502)
            #expect(refused.header("X-Backstop-Error") == "token-unavailable")
            #expect(auth.tokenCalls == 1)
            // Within the 5 s hold-down a request fails fast without calling the endpoint …
            #expect(try await proxy.get("http://api.test/b", host: "api.test").status == 502)
            #expect(auth.tokenCalls == 1)
            // … until an operator stores a good refresh token: the next request uses it immediately.
            try keychain.set("api/refresh_token", value: Array(auth.currentRefreshToken.utf8))
            let started = ContinuousClock.now
            let fixed = try await proxy.get("http://api.test/c", host: "api.test")
            #expect(fixed.status == 200)
            #expect(auth.tokenCalls == 2)
            #expect(ContinuousClock.now - started < .seconds(2))
        }
    }

    @Test("tokens list shows the last refresh and its outcome: failed with its cause, then ok; never a token")
    func tokensListOutcome() async throws {
        try await Self.withAuthProxy(entries: ["api/refresh_token": "refresh-stale"]) { auth, origin, keychain, proxy in
            let binary = DaemonProcess.binaryPath()
            // The proxy's own config, for the command line next to it.
            let directory = (keychain.path as NSString).deletingLastPathComponent
            let config = directory + "/backstop.yaml"
            try
                ("version: 1\nlisten: [\"127.0.0.1:0\"]\n"
                + Self.config(origin: origin, auth: auth, directory: directory))
                .write(toFile: config, atomically: true, encoding: .utf8)
            func listed() async throws -> [String] {
                let list = try await SpawnedProcess.run(binary, ["tokens", "list", "--config", config])
                #expect(list.status == 0, "\(list.standardError)")
                for secret in auth.issuedSecrets + ["refresh-stale"] { #expect(!list.standardOutput.contains(secret)) }
                return list.standardOutput.trimmingCharacters(in: .newlines).split(separator: "\t").map(String.init)
            }
            // Seeded only: no refresh yet.
            var fields = try await listed()
            #expect(fields.count == 9 && fields[6] == "seeded" && fields[7] == "-" && fields[8] == "-", "\(fields)")

            // The stale refresh token is refused: invalid_grant.
            #expect(try await proxy.get("http://api.test/a", host: "api.test").status == 502)
            fields = try await listed()
            #expect(fields.count == 9 && fields[8] == "failed: invalid_grant", "\(fields)")
            #expect(fields.count == 9 && fields[7] != "-")
            #expect(try keychain.entry("api/last_refresh_failure")?.stringValue?.hasSuffix(" invalid_grant") == true)

            // Another process sharing the keychain notes its own failed refresh: the file changed, its tokens did
            // not, so the hold-down stays (no second call; two processes must not lift each other's) …
            try keychain.set("api/last_refresh_failure", value: Array("1900000000 status-503".utf8))
            #expect(try await proxy.get("http://api.test/b", host: "api.test").status == 502)
            #expect(auth.tokenCalls == 1)
            // A token with a control character is refused and changes nothing: TAB and C1 (NEL) too.
            for bad in [#"a\tb"#, #"a\302\205b"#, #"a\177b"#] {
                let refused = try await SpawnedProcess.run(
                    "/bin/sh", ["-c", "printf '\(bad)' | '\(binary)' tokens seed api --config '\(config)'"])
                #expect(refused.status == 1, "\(bad): \(refused.standardError)")
                #expect(refused.standardError.contains("control characters"), "\(bad): \(refused.standardError)")
            }
            #expect(try keychain.entry("api/last_refresh_failure") != nil, "nothing was seeded")
            // … until a new refresh token is seeded: a new grant, so the note goes with it (no refresh of it yet) …
            let seed = try await SpawnedProcess.run(
                "/bin/sh",
                ["-c", "printf %s '\(auth.currentRefreshToken)' | '\(binary)' tokens seed api --config '\(config)'"])
            #expect(seed.status == 0, "\(seed.standardError)")
            fields = try await listed()
            #expect(fields.count == 9 && fields[6] == "seeded" && fields[7] == "-" && fields[8] == "-", "\(fields)")
            #expect(try keychain.entry("api/last_refresh_failure") == nil)
            // … and the proxy uses it at once (the hold-down lifted: the tokens changed).
            #expect(try await proxy.get("http://api.test/c", host: "api.test").status == 200)
            fields = try await listed()
            #expect(fields.count == 9 && fields[6] == "refreshed" && fields[8] == "ok", "\(fields)")
            #expect(fields.count == 9 && fields[7] == fields[5])
            #expect(try keychain.entry("api/last_refresh_failure") == nil)
        }
    }

    @Test("token endpoint 503, 503, 200 → the refresh succeeds")
    func endpointRetries() async throws {
        try await Self.withAuthProxy(
            entries: ["api/refresh_token": "refresh-0"], prepare: { auth in auth.update { $0.failNext = 2 } }
        ) { auth, origin, keychain, proxy in
            let r3 = try await proxy.get("http://api.test/x", host: "api.test")
            #expect(r3.status == 200)
            #expect(auth.tokenCalls == 3)
        }
    }

    @Test("no token can be had → 502 token-unavailable before any attempt")
    func tokenUnavailable() async throws {
        try await Self.withAuthProxy(
            entries: ["api/refresh_token": "refresh-0"], prepare: { auth in auth.update { $0.invalidGrant = true } }
        ) { auth, origin, keychain, proxy in
            let response = try await proxy.get("http://api.test/x", host: "api.test")
            #expect(response.status == 502)
            #expect(response.header("X-Backstop-Error") == "token-unavailable")
            #expect(origin.requestCount == 0)
        }
    }

    /// A request that ran out of `timeouts.total` while its token was fetched leaves the fetch running; the
    /// connection's next request, to another upstream whose token is being fetched too, must not take the first
    /// fetch's token when it arrives (it would send upstream a's token to b).
    @Test("a token fetched for a request that already ended is not given to the connection's next request")
    func lateTokenNotGivenToNextRequest() async throws {
        let authA = try await TestAuthServer.start(initialRefreshToken: "refresh-a")
        let authB = try await TestAuthServer.start(initialRefreshToken: "refresh-b")
        authA.update {
            $0.tokenSalt = "a"
            $0.answerDelay = .milliseconds(2500)
        }
        authB.update {
            $0.tokenSalt = "b"
            $0.answerDelay = .milliseconds(4000)
        }
        let origin = try await TestOrigin.start { _ in .text(200, "ok") }
        let (keychain, directory) = try Self.makeKeychain([
            "a/refresh_token": "refresh-a", "b/refresh_token": "refresh-b",
        ])
        defer { TestFiles.remove(directory) }
        func upstream(_ name: String, _ auth: TestAuthServer, total: String) -> String {
            "  - name: \(name)\n    match: {hosts: [\(name).test]}\n    url: \(origin.baseURL)\n"
                + "    retry: {attempts: 1}\n    timeouts: {connect: 1s, per_try: \(total), total: \(total)}\n"
                + "    auth: {type: oauth2, token_url: \"\(auth.tokenURL)\", keychain_prefix: \(name)}\n"
        }
        let yaml =
            keychainSection(directory: directory) + "\nupstreams:\n" + upstream("a", authA, total: "1s")
            + upstream("b", authB, total: "10s")
        let proxy = try await ProxyHarness.start(yaml, keychain: keychain)
        var failure: (any Error)?
        do {
            let connection = try await RawHTTPConnection.connect(port: proxy.port)
            let first = try await connection.exchange(
                "GET http://a.test/1 HTTP/1.1\r\nHost: a.test\r\n\r\n", timeout: .seconds(5))
            #expect(first.status == 502 && first.header("X-Backstop-Error") == "token-unavailable")
            #expect(first.header("Connection") == nil)
            // a's token arrives while this one waits for b's.
            let second = try await connection.exchange(
                "GET http://b.test/2 HTTP/1.1\r\nHost: b.test\r\n\r\n", timeout: .seconds(10))
            #expect(second.status == 200, "\(second.bodyString)")
            await connection.close()
            #expect(authA.tokenCalls == 1 && authB.tokenCalls == 1)
            #expect(origin.requests.map { $0.header("Authorization") } == ["Bearer access-b-1"])
        } catch { failure = error }
        await proxy.stop()
        try? await origin.shutdown()
        try? await authA.origin.shutdown()
        try? await authB.origin.shutdown()
        if let failure { throw failure }
    }

    @Test("a token announced with expires_in 0 is used until rejected, not refreshed again and again")
    func zeroLifetimeToken() async throws {
        try await Self.withAuthProxy(prepare: { auth in auth.update { $0.expiresIn = 0 } }) {
            auth, origin, keychain, proxy in
            for index in 0..<3 {
                let response = try await proxy.get("http://api.test/z\(index)", host: "api.test")
                #expect(response.status == 200, "\(response.bodyString)")
            }
            #expect(auth.tokenCalls == 1)
            #expect(origin.requestCount == 3)
            // The upstream rejecting it is what ends it: one refresh, one replay.
            auth.revokeAllAccessTokens()
            #expect(try await proxy.get("http://api.test/after", host: "api.test").status == 200)
            #expect(auth.tokenCalls == 2)
        }
    }

    @Test("client_credentials with JSON and camelCase fields; the client's own Authorization is replaced")
    func clientCredentialsJSON() async throws {
        let prepare: (TestAuthServer) -> Void = { auth in
            auth.update {
                $0.accessTokenField = "accessToken"
                $0.expiresInField = "expiresIn"
            }
        }
        let config: (TestOrigin, TestAuthServer, String) -> String = { origin, auth, directory in
            """
            \(keychainSection(directory: directory))
            upstreams:
              - name: api
                match: {hosts: [api.test]}
                url: \(origin.baseURL)
                auth:
                  type: oauth2
                  token_url: \(auth.tokenURL)
                  grant: client_credentials
                  request_format: json
                  client_id: backstop
                  client_secret_entry: api/secret
                  keychain_prefix: api
                  fields: {access_token: accessToken, expires_in: expiresIn}
            """
        }
        try await Self.withAuthProxy(entries: ["api/secret": "s3cret"], prepare: prepare, config: config) {
            auth, origin, _, proxy in
            let response = try await proxy.get(
                "http://api.test/x", host: "api.test", headers: [("Authorization", "Bearer client-own")])
            #expect(response.status == 200)
            #expect(origin.requests.first?.header("Authorization") == "Bearer access-1")
            #expect(auth.requestBodies.first?.contains("\"grant_type\":\"client_credentials\"") == true)
            #expect(auth.requestBodies.first?.contains("\"client_secret\":\"s3cret\"") == true)
        }
    }

    @Test("the keychain file holds no token in plaintext or base64")
    func keychainIsEncrypted() async throws {
        try await Self.withAuthProxy(entries: ["api/refresh_token": "refresh-0"]) { auth, origin, keychain, proxy in
            let r4 = try await proxy.get("http://api.test/x", host: "api.test")
            #expect(r4.status == 200)
            let bytes = try Data(contentsOf: URL(fileURLWithPath: keychain.path))
            let text = String(decoding: bytes, as: UTF8.self)
            for secret in ["access-1", auth.currentRefreshToken] {
                #expect(!text.contains(secret))
                #expect(!text.contains(Data(secret.utf8).base64EncodedString().dropLast(2)))
            }
        }
    }

    @Test("static auth injects a keychain entry as is into the configured header")
    func staticAuth() async throws {
        let origin = try await TestOrigin.start { request in .text(200, request.header("X-Api-Key") ?? "none") }
        let (keychain, directory) = try Self.makeKeychain(["legacy/token": "k-123"])
        defer { TestFiles.remove(directory) }
        let proxy = try await ProxyHarness.start(
            staticAuthConfig(
                directory: directory, url: origin.baseURL, entry: "legacy/token", header: "X-Api-Key",
                scheme: ""),
            keychain: keychain)
        let r5 = try await proxy.get("http://api.test/", host: "api.test")
        #expect(r5.bodyString == "k-123")
        await proxy.stop()
        try await origin.shutdown()
    }
}
