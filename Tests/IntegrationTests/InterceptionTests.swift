import BackstopCA
import BackstopKeychain
import BackstopTestSupport
import Foundation
import NIOConcurrencyHelpers
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// TLS interception over real sockets (docs/reference/https-clients.md#interception): real clients (curl, Python
/// requests, openssl) verify Backstop's leaf against the exported root, and every request inside gets routing,
/// retries, token injection and refresh like any other.
@Suite("Interception")
struct InterceptionTests {
    /// Everything an interception test needs: a TLS origin protected by a token endpoint, a keychain holding a root
    /// CA and a refresh token, the root exported to `rootPath`, and a proxy intercepting `api.test`.
    struct Setup {
        let auth: TestAuthServer
        let origin: TestOrigin
        let proxy: ProxyHarness
        let capture: LogCapture
        let directory: String
        let rootPath: String
        let originCAPath: String

        func curl(_ arguments: [String]) async throws -> TestProcessResult {
            try await TestProcess.run(
                "/usr/bin/curl",
                [
                    "-s", "--max-time", "15", "--proxy", "http://127.0.0.1:\(proxy.port)", "--cacert", rootPath,
                ] + arguments)
        }

        func metrics() async throws -> String {
            let admin = try #require(proxy.server.adminAddress?.port)
            return try await RawHTTP.exchange(
                port: admin, request: RawHTTP.request("GET", "/metrics", host: "a"),
                timeout: .seconds(5)
            )
            .bodyString
        }
    }

    /// Origin paths: `/flaky…` answers 503, 503, then 200 (per path); everything needs a valid bearer token.
    /// `extra` is appended to the proxy's config (top-level sections).
    static func withSetup(extra: String = "", _ body: (Setup) async throws -> Void) async throws {
        let directory = try TestFiles.makeTemporaryDirectory()
        defer { TestFiles.remove(directory) }
        let originCertificates = try TestCertificates.generate(in: directory)
        let auth = try await TestAuthServer.start()
        let flakyCounts = NIOLockedValueBox<[String: Int]>([:])
        let origin = try await TestOrigin.start(tls: originCertificates.serverIdentity) { request in
            guard auth.isAuthorized(request) else {
                return .text(401, "denied", headers: [("WWW-Authenticate", "Bearer")])
            }
            if request.uri.hasPrefix("/flaky") {
                let seen = flakyCounts.withLockedValue { counts -> Int in
                    counts[request.uri, default: 0] += 1
                    return counts[request.uri]!
                }
                if seen < 3 { return .text(503, "busy", headers: [("Retry-After", "0")]) }
            }
            return .text(
                200, "origin saw \(request.method) \(request.uri) with \(request.header("Authorization") ?? "-")")
        }
        let opened = try KeychainBootstrap.open(
            path: directory + "/keychain.bkc", key: .file(path: directory + "/keychain.key"))
        try opened.keychain.set("api/refresh_token", value: Array("refresh-0".utf8))
        let root = try CertificateMinter.makeRoot(commonName: "Backstop test interception root", now: Date())
        try opened.keychain.set("ca/root", value: Array(root.pemBundle.utf8))
        let rootPath = directory + "/root.pem"
        try root.certificatePEM.write(toFile: rootPath, atomically: true, encoding: .utf8)
        let capture = LogCapture()
        let proxy = try await ProxyHarness.start(
            """
            admin: {listen: "127.0.0.1:0"}
            \(keychainSection(directory: directory))
            intercept: {leaf_lifetime: 1h}
            upstreams:
              - name: api
                match: {hosts: [api.test, "*.wild.test"]}
                url: https://localhost:\(origin.port)
                tls: {ca_file: \(originCertificates.caCertPath)}
                intercept: true
                retry: {attempts: 3, on: [503], backoff: {base: 10ms, max: 50ms}}
                auth: {type: oauth2, token_url: \(auth.tokenURL), keychain_prefix: api}
            \(extra)
            """, keychain: opened.keychain, capture: capture)
        let setup = Setup(
            auth: auth, origin: origin, proxy: proxy, capture: capture, directory: directory, rootPath: rootPath,
            originCAPath: originCertificates.caCertPath)
        var failure: (any Error)?
        do { try await body(setup) } catch { failure = error }
        await proxy.stop()
        try? await origin.shutdown()
        try? await auth.origin.shutdown()
        if let failure { throw failure }
    }

    @Test(
        "curl through interception: token injected, 503, 503, 200 retried, a 401 refreshed and replayed once; two requests on one intercepted connection"
    )
    func curlThroughInterception() async throws {
        try await Self.withSetup { setup in
            let first = try await setup.curl(["-D", "-", "https://api.test/data?q=1", "https://api.test/flaky"])
            #expect(first.status == 0, "\(first.standardError)")
            let output = first.standardOutput
            #expect(output.contains("origin saw GET /data?q=1 with Bearer access-1"), "\(output)")
            #expect(output.contains("origin saw GET /flaky with Bearer access-1"), "\(output)")
            #expect(output.contains("X-Backstop-Attempts: 3\r\n"), "\(output)")
            #expect(setup.auth.tokenCalls == 1)
            // Both requests went through one CONNECT: one intercepted connection, two request lines.
            let tunnels = try await setup.capture.waitFor("tunnel", count: 1)
            #expect(tunnels.count == 1)
            #expect(tunnels.first?.contains("mode=intercept") == true)
            #expect(tunnels.first?.contains("result=established") == true)
            let requests = setup.capture.messages("request")
            #expect(requests.count == 2)
            #expect(requests.allSatisfy { $0.contains("host=api.test") && $0.contains("upstream=api") })

            setup.auth.revokeAllAccessTokens()
            let refreshed = try await setup.curl(["https://api.test/after-revoke"])
            #expect(refreshed.standardOutput == "origin saw GET /after-revoke with Bearer access-2")
            #expect(setup.auth.tokenCalls == 2)
            let text = try await setup.metrics()
            #expect(text.contains("backstop_retries_total{upstream=\"api\",reason=\"503\"} 2\n"), "\(text)")
            #expect(text.contains("backstop_intercepted_connections_total{result=\"established\"} 2\n"))
            #expect(text.contains("backstop_requests_total{upstream=\"api\",code=\"200\"} 3\n"))
        }
    }

    @Test(
        "clients: an intercepted CONNECT and the requests inside are decided for the intercepting upstream; a client whose entry does not list it gets 403 to its CONNECT"
    )
    func interceptionObeysClients() async throws {
        try await Self.withSetup(
            extra: "clients:\n  - {name: me, match: {unix_user: \"\(getuid())\"}, upstreams: [api]}"
        ) { setup in
            let allowed = try await setup.curl(["https://api.test/mine"])
            #expect(allowed.standardOutput == "origin saw GET /mine with Bearer access-1", "\(allowed.standardError)")
            let tunnels = try await setup.capture.waitFor("tunnel", count: 1)
            #expect(tunnels.first?.contains("client_entry=me") == true, "\(tunnels)")
            #expect(
                setup.capture.messages("request").contains {
                    $0.contains("path=/mine") && $0.contains("client_entry=me")
                })
        }
        try await Self.withSetup(
            extra: "clients:\n  - {name: someone, match: {unix_user: \"65534\"}, upstreams: [api]}"
        ) { setup in
            let refused = try await setup.curl([
                "-o", "/dev/null", "-w", "%{http_connect}", "https://api.test/not-mine",
            ])
            #expect(refused.standardOutput == "403", "\(refused.standardError)")
            #expect(setup.origin.requestCount == 0)
            let lines = try await setup.capture.waitFor("request", count: 1)
            #expect(
                lines.first?.contains("method=CONNECT") == true && lines.first?.contains("error=client-denied") == true)
        }
    }

    @Test("Python requests with HTTPS_PROXY and verify=<exported root> reaches the origin through interception")
    func pythonRequests() async throws {
        let probe = try await TestProcess.run("/usr/bin/env", ["python3", "-c", "import requests"])
        try #require(
            probe.status == 0, "python3 with requests is needed (pip install requests): \(probe.standardError)")
        try await Self.withSetup { setup in
            let script = """
                import requests
                r = requests.get("https://api.test/py", verify="\(setup.rootPath)", timeout=15)
                print(r.status_code, r.headers.get("X-Backstop-Attempts"), r.text)
                """
            let result = try await TestProcess.run(
                "/usr/bin/env",
                [
                    "HTTPS_PROXY=http://127.0.0.1:\(setup.proxy.port)", "NO_PROXY=", "no_proxy=", "python3", "-c",
                    script,
                ])
            #expect(result.status == 0, "\(result.standardError)")
            #expect(
                result.standardOutput == "200 1 origin saw GET /py with Bearer access-1\n", "\(result.standardError)")
        }
    }

    @Test(
        "the leaf names the requested host and verifies against the root; the intermediate carries critical name constraints; another SNI than the CONNECT host is refused and no leaf is minted for it"
    )
    func certificates() async throws {
        try await Self.withSetup { setup in
            let chain = try await Self.showCerts(
                proxy: setup.proxy.port, connect: "x.wild.test:443", sni: "x.wild.test",
                root: setup.rootPath)
            #expect(chain.verified, "\(chain.output)")
            #expect(chain.certificates.count == 2)
            let leafText = try await Self.x509Text(chain.certificates[0], directory: setup.directory, name: "leaf")
            #expect(leafText.contains("DNS:x.wild.test"), "\(leafText)")
            #expect(!leafText.contains("DNS:api.test"))
            let intermediateText = try await Self.x509Text(
                chain.certificates[1], directory: setup.directory, name: "intermediate")
            #expect(intermediateText.contains("X509v3 Name Constraints: critical"), "\(intermediateText)")
            #expect(intermediateText.contains("DNS:api.test"))
            #expect(intermediateText.contains("DNS:wild.test"))
            #expect(intermediateText.contains("CA:TRUE, pathlen:0"))

            let refused = try await Self.showCerts(
                proxy: setup.proxy.port, connect: "api.test:443", sni: "evil.test",
                root: setup.rootPath)
            #expect(refused.certificates.isEmpty, "\(refused.output)")
            #expect(setup.proxy.server.runtime.snapshot.intercept?.cachedLeafCount == 1)
            let text = try await setup.metrics()
            #expect(text.contains("backstop_intercepted_connections_total{result=\"sni-mismatch\"} 1\n"), "\(text)")
            let warning = try #require(setup.capture.messages("intercepted connection refused").first)
            #expect(warning.contains("result=sni-mismatch"))
        }
    }

    @Test("a client that sends garbage instead of a ClientHello after the 200 is closed and logged")
    func garbageAfterConnect() async throws {
        try await Self.withSetup { setup in
            let port = setup.proxy.port
            let received = try await BlockingSocket.onThread {
                let socket = try BlockingSocket(port: port)
                _ = socket.send("CONNECT api.test:443 HTTP/1.1\r\nHost: api.test:443\r\n\r\n")
                _ = socket.waitForData(timeout: .seconds(5))
                _ = socket.send("GET / HTTP/1.1\r\nHost: api.test\r\n\r\n")
                return socket.readUntilClosed(timeout: .seconds(5))
            }()
            let text = String(decoding: received, as: UTF8.self)
            #expect(text.hasPrefix("HTTP/1.1 200 Connection Established\r\n\r\n"))
            #expect(!text.contains("origin saw"))
            let lines = try await setup.capture.waitFor("tunnel", count: 1)
            #expect(lines.first?.contains("result=handshake-failed") == true, "\(lines)")
            #expect(setup.origin.requestCount == 0)
            let metrics = try await setup.metrics()
            #expect(metrics.contains("backstop_intercepted_connections_total{result=\"handshake-failed\"} 1\n"))
        }
    }

    @Test(
        "a ClientHello split over two records is read whole: another name is refused as sni-mismatch, the CONNECT host's gets a ServerHello"
    )
    func splitClientHello() async throws {
        try await Self.withSetup { setup in
            let port = setup.proxy.port
            /// What the proxy sends back after the 200 to a ClientHello naming `name`, cut after 40 bytes.
            func answer(naming name: String) async throws -> [UInt8] {
                let records = ClientHelloBytes.records(ClientHelloBytes.message(serverName: Array(name.utf8)), size: 40)
                return try await BlockingSocket.onThread {
                    let socket = try BlockingSocket(port: port)
                    let connect = "CONNECT api.test:443 HTTP/1.1\r\nHost: api.test:443\r\n\r\n"
                    _ = socket.send(connect)
                    let established = Array("HTTP/1.1 200 Connection Established\r\n\r\n".utf8)
                    while socket.received.count < established.count,
                        socket.waitForData(timeout: .seconds(5)) == .data
                    {}
                    guard socket.received.starts(with: established) else { return socket.received }
                    socket.forget(established.count)
                    _ = socket.send(records)
                    // A ServerHello (a handshake record) or the close.
                    _ = socket.waitForData(timeout: .seconds(5))
                    return socket.received
                }()
            }
            let refused = try await answer(naming: "other.test")
            #expect(refused.isEmpty, "\(refused.prefix(8))")
            let warning = try #require(
                try await setup.capture.waitFor("intercepted connection refused", count: 1).first)
            #expect(warning.contains("result=sni-mismatch"), "\(warning)")
            #expect(warning.contains("the ClientHello names other.test"), "\(warning)")
            let accepted = try await answer(naming: "api.test")
            #expect(accepted.starts(with: [0x16, 0x03]), "\(accepted.prefix(8))")
            let metrics = try await setup.metrics()
            #expect(metrics.contains("backstop_intercepted_connections_total{result=\"sni-mismatch\"} 1\n"))
        }
    }

    // MARK: openssl helpers

    struct Chain {
        let output: String
        let certificates: [String]
        var verified: Bool { output.contains("Verify return code: 0 (ok)") }
    }

    static func showCerts(proxy: Int, connect: String, sni: String, root: String) async throws -> Chain {
        // stdin from /dev/null: s_client sends nothing and ends after the handshake.
        let result = try await TestProcess.run(
            "/bin/sh",
            [
                "-c",
                "timeout 10 openssl s_client -proxy 127.0.0.1:\(proxy) -connect \(connect) -servername \(sni) -CAfile '\(root)' -showcerts -verify_return_error </dev/null",
            ])
        let output = result.standardOutput + result.standardError
        var certificates: [String] = []
        var current: String?
        for line in result.standardOutput.split(separator: "\n", omittingEmptySubsequences: false) {
            if line == "-----BEGIN CERTIFICATE-----" { current = "" }
            if current != nil { current! += line + "\n" }
            if line == "-----END CERTIFICATE-----", let pem = current {
                certificates.append(pem)
                current = nil
            }
        }
        return Chain(output: output, certificates: certificates)
    }

    static func x509Text(_ pem: String, directory: String, name: String) async throws -> String {
        let path = directory + "/\(name).pem"
        try pem.write(toFile: path, atomically: true, encoding: .utf8)
        return try await TestProcess.run("/usr/bin/openssl", ["x509", "-in", path, "-noout", "-text"]).standardOutput
    }
}
