import BackstopCore
import Foundation

/// A bound AF_UNIX datagram socket standing in for systemd's notify socket.
public final class NotifySocket {
    public let path: String
    private let fd: Int32
    public private(set) var messages: [String] = []

    public init(directory: String) throws {
        path = directory + "/notify.sock"
        fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
        let result = bindUnixSocket(fd, path: path)
        guard result == 0 else { throw RawHTTPError.connectFailed("bind notify socket: errno \(errno)") }
        _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
    }

    deinit { close(fd) }

    private func drain() {
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = recv(fd, &buffer, buffer.count, 0)
            if n <= 0 { return }
            messages.append(String(decoding: buffer[0..<n], as: UTF8.self))
        }
    }

    /// Waits until some message satisfies `predicate`; returns its index. A datagram's arrival is an event: the wait
    /// is `poll(2)` on the socket, not a timer.
    @discardableResult
    public func waitFor(
        after start: Int = 0, timeout: Duration = .seconds(10), _ predicate: (String) -> Bool
    ) async throws -> Int {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            drain()
            if let index = messages.indices.first(where: { $0 >= start && predicate(messages[$0]) }) {
                return index
            }
            // Until a datagram arrives or the deadline passes (in slices, so a cancelled test does not wait long).
            let left = deadline - ContinuousClock.now
            var readable = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            _ = poll(&readable, 1, Int32(clamping: min(max(left.nanosecondsClamped / 1_000_000, 0), 100)))
            try Task.checkCancellation()
        }
        throw RawHTTPError.timeout(timeout, waitingFor: "notify message; got \(messages)")
    }
}
