import BackstopCore
import NIOCore
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// sd_notify without libsystemd: datagrams to `$NOTIFY_SOCKET` (a path, or `@name` for the abstract namespace).
/// Does nothing when the variable is unset (not started by systemd).
public struct SystemdNotifier: Sendable {
    private let socketPath: String?

    public init(environment: [String: String]) {
        let path = environment["NOTIFY_SOCKET"]
        socketPath = (path?.isEmpty ?? true) ? nil : path
    }

    public var isEnabled: Bool { socketPath != nil }

    /// Sends one notification (`READY=1`, `STATUS=...`, several lines joined with `\n`). Errors are ignored:
    /// a missing supervisor must never stop the proxy.
    @discardableResult
    public func notify(_ message: String) -> Bool {
        guard let socketPath else { return false }
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        var pathBytes = Array(socketPath.utf8)
        if pathBytes.first == UInt8(ascii: "@") { pathBytes[0] = 0 }
        let capacity = MemoryLayout.size(ofValue: address.sun_path)
        guard pathBytes.count < capacity else { return false }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            for (i, byte) in pathBytes.enumerated() { raw[i] = byte }
        }
        let length = socklen_t(MemoryLayout<sa_family_t>.size + pathBytes.count + (pathBytes.first == 0 ? 0 : 1))
        let sent = Array(message.utf8).withUnsafeBytes { bytes in
            withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    sendto(fd, bytes.baseAddress, bytes.count, Int32(MSG_NOSIGNAL), $0, length)
                }
            }
        }
        return sent == message.utf8.count
    }

    /// `MONOTONIC_USEC=` value for `RELOADING=1` (CLOCK_MONOTONIC in microseconds).
    public static func monotonicMicroseconds(clock: any BackstopClock = SystemClock()) -> UInt64 {
        UInt64(max(clock.monotonic().nanosecondsClamped / 1000, 0))
    }

    /// Half of `$WATCHDOG_USEC` (when set for this process), the interval at which to send `WATCHDOG=1`.
    public static func watchdogInterval(environment: [String: String]) -> Duration? {
        guard let text = environment["WATCHDOG_USEC"], let usec = UInt64(text), usec > 0 else { return nil }
        if let pid = environment["WATCHDOG_PID"], let value = Int32(pid), value != getpid() { return nil }
        return .microseconds(Int64(usec / 2))
    }

    /// Sends `WATCHDOG=1` every `interval` from the first of `eventLoops` while every one of them answers: each
    /// ping is sent only once every loop has run the check the previous ping started, so one wedged loop stops
    /// the pings and systemd restarts the service (docs/reference/operations.md#systemd).
    public func startWatchdog(on eventLoops: [EventLoop], interval: Duration) -> RepeatedTask {
        precondition(!eventLoops.isEmpty, "a watchdog needs an event loop")
        let notifier = self
        let round = WatchdogRound(loops: eventLoops.count)
        return eventLoops[0].scheduleRepeatedTask(
            initialDelay: .zero, delay: .nanoseconds(interval.nanosecondsClamped)
        ) { _ in
            guard round.startIfAllAnswered() else { return }
            notifier.notify("WATCHDOG=1")
            for loop in eventLoops { loop.execute { round.answer() } }
        }
    }
}

/// Which event loops have answered the watchdog's last check. A new check starts only when every loop has answered
/// the one before, so an answer that comes late (a loop stalled for longer than an interval) still counts for the
/// check it belongs to, and a loop that never answers holds every later ping back.
final class WatchdogRound: Sendable {
    private let loops: Int
    private let answered: Atomic<Int>

    /// Before the first check every loop counts as having answered: the first ping goes out at once.
    init(loops: Int) {
        self.loops = loops
        answered = Atomic(loops)
    }

    /// Whether every loop answered the last check; if so, a new one starts (no loop has answered it yet).
    func startIfAllAnswered() -> Bool {
        guard answered.load(ordering: .acquiring) >= loops else { return false }
        answered.store(0, ordering: .releasing)
        return true
    }

    /// A loop ran the current check.
    func answer() {
        answered.wrappingAdd(1, ordering: .acquiringAndReleasing)
    }
}
