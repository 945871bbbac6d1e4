import BackstopTestSupport
import Foundation
import Testing

/// Upgrade requests relayed over real sockets (docs/reference/behaviour.md#upgrades): a WebSocket handshake
/// forwarded with the credential injected, `101` turning the connection into a two-way relay, other answers
/// relayed as responses, the handshake retried, the relay's idle timeout, and a TLS origin.
@Suite("Upgrade relay", .serialized)
struct UpgradeRelayTests {
    static let key = "dGhlIHNhbXBsZSBub25jZQ=="

    /// A WebSocket handshake for `host` as a client sends it to the proxy (absolute form), with `fields` (each
    /// `Name: value\r\n`).
    static func request(host: String, path: String, fields: String = "") -> String {
        "GET http://\(host)\(path) HTTP/1.1\r\nHost: \(host)\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            + "Sec-WebSocket-Key: \(key)\r\nSec-WebSocket-Version: 13\r\n\(fields)\r\n"
    }

    /// Sends a WebSocket handshake for `host` through the proxy (with `fields`, each `Name: value\r\n`) and reads
    /// until the response head is complete.
    static func handshake(_ socket: BlockingSocket, host: String, path: String = "/ws", fields: String = "") -> String {
        _ = socket.send(request(host: host, path: path, fields: fields))
        _ = read(socket, timeout: .seconds(10)) { $0.firstRange(of: Array("\r\n\r\n".utf8)) != nil }
        let received = socket.received
        guard let end = received.firstRange(of: Array("\r\n\r\n".utf8)) else {
            return String(decoding: received, as: UTF8.self)
        }
        socket.forget(end.upperBound)
        return String(decoding: received[..<end.upperBound], as: UTF8.self)
    }

    /// Sends a WebSocket handshake for `host` through the proxy on a connection of its own and reads the answer
    /// (head and body) until Backstop closes the connection, at most 10 s: for answers that are not a `101`.
    static func answer(_ port: Int, host: String, path: String = "/ws") throws -> String {
        let socket = try BlockingSocket(port: port)
        _ = socket.send(request(host: host, path: path))
        return String(decoding: socket.readUntilClosed(timeout: .seconds(10)), as: UTF8.self)
    }

    /// Reads until `done` holds for what was received, the peer closes, or `timeout`; true when `done` held.
    @discardableResult
    static func read(_ socket: BlockingSocket, timeout: Duration, until done: ([UInt8]) -> Bool) -> Bool {
        let deadline = ContinuousClock.now + timeout
        while !done(socket.received) {
            guard ContinuousClock.now < deadline,
                socket.waitForData(timeout: deadline - ContinuousClock.now) == .data
            else { return done(socket.received) }
        }
        return true
    }

    /// Sends a masked text frame and reads the echoed frame back.
    static func echo(_ socket: BlockingSocket, _ text: String) -> String? {
        _ = socket.send(WebSocketFrames.encode(opcode: WebSocketFrames.text, payload: Array(text.utf8), masked: true))
        read(socket, timeout: .seconds(10)) { WebSocketFrames.decode($0) != nil }
        guard let frame = WebSocketFrames.decode(socket.received) else { return nil }
        socket.clear()
        return String(decoding: frame.payload, as: UTF8.self)
    }

    private func metrics(_ proxy: ProxyHarness) async throws -> String {
        let admin = try #require(proxy.server.adminAddress?.port)
        let response = try await RawHTTP.exchange(
            port: admin, request: RawHTTP.request("GET", "/metrics", host: "a"), timeout: .seconds(5))
        return response.bodyString
    }

    @Test(
        "a WebSocket handshake reaches the origin with the token and Upgrade/Connection; 101 relays frames both ways, large ones too; access and upgrade lines; metrics"
    )
    func echoWithTokenInjected() async throws {
        let (keychain, directory) = try TokenRefreshTests.makeKeychain(["api/token": "ws-secret"])
        defer { TestFiles.remove(directory) }
        let origin = try await WebSocketEchoOrigin.start()
        let capture = LogCapture()
        let proxy = try await ProxyHarness.start(
            """
            admin: {listen: "127.0.0.1:0"}
            \(staticAuthConfig(directory: directory, url: origin.baseURL + "/base"))
            """, keychain: keychain, capture: capture)
        let port = proxy.port
        let big = String(repeating: "0123456789abcdef", count: 20_000)
        let (head, echoes) = try await BlockingSocket.onThread { () -> (String, [String?]) in
            let socket = try BlockingSocket(port: port)
            let head = Self.handshake(socket, host: "api.test", path: "/ws?room=1")
            return (head, [Self.echo(socket, "hello"), Self.echo(socket, "again"), Self.echo(socket, big)])
        }()
        #expect(head.hasPrefix("HTTP/1.1 101 Switching Protocols\r\n"), "\(head)")
        #expect(head.contains("Sec-WebSocket-Accept: \(WebSocketEchoOrigin.acceptValue(for: Self.key))\r\n"))
        #expect(head.contains("Connection: Upgrade\r\nUpgrade: websocket\r\n"), "\(head)")
        #expect(echoes == ["hello", "again", big])
        let handshake = try #require(origin.handshakes.first)
        #expect(handshake.requestLine == "GET /base/ws?room=1 HTTP/1.1")
        #expect(handshake.field("Authorization") == "Bearer ws-secret")
        #expect(handshake.field("Upgrade") == "websocket")
        #expect(handshake.field("Connection") == "Upgrade")
        #expect(handshake.field("Sec-WebSocket-Key") == Self.key)
        #expect(handshake.field("Host") == "127.0.0.1:\(origin.port)")
        #expect(handshake.field("Via") == "1.1 backstop")
        let request = try #require(try await capture.waitFor("request", count: 1).first)
        #expect(request.contains("status=101"), "\(request)")
        #expect(request.contains("upstream=api"))
        #expect(request.contains("endpoint=http://127.0.0.1:\(origin.port)"), "the endpoint that answered: \(request)")
        let line = try #require(try await capture.waitFor("upgrade", count: 1).first)
        #expect(line.contains("protocol=websocket"), "\(line)")
        #expect(line.contains("end=client-closed"), "\(line)")
        #expect(!capture.all.joined().contains("ws-secret"))
        let text = try await metrics(proxy)
        #expect(text.contains("backstop_upgrades_total{result=\"switched\"} 1\n"), "\(text)")
        #expect(text.contains("backstop_upgrades_open 0\n"))
        #expect(text.contains("backstop_upgrade_bytes_total{direction=\"down\"} "))
        await proxy.stop()
        try await origin.shutdown()
    }

    @Test("upgrades: false answers 400 upgrade-not-allowed and the origin sees nothing")
    func refused() async throws {
        let origin = try await WebSocketEchoOrigin.start()
        let proxy = try await ProxyHarness.start(
            """
            upstreams:
              - {name: live, match: {hosts: [live.test]}, url: \(origin.baseURL), upgrades: false}
            """)
        let port = proxy.port
        let head = try await BlockingSocket.onThread { () -> String in
            Self.handshake(try BlockingSocket(port: port), host: "live.test")
        }()
        #expect(head.hasPrefix("HTTP/1.1 400 "), "\(head)")
        #expect(head.contains("X-Backstop-Error: upgrade-not-allowed\r\n"))
        #expect(origin.handshakes.isEmpty)
        await proxy.stop()
        try await origin.shutdown()
    }

    @Test("an origin answering 200 to the handshake: the response is relayed with Connection: close, no relay")
    func notSwitched() async throws {
        let origin = try await WebSocketEchoOrigin.start { _, _ in .respond(status: 200, body: "plain answer") }
        let capture = LogCapture()
        let proxy = try await ProxyHarness.start(
            """
            admin: {listen: "127.0.0.1:0"}
            upstreams:
              - {name: live, match: {hosts: [live.test]}, url: \(origin.baseURL)}
            """, capture: capture)
        let port = proxy.port
        let answer = try await BlockingSocket.onThread { try Self.answer(port, host: "live.test") }()
        #expect(answer.hasPrefix("HTTP/1.1 200 OK\r\n"), "\(answer)")
        #expect(answer.contains("Content-Length: 12\r\n"))
        #expect(answer.lowercased().contains("connection: close\r\n"))
        #expect(answer.hasSuffix("\r\n\r\nplain answer"), "\(answer)")
        let request = try #require(try await capture.waitFor("request", count: 1).first)
        #expect(request.contains("status=200"))
        #expect(capture.messages("upgrade").isEmpty)
        let text = try await metrics(proxy)
        #expect(text.contains("backstop_upgrades_total{result=\"not-switched\"} 1\n"), "\(text)")
        #expect(text.contains("backstop_upgrades_total{result=\"switched\"} 0\n"))
        await proxy.stop()
        try await origin.shutdown()
    }

    @Test(
        "the handshake is retried after a 503 and after a closed connection, then switches; retries on the access line; without tracing the client's traceparent passes unchanged"
    )
    func handshakeRetried() async throws {
        let traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        let origin = try await WebSocketEchoOrigin.start { number, _ in
            switch number {
            case 1: .respond(status: 503, body: "busy")
            case 2: .close
            default: .switchProtocols
            }
        }
        let capture = LogCapture()
        let proxy = try await ProxyHarness.start(
            """
            upstreams:
              - name: live
                match: {hosts: [live.test]}
                url: \(origin.baseURL)
                retry: {attempts: 3, backoff: {strategy: constant, base: 10ms, max: 10ms, jitter: none}}
            """, capture: capture)
        let port = proxy.port
        let (head, echoed) = try await BlockingSocket.onThread { () -> (String, String?) in
            let socket = try BlockingSocket(port: port)
            let head = Self.handshake(socket, host: "live.test", fields: "traceparent: \(traceparent)\r\n")
            return (head, Self.echo(socket, "after retries"))
        }()
        #expect(head.hasPrefix("HTTP/1.1 101 "), "\(head)")
        #expect(head.contains("X-Backstop-Attempts: 3\r\n"))
        #expect(echoed == "after retries")
        #expect(origin.handshakes.count == 3)
        // Without `tracing`, the client's traceparent goes to every attempt unchanged.
        #expect(origin.handshakes.allSatisfy { $0.field("traceparent") == traceparent })
        let request = try #require(try await capture.waitFor("request", count: 1).first)
        #expect(request.contains("attempts=3"), "\(request)")
        #expect(request.contains("retries=503,reset"), "\(request)")
        await proxy.stop()
        try await origin.shutdown()
    }

    @Test("a handshake that outlives per_try is retried and counted as a timed-out attempt, its retry as a 101")
    func handshakeTimeoutCounted() async throws {
        let origin = try await WebSocketEchoOrigin.start { number, _ in number == 1 ? .hang : .switchProtocols }
        let capture = LogCapture()
        let proxy = try await ProxyHarness.start(
            """
            admin: {listen: "127.0.0.1:0"}
            upstreams:
              - name: live
                match: {hosts: [live.test]}
                url: \(origin.baseURL)
                timeouts: {per_try: 200ms}
                retry: {attempts: 2, backoff: {strategy: constant, base: 10ms, max: 10ms, jitter: none}}
            """, capture: capture)
        let port = proxy.port
        let head = try await BlockingSocket.onThread { () -> String in
            Self.handshake(try BlockingSocket(port: port), host: "live.test")
        }()
        #expect(head.hasPrefix("HTTP/1.1 101 "), "\(head)")
        #expect(head.contains("X-Backstop-Attempts: 2\r\n"))
        let request = try #require(try await capture.waitFor("request", count: 1).first)
        #expect(request.contains("retries=timeout"), "\(request)")
        let text = try await metrics(proxy)
        #expect(text.contains("backstop_upstream_attempts_total{upstream=\"live\",outcome=\"timeout\"} 1\n"), "\(text)")
        #expect(text.contains("backstop_upstream_attempts_total{upstream=\"live\",outcome=\"1xx\"} 1\n"), "\(text)")
        await proxy.stop()
        try await origin.shutdown()
    }

    @Test("a connect failure is retried like any GET, and answered 502 once the attempts are spent")
    func connectFailureRetried() async throws {
        let closedPort = try FreePort.reserveClosedPort()
        let capture = LogCapture()
        let proxy = try await ProxyHarness.start(
            """
            upstreams:
              - name: gone
                match: {hosts: [gone.test]}
                url: http://127.0.0.1:\(closedPort)
                retry: {attempts: 2, backoff: {strategy: constant, base: 10ms, max: 10ms, jitter: none}}
            """, capture: capture)
        let port = proxy.port
        let head = try await BlockingSocket.onThread { () -> String in
            Self.handshake(try BlockingSocket(port: port), host: "gone.test")
        }()
        #expect(head.hasPrefix("HTTP/1.1 502 "), "\(head)")
        #expect(head.contains("X-Backstop-Error: upstream-unreachable\r\n"))
        #expect(head.contains("X-Backstop-Attempts: 2\r\n"))
        let request = try #require(try await capture.waitFor("request", count: 1).first)
        #expect(request.contains("retries=connect-failure"), "\(request)")
        #expect(request.contains("reason="), "\(request)")
        // On the status page as any failed request: among the failures, with its endpoint (it was not).
        let failures = proxy.server.statusSnapshot().failures
        #expect(failures.count == 1, "\(failures)")
        #expect(failures.first?.upstream == "gone" && failures.first?.status == 502, "\(failures)")
        #expect(failures.first?.cause.hasPrefix("upstream-unreachable") == true, "\(failures)")
        #expect(failures.first?.endpoint == "http://127.0.0.1:\(closedPort)", "\(failures)")
        await proxy.stop()
    }

    @Test("a relay with no byte either way for tunnels.idle_timeout is closed, and says so")
    func idleTimeout() async throws {
        let origin = try await WebSocketEchoOrigin.start()
        let capture = LogCapture()
        let proxy = try await ProxyHarness.start(
            """
            tunnels: {allow: [], idle_timeout: 300ms}
            upstreams:
              - {name: live, match: {hosts: [live.test]}, url: \(origin.baseURL)}
            """, capture: capture)
        let port = proxy.port
        let (head, closedAfter) = try await BlockingSocket.onThread { () -> (String, Duration) in
            let socket = try BlockingSocket(port: port)
            let head = Self.handshake(socket, host: "live.test")
            let started = ContinuousClock.now
            _ = socket.readUntilClosed(timeout: .seconds(10))
            return (head, ContinuousClock.now - started)
        }()
        #expect(head.hasPrefix("HTTP/1.1 101 "), "\(head)")
        #expect(closedAfter >= .milliseconds(250) && closedAfter < .seconds(5), "closed after \(closedAfter)")
        let line = try #require(try await capture.waitFor("upgrade", count: 1).first)
        #expect(line.contains("end=idle-timeout"), "\(line)")
        await proxy.stop()
        try await origin.shutdown()
    }

    @Test("a TLS origin verified against tls.ca_file: the handshake and frames go through curl's TLS")
    func tlsOrigin() async throws {
        let directory = try TestFiles.makeTemporaryDirectory()
        defer { TestFiles.remove(directory) }
        let certificates = try TestCertificates.generate(in: directory)
        let origin = try await WebSocketEchoOrigin.start(tls: certificates.serverIdentity)
        let proxy = try await ProxyHarness.start(
            """
            upstreams:
              - name: secure
                match: {hosts: [secure.test]}
                url: \(origin.baseURL)
                tls: {ca_file: \(certificates.caCertPath)}
              - name: untrusted
                match: {hosts: [untrusted.test]}
                url: \(origin.baseURL)
                retry: {attempts: 1}
            """)
        let port = proxy.port
        let (head, echoed, refused) = try await BlockingSocket.onThread { () -> (String, String?, String) in
            let socket = try BlockingSocket(port: port)
            let head = Self.handshake(socket, host: "secure.test")
            let echoed = Self.echo(socket, "over tls")
            let refused = Self.handshake(try BlockingSocket(port: port), host: "untrusted.test")
            return (head, echoed, refused)
        }()
        #expect(head.hasPrefix("HTTP/1.1 101 "), "\(head)")
        #expect(echoed == "over tls")
        #expect(refused.hasPrefix("HTTP/1.1 502 "), "\(refused)")
        #expect(origin.handshakes.count == 1)
        await proxy.stop()
        try await origin.shutdown()
    }
}
