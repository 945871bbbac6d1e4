import BackstopKeychain
import BackstopTestSupport
import Foundation
import Testing

/// What the token refresh tells an operator and does on its own, through the proxy over real sockets: the cause of a
/// failed token endpoint call, the access line of a failed refresh, the timer-driven proactive refresh
/// (docs/reference/behaviour.md#oauth2, docs/reference/operations.md#logs).
extension TokenRefreshTests {
    /// A proxy whose log lines are captured, with one oauth2 upstream `api.test` using `tokenURL`.
    static func withCapturedProxy(
        tokenURL: ((TestAuthServer) -> String)? = nil, extra: String = "", prepare: (TestAuthServer) -> Void = { _ in },
        _ body: (TestAuthServer, TestOrigin, ProxyHarness, LogCapture) async throws -> Void
    ) async throws {
        let auth = try await TestAuthServer.start()
        prepare(auth)
        let origin = try await TestOrigin.start(script: auth.protectedScript())
        let (keychain, directory) = try makeKeychain(["api/refresh_token": "refresh-0"])
        defer { TestFiles.remove(directory) }
        let capture = LogCapture()
        let yaml = """
            log: {level: debug, access_log: true}
            \(keychainSection(directory: directory))
            \(OAuth2TestConfig.upstreams(
                originURL: origin.baseURL, tokenURL: tokenURL?(auth) ?? auth.tokenURL, authLines: [extra]))
            """
        let proxy = try await ProxyHarness.start(yaml, keychain: keychain, capture: capture)
        var failure: (any Error)?
        do { try await body(auth, origin, proxy, capture) } catch { failure = error }
        await proxy.stop()
        try? await origin.shutdown()
        try? await auth.origin.shutdown()
        if let failure { throw failure }
    }

    @Test(
        "a token endpoint that cannot be reached: each failed call logs curl's error, the errno, the address and the URL, never the request body"
    )
    func tokenEndpointFailureNamesTheCause() async throws {
        let closed = try FreePort.reserveClosedPort()
        let url = "http://127.0.0.1:\(closed)/oauth/token"
        try await Self.withCapturedProxy(tokenURL: { _ in url + "?tenant=t1" }) { _, origin, proxy, capture in
            let response = try await proxy.get("http://api.test/x", host: "api.test")
            #expect(response.status == 502)
            #expect(response.header("X-Backstop-Error") == "token-unavailable")
            #expect(origin.requestCount == 0)
            let retried = capture.messages("token endpoint failed; retrying")
            let final = capture.messages("token refresh failed")
            #expect(retried.count == 2, "\(capture.all)")
            #expect(final.count == 1, "\(capture.all)")
            for line in retried + final {
                #expect(line.contains("outcome=connect-failure"), "\(line)")
                #expect(line.contains("curl=7 "), "\(line)")
                #expect(line.contains("errno=111 (Connection refused)"), "\(line)")
                #expect(line.contains("address=127.0.0.1:\(closed)"), "\(line)")
                #expect(
                    line.contains("url=\(url) ") || line.hasSuffix("url=\(url)\n"), "the URL without its query: \(line)"
                )
                #expect(line.contains("upstream=api"))
            }
            #expect(final.first?.contains("attempt=3") == true, "\(final)")
            for line in capture.all { #expect(!line.contains("refresh-0"), "no refresh token in the log: \(line)") }
        }
    }

    @Test(
        "a failed refresh after a rejected token: the access line carries error=token-refresh-failed, as the client's header does"
    )
    func accessLineNamesTheFailedRefresh() async throws {
        try await Self.withCapturedProxy { auth, _, proxy, capture in
            #expect(try await proxy.get("http://api.test/ok", host: "api.test").status == 200)
            auth.revokeAllAccessTokens()
            auth.update { $0.invalidGrant = true }
            let response = try await proxy.get("http://api.test/denied", host: "api.test")
            #expect(response.status == 401)
            #expect(response.header("X-Backstop-Error") == "token-refresh-failed")
            let lines = try await capture.waitFor("request", count: 2)
            let denied = try #require(lines.first { $0.contains("path=/denied") })
            #expect(denied.contains("status=401"), "\(denied)")
            #expect(denied.contains("error=token-refresh-failed"), "\(denied)")
            let ok = try #require(lines.first { $0.contains("path=/ok") })
            #expect(!ok.contains("error="), "\(ok)")
        }
    }

    @Test(
        "a short-lived token in use is refreshed on a timer before the next request arrives; that request costs no token call"
    )
    func proactiveRefreshRunsOnATimer() async throws {
        // Tokens live 4 s and are refreshed 2 s ahead (or halfway, whichever is later): 2 s after each grant.
        try await Self.withCapturedProxy(
            extra: "refresh_ahead: 2s", prepare: { auth in auth.update { $0.expiresIn = 4 } }
        ) {
            auth, origin, proxy, capture in
            #expect(try await proxy.get("http://api.test/first", host: "api.test").status == 200)
            #expect(auth.tokenCalls == 1)
            // No request now: the timer alone must call the endpoint.
            _ = await Poll.holds(within: .seconds(6), every: .milliseconds(20)) { auth.tokenCalls >= 2 }
            #expect(auth.tokenCalls >= 2, "refreshed without a request")
            let calls = auth.tokenCalls
            // The endpoint counts a call when it answers; the token is in use once the manager logged it.
            _ = try await capture.waitFor("token refreshed", count: calls)
            let next = try await proxy.get("http://api.test/next", host: "api.test")
            #expect(next.status == 200)
            #expect(auth.tokenCalls == calls, "the request took the refreshed token; it paid for no refresh")
            let sent = origin.requests.last { $0.uri == "/next" }?.header("Authorization")
            #expect(sent == "Bearer access-\(calls)", "\(sent ?? "none")")
        }
    }
}
