import BackstopTestSupport
import Foundation
import Testing

@testable import BackstopTransport

/// A real TLS upstream with a CA generated in the test.
@Suite("TLS upstreams")
struct TLSUpstreamTests {
    @Test("HTTPS upstream verified against tls.ca_file; unknown CA → 502; insecure_skip_verify accepts it")
    func tlsOrigin() async throws {
        let directory = try TestFiles.makeTemporaryDirectory()
        defer { TestFiles.remove(directory) }
        let certificates = try TestCertificates.generate(in: directory)
        let origin = try await TestOrigin.start(tls: certificates.serverIdentity) { request in
            .text(200, "secure \(request.uri)")
        }
        let proxy = try await ProxyHarness.start(
            """
            upstreams:
              - name: trusted
                match: {hosts: [trusted.test]}
                url: https://localhost:\(origin.port)/base
                tls: {ca_file: \(certificates.caCertPath)}
              - name: untrusted
                match: {hosts: [untrusted.test]}
                url: https://localhost:\(origin.port)
                retry: {attempts: 1}
              - name: insecure
                match: {hosts: [insecure.test]}
                url: https://localhost:\(origin.port)
                tls: {insecure_skip_verify: true}
            """)
        let trusted = try await proxy.get("http://trusted.test/x?y=1", host: "trusted.test")
        #expect(trusted.status == 200)
        #expect(trusted.bodyString == "secure /base/x?y=1")
        let untrusted = try await proxy.get("http://untrusted.test/", host: "untrusted.test")
        #expect(untrusted.status == 502)
        #expect(untrusted.header("X-Backstop-Error") == "upstream-unreachable")
        let insecure = try await proxy.get("http://insecure.test/", host: "insecure.test")
        #expect(insecure.status == 200)
        // Easy handles are reused one request after another: neither the CA file nor the disabled verification of
        // the previous request may carry over to the next.
        let untrustedAgain = try await proxy.get("http://untrusted.test/again", host: "untrusted.test")
        #expect(untrustedAgain.status == 502)
        let trustedAgain = try await proxy.get("http://trusted.test/again", host: "trusted.test")
        #expect(trustedAgain.status == 200)
        #expect(origin.requests.map(\.uri) == ["/base/x?y=1", "/", "/base/again"])
        await proxy.stop()
        try await origin.shutdown()
    }

    @Test("a certificate that does not verify is not retried, and the log says why without a stale errno")
    func unverifiedCertificateIsNotRetried() async throws {
        let directory = try TestFiles.makeTemporaryDirectory()
        defer { TestFiles.remove(directory) }
        let certificates = try TestCertificates.generate(in: directory)
        let origin = try await TestOrigin.start(tls: certificates.serverIdentity) { _ in .text(200, "secure") }
        let capture = LogCapture()
        // Where `localhost` resolves to ::1 too and nothing listens there, curl's errno from that refused attempt
        // is still on the handle when the IPv4 connection's certificate fails: it must not reach the log.
        let proxy = try await ProxyHarness.start(
            """
            log: {level: debug}
            upstreams:
              - name: untrusted
                match: {hosts: [untrusted.test]}
                url: https://localhost:\(origin.port)
                retry: {attempts: 5, backoff: {base: 1ms, max: 2ms}}
            """, capture: capture)
        let response = try await proxy.get("http://untrusted.test/", host: "untrusted.test")
        #expect(response.status == 502)
        #expect(response.header("X-Backstop-Error") == "upstream-unreachable")
        #expect(response.header("X-Backstop-Attempts") == "1")
        let failed = try await capture.waitFor("attempt failed", count: 1)
        #expect(failed.count == 1)
        #expect(failed.first?.contains("outcome=tls-verification-failed") == true)
        #expect(failed.first?.contains("verify=") == true)
        #expect(failed.first?.contains("local issuer") == true)
        #expect(failed.first?.contains("errno=") == false)
        #expect(capture.messages("attempt failed; retrying").isEmpty)
        await proxy.stop()
        try await origin.shutdown()
    }

    @Test(
        "by default and with tls.http2: false HTTP/1.1 only is offered; tls.http2: true offers h2, taken when accepted")
    func http2Offer() async throws {
        let directory = try TestFiles.makeTemporaryDirectory()
        defer { TestFiles.remove(directory) }
        let certificates = try TestCertificates.generate(in: directory)
        // Accepts h2 by ALPN but speaks HTTP/1.1 only: a client that offers h2 gets it and then fails.
        let identity = TestTLSIdentity(
            certificatePath: certificates.serverIdentity.certificatePath, keyPath: certificates.serverIdentity.keyPath,
            applicationProtocols: ["h2", "http/1.1"])
        // One origin each: curl shares connections between upstreams with the same host and port, and a request
        // that offers h2 may ride an HTTP/1.1 connection another one opened.
        let defaultOrigin = try await TestOrigin.start(tls: identity) { request in .text(200, "h1 \(request.uri)") }
        let pinnedOrigin = try await TestOrigin.start(tls: identity) { request in .text(200, "h1 \(request.uri)") }
        let offeredOrigin = try await TestOrigin.start(tls: identity) { request in .text(200, "h1 \(request.uri)") }
        let proxy = try await ProxyHarness.start(
            """
            upstreams:
              - name: default
                match: {hosts: [default.test]}
                url: https://localhost:\(defaultOrigin.port)
                tls: {ca_file: \(certificates.caCertPath)}
              - name: pinned
                match: {hosts: [pinned.test]}
                url: https://localhost:\(pinnedOrigin.port)
                tls: {ca_file: \(certificates.caCertPath), http2: false}
              - name: offered
                match: {hosts: [offered.test]}
                url: https://localhost:\(offeredOrigin.port)
                retry: {attempts: 1}
                tls: {ca_file: \(certificates.caCertPath), http2: true}
            """)
        // Alternating on reused easy handles: neither setting may leak to or be lost between requests.
        for round in 1...2 {
            let byDefault = try await proxy.get("http://default.test/d\(round)", host: "default.test")
            #expect(byDefault.status == 200)
            #expect(byDefault.bodyString == "h1 /d\(round)")
            let pinned = try await proxy.get("http://pinned.test/p\(round)", host: "pinned.test")
            #expect(pinned.status == 200)
            #expect(pinned.bodyString == "h1 /p\(round)")
            let offered = try await proxy.get("http://offered.test/o\(round)", host: "offered.test")
            #expect(offered.status == 502)
        }
        #expect(defaultOrigin.requests.map(\.uri) == ["/d1", "/d2"])
        #expect(pinnedOrigin.requests.map(\.uri) == ["/p1", "/p2"])
        // Whatever the origin made of the h2 preface, no request reached it as HTTP/1.1.
        #expect(offeredOrigin.requests.map(\.uri).filter { $0.hasPrefix("/") }.isEmpty)
        await proxy.stop()
        try await defaultOrigin.shutdown()
        try await pinnedOrigin.shutdown()
        try await offeredOrigin.shutdown()
    }
    @Test(
        "a TLS upstream's 8 MiB response to a slow reader arrives byte-exact (reading pauses and resumes with records read ahead), and its connection serves the next request"
    )
    func tlsSlowReader() async throws {
        let size = 8 << 20
        let directory = try TestFiles.makeTemporaryDirectory()
        defer { TestFiles.remove(directory) }
        let certificates = try TestCertificates.generate(in: directory)
        let origin = try await TestOrigin.start(tls: certificates.serverIdentity) { request in
            request.uri == "/large"
                ? .stream(status: 200, headers: [], totalBytes: size, chunkSize: 64 << 10, chunked: false)
                : .text(200, "next")
        }
        let proxy = try await ProxyHarness.start(
            """
            upstreams:
              - name: secure
                match: {hosts: [secure.test]}
                url: https://localhost:\(origin.port)
                tls: {ca_file: \(certificates.caCertPath)}
            """)
        let large = try await RawHTTP.exchange(
            port: proxy.port, request: RawHTTP.request("GET", "http://secure.test/large", host: "secure.test"),
            timeout: .seconds(60), readDelayPerChunk: .milliseconds(1))
        #expect(large.status == 200)
        #expect(large.body.count == size)
        #expect(TestPattern.verify(large.body, expectedLength: size))
        let next = try await proxy.get("http://secure.test/next", host: "secure.test")
        #expect(next.bodyString == "next")
        #expect(origin.connectionCount == 1, "the upstream connection was kept and used again")
        await proxy.stop()
        try await origin.shutdown()
    }

    /// A Python HTTPS origin behind a proxy (upstream `resuming`, host `resuming.test`), its first request already
    /// answered (a full handshake: "new"). It tells each request whether its connection resumed a TLS session
    /// ("reused" or "new") and closes the connection after every response, so every request needs a handshake.
    /// `/slow` prints `slow` and is held until `/second` arrives; `/wave…` prints `arrived` and is held until
    /// `waveSize` of them have arrived (504 when they do not within 20 s; 10 s for `/slow`). The caller kills the
    /// origin (SIGKILL: the script leaves SIGTERM to the default it inherits, which a test process may have blocked).
    private func startResumptionOrigin(
        in directory: String, waveSize: Int = 1
    ) async throws -> (origin: DaemonProcess, proxy: ProxyHarness) {
        let certificates = try TestCertificates.generate(in: directory)
        let script = directory + "/resumption_origin.py"
        try """
        import http.server, ssl, sys, threading
        second_arrived = threading.Event()
        wave = threading.Barrier(int(sys.argv[4]), timeout=20)
        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            def do_GET(self):
                status = 200
                if self.path == "/slow":
                    print("slow", flush=True)
                    second_arrived.wait(10)
                if self.path == "/second": second_arrived.set()
                if self.path.startswith("/wave"):
                    print("arrived", flush=True)
                    try:
                        wave.wait()
                    except threading.BrokenBarrierError:
                        status = 504
                body = (b"reused" if self.connection.session_reused else b"new")
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)
                self.close_connection = True
            def log_message(self, *args):
                pass
        class Server(http.server.ThreadingHTTPServer):
            request_queue_size = 256
        server = Server(("127.0.0.1", int(sys.argv[1])), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(sys.argv[2], sys.argv[3])
        server.socket = context.wrap_socket(server.socket, server_side=True)
        server.serve_forever()
        """.write(toFile: script, atomically: true, encoding: .utf8)
        let port = try FreePort.reserveClosedPort()
        let origin = try DaemonProcess.start(
            binary: "/usr/bin/env",
            arguments: [
                "python3", script, String(port), certificates.serverCertPath, certificates.serverKeyPath,
                String(waveSize),
            ])
        do {
            try await origin.waitUntilListening(port: port)
            let proxy = try await ProxyHarness.start(
                """
                upstreams:
                  - name: resuming
                    match: {hosts: [resuming.test]}
                    url: https://localhost:\(port)
                    tls: {ca_file: \(certificates.caCertPath)}
                """)
            let first = try await proxy.get("http://resuming.test/first", host: "resuming.test")
            #expect(first.status == 200)
            #expect(first.bodyString == "new")
            return (origin, proxy)
        } catch {
            origin.send(signal: SIGKILL)
            throw error
        }
    }

    @Test("a new upstream connection on another handle resumes the TLS session the first one made (one session store)")
    func tlsSessionsShared() async throws {
        let directory = try TestFiles.makeTemporaryDirectory()
        defer { TestFiles.remove(directory) }
        let (origin, proxy) = try await startResumptionOrigin(in: directory)
        defer { origin.send(signal: SIGKILL) }
        // The slow request takes the first request's idle handle (which kept a session of its own). Once it has
        // reached the origin (its handshake done, a fresh ticket sent), the next request needs a new handle: only a
        // session store shared by the handles lets that one resume.
        async let slow = proxy.get("http://resuming.test/slow", host: "resuming.test")
        try await origin.waitForOutput(timeout: .seconds(10)) { $0.contains("slow") }
        let onNewHandle = try await proxy.get("http://resuming.test/second", host: "resuming.test")
        #expect(onNewHandle.status == 200)
        #expect(onNewHandle.bodyString == "reused")
        #expect(try await slow.bodyString == "reused")
        await proxy.stop()
        origin.send(signal: SIGKILL)
        await origin.stop()
    }

    /// Connections in more than one group (`HTTP1Connections.connectionsPerGroup` each, a multi handle of its own)
    /// still resume the one session store's TLS sessions: a group holds connections, not sessions.
    @Test("new connections in a second connection group resume the TLS session the first group's connection made")
    func tlsSessionsSharedAcrossConnectionGroups() async throws {
        let directory = try TestFiles.makeTemporaryDirectory()
        defer { TestFiles.remove(directory) }
        let wave = HTTP1Connections.connectionsPerGroup + 2
        let (origin, proxy) = try await startResumptionOrigin(in: directory, waveSize: wave)
        defer { origin.send(signal: SIGKILL) }
        // The wave's requests are answered once all have arrived, so each has a connection of its own. Each is
        // sent only when the one before has arrived, so every handshake starts after the first request's session
        // was stored and none races another (concurrent handshakes resume or not by timing, with one group as with
        // several).
        let answers = try await withThrowingTaskGroup(of: String.self) { tasks in
            for n in 0..<wave {
                tasks.addTask {
                    let response = try await proxy.get("http://resuming.test/wave/\(n)", host: "resuming.test")
                    return "\(response.status) \(response.bodyString)"
                }
                try await origin.waitForOutput(timeout: .seconds(10)) {
                    $0.components(separatedBy: "arrived").count - 1 == n + 1
                }
            }
            return try await tasks.reduce(into: []) { $0.append($1) }
        }
        #expect(answers == Array(repeating: "200 reused", count: wave))
        await proxy.stop()
        origin.send(signal: SIGKILL)
        await origin.stop()
    }
}
