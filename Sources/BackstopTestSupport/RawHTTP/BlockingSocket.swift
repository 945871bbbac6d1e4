import Foundation
import NIOConcurrencyHelpers

#if canImport(Glibc)
import Glibc
#endif

/// A plain blocking TCP socket to a loopback port, for tests that need byte-level control the NIO client hides:
/// trickling a head one byte at a time, sending malformed framing, uploading until the server hangs up. Use it
/// from a thread of its own (`onThread`), never from the cooperative pool.
public final class BlockingSocket {
    public let fd: Int32

    /// Connects to `127.0.0.1:port` (or `host`, an IPv4 literal).
    public init(port: Int, host: String = "127.0.0.1") throws {
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw RawHTTPError.connectFailed("socket: errno \(errno)") }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        inet_pton(AF_INET, host, &address.sin_addr)
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard connected == 0 else {
            let code = errno
            close(fd)
            throw RawHTTPError.connectFailed("connect: errno \(code)")
        }
    }

    deinit { close(fd) }

    /// Sends every byte; false when the peer closed or reset the connection.
    @discardableResult
    public func send(_ bytes: [UInt8]) -> Bool {
        var offset = 0
        while offset < bytes.count {
            let n = bytes[offset...].withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { return false }
            offset += n
        }
        return true
    }

    @discardableResult
    public func send(_ text: String) -> Bool { send(Array(text.utf8)) }

    /// What `waitForData` saw.
    public enum Readiness: Equatable {
        /// Bytes arrived (they are appended to `received`).
        case data
        /// The peer closed the connection (orderly or by reset).
        case closed
        /// Nothing within the timeout.
        case timeout
    }

    /// Bytes read so far.
    public private(set) var received: [UInt8] = []

    /// Forgets the bytes read so far (the next response starts empty).
    public func clear() { received.removeAll() }

    /// Forgets the first `count` bytes read (a response head), keeping what followed it.
    public func forget(_ count: Int) { received.removeFirst(min(count, received.count)) }

    /// Waits up to `timeout` for bytes or a close.
    public func waitForData(timeout: Duration) -> Readiness {
        var poller = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        let milliseconds = Int32(
            min(Double(timeout.components.seconds) * 1000 + Double(timeout.components.attoseconds) / 1e15, 600_000))
        let ready = poll(&poller, 1, milliseconds)
        guard ready > 0 else { return .timeout }
        var buffer = [UInt8](repeating: 0, count: 16 * 1024)
        let n = recv(fd, &buffer, buffer.count, 0)
        guard n > 0 else { return .closed }
        received += buffer[0..<n]
        return .data
    }

    /// Reads until the peer closes or `timeout` passes; returns everything received.
    public func readUntilClosed(timeout: Duration) -> [UInt8] {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            if waitForData(timeout: deadline - ContinuousClock.now) != .data { break }
        }
        return received
    }

    /// Runs `body` on a new thread; the returned function awaits its result (blocking sockets must stay off the
    /// cooperative pool, which the proxy under test shares).
    public static func onThread<T: Sendable>(
        _ body: @escaping @Sendable () throws -> T
    ) -> @Sendable () async throws -> T {
        let box = ThreadResult<T>()
        let thread = Thread { box.set(Result { try body() }) }
        thread.stackSize = 256 << 10
        thread.start()
        return { try await box.value() }
    }
}

/// The result of a thread, awaited once.
final class ThreadResult<T: Sendable>: Sendable {
    private let state = NIOLockedValueBox<(result: Result<T, any Error>?, waiter: CheckedContinuation<T, any Error>?)>(
        (nil, nil))

    func set(_ result: Result<T, any Error>) {
        let waiter = state.withLockedValue { s -> CheckedContinuation<T, any Error>? in
            s.result = result
            let w = s.waiter
            s.waiter = nil
            return w
        }
        waiter?.resume(with: result)
    }

    func value() async throws -> T {
        try await withCheckedThrowingContinuation { continuation in
            let ready = state.withLockedValue { s -> Result<T, any Error>? in
                if let r = s.result { return r }
                s.waiter = continuation
                return nil
            }
            if let ready { continuation.resume(with: ready) }
        }
    }
}
