import BackstopKeychain
import BackstopTestSupport
import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Regressions for the findings of the attacker's review (each failed before its fix): the token endpoint's TLS,
/// passthrough loops and reach, dot segments, TRACE, stalled request bodies, stalled response bodies, the admin
/// listener's protections.
@Suite("Security review regressions")
struct SecurityReviewTests {
    // MARK: the token endpoint's TLS is its own

    @Test("insecure_skip_verify on the upstream never reaches the token endpoint: an unverifiable one gets nothing")
    func tokenEndpointKeepsVerification() async throws {
        let directory = try TestFiles.makeTemporaryDirectory()
        defer { TestFiles.remove(directory) }
        let certificates = try TestCertificates.generate(in: directory)
        let auth = try await TestAuthServer.start(tls: certificates.serverIdentity)
        let origin = try await TestOrigin.start(script: auth.protectedScript())
        let (keychain, keyDirectory) = try TokenRefreshTests.makeKeychain([
            "api/refresh_token": "refresh-0", "api/secret": "s3cret",
        ])
        defer { TestFiles.remove(keyDirectory) }
        let proxy = try await ProxyHarness.start(
            """
            \(keychainSection(directory: keyDirectory))
            upstreams:
              - name: api
                match: {hosts: [api.test]}
                url: \(origin.baseURL)
                tls: {insecure_skip_verify: true}
                retry: {attempts: 1}
                auth: {type: oauth2, token_url: "\(auth.tokenURL)", keychain_prefix: api, client_id: c,
                       client_secret_entry: api/secret}
            """, keychain: keychain)
        let response = try await proxy.get("http://api.test/x", host: "api.test")
        #expect(response.status == 502)
        #expect(response.header("X-Backstop-Error") == "token-unavailable")
        // The handshake failed before any byte of the request (client secret, refresh token) was sent.
        #expect(auth.tokenCalls == 0)
        await proxy.stop()
        try await origin.shutdown()
        try await auth.origin.shutdown()
    }

    @Test("auth.tls.ca_file trusts the token endpoint's CA, whatever the upstream's own tls says")
    func tokenEndpointOwnCA() async throws {
        let directory = try TestFiles.makeTemporaryDirectory()
        defer { TestFiles.remove(directory) }
        let certificates = try TestCertificates.generate(in: directory)
        let otherDirectory = try TestFiles.makeTemporaryDirectory()
        defer { TestFiles.remove(otherDirectory) }
        let other = try TestCertificates.generate(in: otherDirectory)
        let auth = try await TestAuthServer.start(tls: certificates.serverIdentity)
        let origin = try await TestOrigin.start(script: auth.protectedScript())
        let (keychain, keyDirectory) = try TokenRefreshTests.makeKeychain(["api/refresh_token": "refresh-0"])
        defer { TestFiles.remove(keyDirectory) }
        let proxy = try await ProxyHarness.start(
            """
            \(keychainSection(directory: keyDirectory))
            upstreams:
              - name: api
                match: {hosts: [api.test]}
                url: \(origin.baseURL)
                tls: {ca_file: \(other.caCertPath)}
                auth:
                  type: oauth2
                  token_url: "\(auth.tokenURL)"
                  keychain_prefix: api
                  tls: {ca_file: \(certificates.caCertPath)}
            """, keychain: keychain)
        let response = try await proxy.get("http://api.test/x", host: "api.test")
        #expect(response.status == 200)
        #expect(auth.tokenCalls == 1)
        await proxy.stop()
        try await origin.shutdown()
        try await auth.origin.shutdown()
    }

    // MARK: loops and reach

    @Test("passthrough to Backstop's own listener → 508 loop-detected, nothing connects back")
    func passthroughToItself() async throws {
        let proxy = try await ProxyHarness.start("unmatched: passthrough\n")
        let own = proxy.port
        let response = try await proxy.get("http://127.0.0.1:\(own)/loop", host: "127.0.0.1:\(own)")
        #expect(response.status == 508)
        #expect(response.header("X-Backstop-Error") == "loop-detected")
        // Every request that entered carries the one answer above: the proxy did not call itself.
        #expect(proxy.server.runtime.inflightRequests == 0)
        await proxy.stop()
    }

    @Test("passthrough to the admin listener → 508; the name localhost resolves to it too")
    func passthroughToAdmin() async throws {
        let proxy = try await ProxyHarness.start("unmatched: passthrough\nadmin: {listen: \"127.0.0.1:0\"}\n")
        let admin = try #require(proxy.server.adminAddress?.port)
        let byAddress = try await proxy.get("http://127.0.0.1:\(admin)/metrics", host: "127.0.0.1:\(admin)")
        #expect(byAddress.status == 508)
        let byName = try await proxy.get("http://localhost:\(admin)/metrics", host: "localhost:\(admin)")
        #expect(byName.status == 508)
        #expect(byName.header("X-Backstop-Error") == "loop-detected")
        await proxy.stop()
    }

    @Test("a request already carrying 8 Backstop Via entries → 508, nothing sent upstream")
    func viaLoop() async throws {
        try await withOriginAndProxy(origin: { _ in .text(200, "no") }, config: { singleUpstreamConfig($0) }) {
            origin, proxy in
            let via = Array(repeating: "1.1 backstop", count: 8).joined(separator: ", ")
            let looped = try await proxy.get("http://app.test/x", host: "app.test", headers: [("Via", via)])
            #expect(looped.status == 508)
            #expect(looped.header("X-Backstop-Error") == "loop-detected")
            let seven = Array(repeating: "1.1 backstop", count: 7).joined(separator: ", ")
            let fine = try await proxy.get("http://app.test/x", host: "app.test", headers: [("Via", seven)])
            #expect(fine.status == 200)
            #expect(origin.requestCount == 1)
        }
    }

    @Test("passthrough never connects to a link-local address: 403 destination-denied")
    func linkLocal() async throws {
        let proxy = try await ProxyHarness.start("unmatched: passthrough\n")
        let started = ContinuousClock.now
        let response = try await proxy.get("http://169.254.169.254/latest/meta-data/", host: "169.254.169.254")
        #expect(response.status == 403)
        #expect(response.header("X-Backstop-Error") == "destination-denied")
        // Refused before connecting: no connect timeout was waited for.
        #expect(ContinuousClock.now - started < .seconds(1))
        await proxy.stop()
    }

    // MARK: paths and methods

    @Test(
        "dot segments, also percent-encoded, are refused with 400 before routing",
        arguments: [
            "/api/../admin/secret", "/api/%2e%2e/admin/secret", "/api/%2E%2e/admin", "/api/./x", "/api/.%2E/x",
        ])
    func dotSegments(path: String) async throws {
        try await withOriginAndProxy(
            origin: { _ in .text(200, "no") },
            config: { origin in
                """
                upstreams:
                  - {name: api, match: {path_prefix: /api}, url: "\(origin.baseURL)/v2"}
                """
            }
        ) { origin, proxy in
            let response = try await proxy.get(path, host: "127.0.0.1")
            #expect(response.status == 400)
            #expect(response.header("X-Backstop-Error") == "bad-request")
            #expect(origin.requestCount == 0)
        }
    }

    @Test("TRACE to an upstream with auth → 405 method-not-allowed; without auth it is forwarded")
    func trace() async throws {
        let (keychain, directory) = try TokenRefreshTests.makeKeychain(["api/token": "injected-secret"])
        defer { TestFiles.remove(directory) }
        let origin = try await TestOrigin.start { request in
            .text(200, request.headers.map { "\($0.name): \($0.value)" }.joined(separator: "\n"))
        }
        let proxy = try await ProxyHarness.start(
            """
            \(staticAuthConfig(directory: directory, url: origin.baseURL))
              - {name: open, match: {hosts: [open.test]}, url: "\(origin.baseURL)"}
            """, keychain: keychain)
        let refused = try await proxy.send(RawHTTP.request("TRACE", "http://api.test/x", host: "api.test"))
        #expect(refused.status == 405)
        #expect(refused.header("X-Backstop-Error") == "method-not-allowed")
        #expect(!refused.bodyString.contains("injected-secret"))
        let open = try await proxy.send(RawHTTP.request("TRACE", "http://open.test/x", host: "open.test"))
        #expect(open.status == 200)
        #expect(origin.requestCount == 1)
        await proxy.stop()
        try await origin.shutdown()
    }

    // MARK: stalled clients and upstreams

    @Test("a request body that stops arriving → 408 request-timeout and close; the slot is freed")
    func trickledBody() async throws {
        try await withOriginAndProxy(
            origin: { _ in .text(200, "no") },
            config: { origin in
                singleUpstreamConfig(origin) + "\nlimits: {client_idle_timeout: 300ms, max_connections: 1}\n"
            }
        ) { origin, proxy in
            let port = proxy.port
            let started = ContinuousClock.now
            let answer = try await BlockingSocket.onThread {
                try rawExchange(
                    port: port,
                    Array(
                        "POST http://app.test/x HTTP/1.1\r\nHost: app.test\r\nContent-Length: 100\r\n\r\na".utf8))
            }()
            #expect(answer.hasPrefix("HTTP/1.1 408 "), "\(answer.debugDescription)")
            #expect(answer.contains("\r\nX-Backstop-Error: request-timeout\r\n"))
            #expect(ContinuousClock.now - started < .seconds(4))
            #expect(origin.requestCount == 0)
            // The only connection slot is free again.
            let next = try await proxy.get("http://app.test/ok", host: "app.test")
            #expect(next.status == 200)
        }
    }

    @Test("a request body that keeps trickling within the idle timeout is not cut")
    func slowButSteadyBody() async throws {
        try await withOriginAndProxy(
            origin: { request in .text(200, "got \(request.body.count)") },
            config: { origin in
                singleUpstreamConfig(origin) + "\nlimits: {client_idle_timeout: 400ms}\n"
            }
        ) { _, proxy in
            let port = proxy.port
            let answer = try await BlockingSocket.onThread { () -> String in
                let socket = try BlockingSocket(port: port)
                socket.send(
                    "POST http://app.test/x HTTP/1.1\r\nHost: app.test\r\nContent-Length: 5\r\nConnection: close\r\n\r\n"
                )
                for byte in "abcde" {
                    usleep(150_000)
                    socket.send(String(byte))
                }
                return String(decoding: socket.readUntilClosed(timeout: .seconds(5)), as: UTF8.self)
            }()
            #expect(answer.hasPrefix("HTTP/1.1 200 "))
            #expect(answer.hasSuffix("got 5"))
        }
    }

    @Test("a response body that stops for timeouts.idle is aborted: the client connection closes")
    func stalledResponseBody() async throws {
        let origin = try await TestOrigin.start { _ in
            .raw(Array("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly-some".utf8), close: false)
        }
        let proxy = try await ProxyHarness.start(
            """
            upstreams:
              - {name: api, match: {hosts: [api.test]}, url: "\(origin.baseURL)", timeouts: {idle: 300ms}}
            """)
        let port = proxy.port
        let started = ContinuousClock.now
        let answer = try await BlockingSocket.onThread {
            try rawExchange(port: port, Array("GET http://api.test/x HTTP/1.1\r\nHost: api.test\r\n\r\n".utf8))
        }()
        #expect(answer.hasPrefix("HTTP/1.1 200 "))
        #expect(answer.hasSuffix("only-some"))
        #expect(ContinuousClock.now - started < .seconds(4))
        await proxy.stop()
        try await origin.shutdown()
    }

    @Test("a retried small response left to finish for connection reuse is cut after timeouts.idle if it stalls")
    func abandonedResponseIsBounded() async throws {
        let stall = OriginAction.raw(
            Array("HTTP/1.1 503 Service Unavailable\r\nContent-Length: 100\r\n\r\npartial".utf8))
        let origin = try await TestOrigin.start(script: TestOrigin.sequence([stall], then: .text(200, "ok")))
        let proxy = try await ProxyHarness.start(
            """
            upstreams:
              - name: api
                match: {hosts: [api.test]}
                url: \(origin.baseURL)
                timeouts: {idle: 300ms}
                retry: {attempts: 2, backoff: {base: 1ms, max: 1ms}}
            """)
        let response = try await proxy.get("http://api.test/x", host: "api.test")
        #expect(response.status == 200)
        #expect(response.header("X-Backstop-Attempts") == "2")
        // The stalled first connection is closed by Backstop; only the reusable second one stays.
        _ = await Poll.holds(within: .seconds(5), every: .milliseconds(20)) { origin.openConnectionCount <= 1 }
        #expect(origin.openConnectionCount == 1)
        await proxy.stop()
        try await origin.shutdown()
    }

    // MARK: the admin listener

    @Test("the admin listener closes idle connections and caps them like proxy listeners")
    func adminListener() async throws {
        let proxy = try await ProxyHarness.start(
            """
            admin: {listen: "127.0.0.1:0"}
            limits: {client_idle_timeout: 300ms, max_connections: 1}
            """)
        let admin = try #require(proxy.server.adminAddress?.port)
        let started = ContinuousClock.now
        let idle = try await BlockingSocket.onThread { () -> [UInt8] in
            let socket = try BlockingSocket(port: admin)
            return socket.readUntilClosed(timeout: .seconds(5))
        }()
        #expect(idle.isEmpty)
        #expect(ContinuousClock.now - started < .seconds(4))
        // With the one slot held by an idle connection, a second client waits; it is served once the first is closed.
        let served = try await BlockingSocket.onThread { () -> String in
            let holder = try BlockingSocket(port: admin)
            let waiting = try BlockingSocket(port: admin)
            waiting.send("GET /healthz HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            let early = waiting.waitForData(timeout: .milliseconds(150))
            _ = holder.readUntilClosed(timeout: .seconds(5))
            let answer = String(decoding: waiting.readUntilClosed(timeout: .seconds(5)), as: UTF8.self)
            return early == .timeout ? answer : "answered while the cap was reached"
        }()
        #expect(served.hasPrefix("HTTP/1.1 200 "), "\(served)")
        await proxy.stop()
    }
}

/// Keychain-side regressions of the review: a rotated refresh token is never thrown away, and a reload cannot
/// half-apply a keychain change.
@Suite("Keychain review regressions")
struct KeychainReviewTests {
    @Test("a rotated refresh token that cannot be written is used anyway, and written once the keychain is back")
    func rotatedTokenSurvivesAFailedWrite() async throws {
        let parent = try TestFiles.makeTemporaryDirectory()
        defer { TestFiles.remove(parent) }
        let directory = parent + "/state"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: false)
        let opened = try KeychainBootstrap.open(
            path: directory + "/keychain.bkc", key: .file(path: parent + "/keychain.key"))
        try opened.keychain.set("api/refresh_token", value: Array("refresh-0".utf8))
        // The token endpoint takes 600 ms, long enough to take the keychain's directory away meanwhile.
        let grant = #"{"access_token":"access-1","refresh_token":"refresh-1","expires_in":3600}"#
        let tokenEndpoint = try await TestOrigin.start { _ in
            .delay(
                .milliseconds(600),
                then: .respond(
                    status: 200, headers: [("Content-Type", "application/json")],
                    body: Array(grant.utf8)))
        }
        let origin = try await TestOrigin.start { request in
            request.header("Authorization") == "Bearer access-1" ? .text(200, "ok") : .respond(status: 401)
        }
        let proxy = try await ProxyHarness.start(
            """
            keychain: {path: \(directory)/keychain.bkc, key_file: \(parent)/keychain.key}
            upstreams:
              - name: api
                match: {hosts: [api.test]}
                url: \(origin.baseURL)
                auth: {type: oauth2, token_url: "\(tokenEndpoint.baseURL)/token", keychain_prefix: api}
            """, keychain: opened.keychain)
        let first = Task { try await proxy.get("http://api.test/a", host: "api.test") }
        _ = try await tokenEndpoint.waitForRequests(1, timeout: .seconds(5))
        try FileManager.default.moveItem(atPath: directory, toPath: parent + "/away")
        let response = try await first.value
        #expect(response.status == 200, "the new token is used although it could not be stored")
        let errors = proxy.server.tokenRefreshes.keychainWriteErrorCount
        #expect(errors >= 1)
        // Still served from memory: no second refresh (the old refresh token may already be spent).
        #expect(try await proxy.get("http://api.test/b", host: "api.test").status == 200)
        #expect(tokenEndpoint.requestCount == 1)
        try FileManager.default.moveItem(atPath: parent + "/away", toPath: directory)
        let deadline = ContinuousClock.now + .seconds(15)
        var stored: String?
        while ContinuousClock.now < deadline {
            stored = try? opened.keychain.entry("api/refresh_token")?.stringValue
            if stored == "refresh-1" { break }
            try await Task.sleep(for: .milliseconds(50))
        }
        #expect(stored == "refresh-1")
        #expect(try opened.keychain.entry("api/access_token")?.stringValue == "access-1")
        await proxy.stop()
        try await origin.shutdown()
        try await tokenEndpoint.shutdown()
    }

    @Test("a reload that changes the keychain section is refused; the old config and keychain stay in force")
    func reloadKeychainChange() async throws {
        let directory = try TestFiles.makeTemporaryDirectory()
        defer { TestFiles.remove(directory) }
        let origin = try await TestOrigin.start { request in .text(200, request.header("Authorization") ?? "none") }
        let port = try FreePort.reserveClosedPort()
        let path = directory + "/backstop.yaml"
        func config(keychainFile: String) -> String {
            """
            version: 1
            listen: [127.0.0.1:\(port)]
            keychain: {path: \(directory)/\(keychainFile), key_file: \(directory)/keychain.key}
            upstreams:
              - {name: api, match: {hosts: [api.test]}, url: "\(origin.baseURL)", auth: {type: static, entry: api/token}}
            """
        }
        try config(keychainFile: "one.bkc").write(toFile: path, atomically: true, encoding: .utf8)
        let opened = try KeychainBootstrap.open(
            path: directory + "/one.bkc", key: .file(path: directory + "/keychain.key"))
        try opened.keychain.set("api/token", value: Array("from-one".utf8))
        let daemon = try DaemonProcess.start(binary: DaemonProcess.binaryPath(), arguments: ["run", "--config", path])
        defer { Task { await daemon.stop() } }
        try await daemon.waitUntilListening(port: port)
        let before = try await RawHTTP.exchange(
            port: port, request: RawHTTP.request("GET", "http://api.test/", host: "api.test"), timeout: .seconds(5))
        #expect(before.bodyString == "Bearer from-one")

        try config(keychainFile: "two.bkc").write(toFile: path, atomically: true, encoding: .utf8)
        daemon.send(signal: SIGHUP)
        try await daemon.waitForOutput(timeout: .seconds(5)) {
            $0.contains("reload rejected") && $0.contains("keychain")
        }
        let after = try await RawHTTP.exchange(
            port: port, request: RawHTTP.request("GET", "http://api.test/", host: "api.test"), timeout: .seconds(5))
        #expect(after.bodyString == "Bearer from-one")
        #expect(!FileManager.default.fileExists(atPath: directory + "/two.bkc"))
    }
}
