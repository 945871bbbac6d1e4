import BackstopTestSupport
import Foundation
import Testing

/// Blind `CONNECT` tunnels over real sockets (docs/reference/https-clients.md#tunnels): what is refused and why,
/// bytes both ways, the idle timeout, and a TLS origin in a test network namespace reached end to end.
@Suite("Tunnels")
struct TunnelTests {
    /// Sends `CONNECT target` (plus `after`, in the same write) and reads until the proxy closes or `timeout`.
    private func connect(
        _ port: Int, _ target: String, after: String = "", timeout: Duration = .seconds(5)
    )
        async throws -> String
    {
        let bytes = Array("CONNECT \(target) HTTP/1.1\r\nHost: \(target)\r\n\r\n\(after)".utf8)
        let received = try await BlockingSocket.onThread {
            let socket = try BlockingSocket(port: port)
            _ = socket.send(bytes)
            return socket.readUntilClosed(timeout: timeout)
        }()
        return String(decoding: received, as: UTF8.self)
    }

    private func metrics(_ proxy: ProxyHarness) async throws -> String {
        let admin = try #require(proxy.server.adminAddress?.port)
        let response = try await RawHTTP.exchange(
            port: admin, request: RawHTTP.request("GET", "/metrics", host: "a"),
            timeout: .seconds(5))
        return response.bodyString
    }

    @Test(
        "refused CONNECTs: a name resolving to loopback (rebinding), a literal IP not named, a port not allowed, no port, a malformed name, a name that does not resolve; nothing is connected"
    )
    func refusals() async throws {
        let origin = try await TestOrigin.start { _ in .text(200, "never") }
        let capture = LogCapture()
        let proxy = try await ProxyHarness.start(
            """
            admin: {listen: "127.0.0.1:0"}
            tunnels:
              allow: ["localhost:\(origin.port)", "*.invalid:443", "127.0.0.2:\(origin.port + 1)"]
            """, capture: capture)
        let cases: [(String, Int, String)] = [
            ("localhost:\(origin.port)", 403, "tunnel-denied"),
            ("127.0.0.1:\(origin.port)", 403, "tunnel-denied"),
            ("localhost:\(origin.port + 1)", 403, "tunnel-denied"),
            ("2130706433:\(origin.port)", 400, "bad-request"),
            ("localhost", 400, "bad-request"),
            ("a..b:443", 400, "bad-request"),
            ("nothing-here.invalid:443", 502, "tunnel-unreachable"),
        ]
        for (target, status, reason) in cases {
            let answer = try await connect(proxy.port, target)
            #expect(answer.hasPrefix("HTTP/1.1 \(status) "), "\(target): \(answer)")
            #expect(answer.contains("X-Backstop-Error: \(reason)\r\n"), "\(target): \(answer)")
            #expect(answer.lowercased().contains("connection: close"), "\(target)")
        }
        #expect(origin.connectionCount == 0)
        let lines = try await capture.waitFor("request", count: cases.count)
        #expect(lines.count == cases.count)
        #expect(lines.allSatisfy { $0.contains("method=CONNECT") })
        #expect(lines.contains { $0.contains("host=localhost") && $0.contains("reason=\"denied address 127.0.0.1") })
        let text = try await metrics(proxy)
        #expect(text.contains("backstop_tunnels_total{result=\"denied\"} 3\n"), "\(text)")
        #expect(text.contains("backstop_tunnels_total{result=\"bad-request\"} 3\n"))
        #expect(text.contains("backstop_tunnels_total{result=\"unreachable\"} 1\n"))
        #expect(text.contains("backstop_tunnels_open 0\n"))
        // Only the tunnel that could not be opened is a failure on the status page (the refusals are the client's).
        let failures = proxy.server.statusSnapshot().failures
        #expect(failures.count == 1, "\(failures)")
        #expect(failures.first?.upstream == "-" && failures.first?.endpoint == "nothing-here.invalid:443")
        #expect(failures.first?.status == 502 && failures.first?.cause.hasPrefix("tunnel-unreachable") == true)
        await proxy.stop()
        try await origin.shutdown()
    }

    @Test("a tunnel carries bytes both ways, including bytes sent before the 200; one access line with the byte counts")
    func bytesBothWays() async throws {
        let origin = try await TestOrigin.start { request in .text(200, "through \(request.uri)") }
        let capture = LogCapture()
        let proxy = try await ProxyHarness.start(
            """
            admin: {listen: "127.0.0.1:0"}
            tunnels:
              allow: ["127.0.0.1:\(origin.port)"]
              deny_addresses: [10.0.0.0/8]
            """, capture: capture)
        // The request inside the tunnel goes in the same write as the CONNECT, as eager clients do.
        let request = "GET /inside HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        let answer = try await connect(proxy.port, "127.0.0.1:\(origin.port)", after: request)
        #expect(answer.hasPrefix("HTTP/1.1 200 Connection Established\r\n\r\nHTTP/1.1 200 OK\r\n"), "\(answer)")
        #expect(answer.hasSuffix("through /inside"))
        #expect(origin.requests.map(\.uri) == ["/inside"])
        let lines = try await capture.waitFor("tunnel", count: 1)
        let line = try #require(lines.first)
        #expect(line.contains("mode=blind"))
        #expect(line.contains("address=127.0.0.1:\(origin.port)"))
        #expect(line.contains("bytes_up=\(request.utf8.count) "), "\(line)")
        #expect(line.contains("result=established"))
        let text = try await metrics(proxy)
        #expect(text.contains("backstop_tunnels_total{result=\"established\"} 1\n"))
        #expect(text.contains("backstop_tunnel_bytes_total{direction=\"up\"} \(request.utf8.count)\n"))
        #expect(text.contains("backstop_tunnels_open 0\n"))
        await proxy.stop()
        try await origin.shutdown()
    }

    @Test("a tunnel with no byte either way for idle_timeout is closed")
    func idleTimeout() async throws {
        let origin = try await TestOrigin.start { _ in .text(200, "ok") }
        let capture = LogCapture()
        let proxy = try await ProxyHarness.start(
            """
            tunnels:
              allow: ["127.0.0.1:\(origin.port)"]
              deny_addresses: []
              idle_timeout: 300ms
            """, capture: capture)
        let started = ContinuousClock.now
        let answer = try await connect(proxy.port, "127.0.0.1:\(origin.port)", timeout: .seconds(10))
        let elapsed = ContinuousClock.now - started
        #expect(answer == "HTTP/1.1 200 Connection Established\r\n\r\n")
        #expect(elapsed >= .milliseconds(300) && elapsed < .seconds(5), "closed after \(elapsed)")
        let line = try #require(try await capture.waitFor("tunnel", count: 1).first)
        #expect(line.contains("end=idle-timeout"), "\(line)")
        await proxy.stop()
        try await origin.shutdown()
    }

    @Test(
        "a tunnel to a TLS origin in a test network namespace (not loopback, not private) under the default deny list: HTTPS end to end, Backstop sees only ciphertext",
        .enabled(if: NetworkNamespace.isAvailable, "needs CAP_NET_ADMIN to create a network namespace")
    )
    func namespacedTLSOrigin() async throws {
        let namespace = try NetworkNamespace(index: 5, network: "198.18")
        defer { namespace.remove() }
        let directory = try TestFiles.makeTemporaryDirectory()
        defer { TestFiles.remove(directory) }
        let certificates = try TestCertificates.generate(in: directory, extraNames: ["IP:\(namespace.clientAddress)"])
        let server = try NamespacedTLSServer.start(
            in: namespace, address: namespace.clientAddress, port: 8443, certificates: certificates,
            directory: directory)
        var failure: (any Error)?
        do {
            try await server.waitUntilListening()
            try await tunnelToNamespace(namespace, certificates: certificates)
        } catch {
            failure = error
        }
        await server.stop()
        if let failure { throw failure }
    }

    private func tunnelToNamespace(_ namespace: NetworkNamespace, certificates: TestCertificateSet) async throws {
        let capture = LogCapture()
        let proxy = try await ProxyHarness.start(
            """
            admin: {listen: "127.0.0.1:0"}
            tunnels:
              allow: ["\(namespace.clientAddress):8443"]
            """, capture: capture)
        let marker = "secret-path-\(UInt32.random(in: 0...UInt32.max))"
        let result = try await TestProcess.run(
            "/usr/bin/curl",
            [
                "-s", "--max-time", "10", "--proxy", "http://127.0.0.1:\(proxy.port)", "--cacert",
                certificates.caCertPath,
                "https://\(namespace.clientAddress):8443/\(marker)",
            ])
        #expect(result.status == 0, "\(result.standardError)")
        #expect(result.standardOutput == "tls origin saw /\(marker)\n")
        let line = try #require(try await capture.waitFor("tunnel", count: 1).first)
        #expect(line.contains("address=\(namespace.clientAddress):8443"))
        #expect(!capture.all.contains { $0.contains(marker) }, "the path inside TLS must not be visible to Backstop")
        let text = try await metrics(proxy)
        #expect(text.contains("backstop_tunnels_total{result=\"established\"} 1\n"))
        // A TLS handshake at least: far more than the path's bytes went each way.
        #expect(!text.contains("backstop_tunnel_bytes_total{direction=\"down\"} 0\n"))
        // A literal address the allow list does not name is refused.
        let refused = try await connect(proxy.port, "127.0.0.1:8443")
        #expect(refused.hasPrefix("HTTP/1.1 403 "))
        await proxy.stop()
    }
}

/// A Python HTTPS server run inside a test network namespace, answering `tls origin saw <path>`.
struct NamespacedTLSServer {
    let process: ChildProcess
    let address: String
    let port: Int

    static func start(
        in namespace: NetworkNamespace, address: String, port: Int, certificates: TestCertificateSet, directory: String
    ) throws -> NamespacedTLSServer {
        let script = directory + "/tls_origin.py"
        try """
        import http.server, ssl, sys
        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            def do_GET(self):
                body = ("tls origin saw %s\\n" % self.path).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            def log_message(self, *args):
                pass
        server = http.server.HTTPServer((sys.argv[1], int(sys.argv[2])), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(sys.argv[3], sys.argv[4])
        server.socket = context.wrap_socket(server.socket, server_side=True)
        server.serve_forever()
        """.write(toFile: script, atomically: true, encoding: .utf8)
        let process = try ChildProcess.spawn(
            "/usr/sbin/ip",
            [
                "netns", "exec", namespace.name, "python3", script, address, String(port),
                certificates.serverCertPath, certificates.serverKeyPath,
            ], standardOutput: .null)
        return NamespacedTLSServer(process: process, address: address, port: port)
    }

    /// Waits (10 s at most) until the server accepts connections from this host.
    func waitUntilListening() async throws {
        let listening = await Poll.holds(within: .seconds(10), every: .milliseconds(50)) {
            (try? BlockingSocket(port: port, host: address)) != nil
        }
        guard listening else { throw NamespacedTLSServerError.notListening }
    }

    /// Kills the server and waits (5 s at most) until it is gone; polls, so no thread of the cooperative pool blocks.
    func stop() async {
        kill(process.pid, SIGKILL)
        _ = await Poll.holds(within: .seconds(5), every: .milliseconds(20)) { !process.isRunning }
    }
}

enum NamespacedTLSServerError: Error { case notListening }
