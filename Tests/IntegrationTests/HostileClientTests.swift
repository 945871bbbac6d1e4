import BackstopTestSupport
import Foundation
import Synchronization
import Testing

/// Clients that hold connections without sending requests (SPEC §2 `limits.client_idle_timeout`).
@Suite("Hostile clients")
struct HostileClientTests {
    /// Sends a request head one byte every `interval` without ever finishing it; returns how long the server
    /// kept the connection (nil if it was still open after `limit`).
    static func trickle(port: Int, interval: Duration, limit: Duration) throws -> Duration? {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        inet_pton(AF_INET, "127.0.0.1", &address.sin_addr)
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard connected == 0 else { throw RawHTTPError.connectFailed("errno \(errno)") }
        _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
        let head = Array("GET http://app.test/ HTTP/1.1\r\nHost: app.test\r\nX-Slow: ".utf8) + Array(repeating: UInt8(ascii: "a"), count: 4096)
        let started = ContinuousClock.now
        var sent = 0
        var buffer = [UInt8](repeating: 0, count: 512)
        while ContinuousClock.now - started < limit, sent < head.count {
            let n = recv(fd, &buffer, buffer.count, 0)
            if n == 0 { return ContinuousClock.now - started }  // the server closed it
            let wrote = head[sent...].withUnsafeBytes { send(fd, $0.baseAddress, 1, Int32(MSG_NOSIGNAL)) }
            if wrote < 0 && errno != EAGAIN { return ContinuousClock.now - started }
            sent += max(wrote, 0)
            Thread.sleep(forTimeInterval: Double(interval.components.attoseconds) / 1e18 + Double(interval.components.seconds))
        }
        return nil
    }

    /// Runs `body` on a new thread; the returned function awaits its result.
    static func onThread<T: Sendable>(_ body: @escaping @Sendable () throws -> T) -> @Sendable () async throws -> T {
        let box = ResultBox<T>()
        let thread = Thread { box.set(Result { try body() }) }
        thread.start()
        return { try await box.value() }
    }

    final class ResultBox<T: Sendable>: Sendable {
        private let state = Mutex<(result: Result<T, any Error>?, waiter: CheckedContinuation<T, any Error>?)>((nil, nil))

        func set(_ result: Result<T, any Error>) {
            let waiter = state.withLock { s -> CheckedContinuation<T, any Error>? in
                s.result = result
                let w = s.waiter
                s.waiter = nil
                return w
            }
            waiter?.resume(with: result)
        }

        func value() async throws -> T {
            try await withCheckedThrowingContinuation { continuation in
                let ready = state.withLock { s -> Result<T, any Error>? in
                    if let r = s.result { return r }
                    s.waiter = continuation
                    return nil
                }
                if let ready { continuation.resume(with: ready) }
            }
        }
    }

    @Test("slowloris: heads trickled byte by byte are cut at client_idle_timeout while others are served")
    func slowloris() async throws {
        try await withOriginAndProxy(
            origin: { _ in .text(200, "served") },
            config: { singleUpstreamConfig($0, extra: "limits: {client_idle_timeout: 1s}") }
        ) { _, proxy in
            let port = proxy.port
            // Blocking sockets on threads of their own: the cooperative pool must stay free for the honest client.
            let trickles = (0..<20).map { _ in
                Self.onThread { try Self.trickle(port: port, interval: .milliseconds(100), limit: .seconds(8)) }
            }
            try await Task.sleep(for: .milliseconds(300))
            let started = ContinuousClock.now
            let response = try await proxy.get("http://app.test/", host: "app.test")
            #expect(response.bodyString == "served")
            #expect(ContinuousClock.now - started < .seconds(2), "an honest client waited behind the slow ones")
            for trickle in trickles {
                let held = try await trickle()
                let heldFor = try #require(held, "a trickling client kept its connection for 8 s")
                #expect(heldFor >= .milliseconds(800) && heldFor < .seconds(4), "held for \(heldFor)")
            }
        }
    }

    @Test("an idle keep-alive connection is closed after client_idle_timeout")
    func idleKeepAlive() async throws {
        try await withOriginAndProxy(
            origin: { _ in .text(200, "ok") },
            config: { singleUpstreamConfig($0, extra: "limits: {client_idle_timeout: 500ms}") }
        ) { _, proxy in
            let connection = try await RawHTTPConnection.connect(port: proxy.port)
            let first = try await connection.exchange(RawHTTP.request("GET", "http://app.test/", host: "app.test"), timeout: .seconds(5))
            #expect(first.status == 200)
            try await connection.waitForClose(timeout: .seconds(5))
            #expect(connection.isClosed)
        }
    }
}
