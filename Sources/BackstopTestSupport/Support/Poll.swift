import BackstopCore
import Foundation

/// Waiting for a condition no event announces (a counter another thread moves, a connection the peer closes): the
/// tests' one poll loop, always bounded by a deadline. Prefer awaiting an event (`AsyncStream.next(within:)`,
/// `DaemonProcess.waitForOutput`) where one exists.
public enum Poll {
    /// Whether `condition` held within `timeout`, checked every `interval`.
    public static func holds(
        within timeout: Duration = .seconds(10), every interval: Duration = .milliseconds(2),
        _ condition: () async throws -> Bool
    ) async rethrows -> Bool {
        let deadline = ContinuousClock.now + timeout
        while try await !condition() {
            guard ContinuousClock.now < deadline else { return false }
            // The wait between checks of a condition no event announces; bounded by `deadline` above.
            try? await Task.sleep(for: interval)
        }
        return true
    }

    /// Waits until `condition` holds; throws `PollTimeout` naming `what` when it did not within `timeout`.
    public static func until(
        _ what: String, within timeout: Duration = .seconds(10), every interval: Duration = .milliseconds(2),
        _ condition: () async throws -> Bool
    ) async throws {
        guard try await holds(within: timeout, every: interval, condition) else {
            throw PollTimeout(what: what, timeout: timeout)
        }
    }

    /// `holds` for a synchronous caller (a harness driven from a test's own thread): blocks that thread.
    public static func holdsBlocking(
        within timeout: Duration = .seconds(10), every interval: Duration = .milliseconds(1), _ condition: () -> Bool
    ) -> Bool {
        let deadline = ContinuousClock.now + timeout
        while !condition() {
            guard ContinuousClock.now < deadline else { return false }
            // A test's own thread (never an event loop), between checks; bounded by `deadline` above.
            Thread.sleep(forTimeInterval: interval.seconds)
        }
        return true
    }
}

/// A condition a test waited for did not hold in time.
public struct PollTimeout: Error, CustomStringConvertible {
    public let what: String
    public let timeout: Duration
    public var description: String { "timed out after \(timeout) waiting until \(what)" }
}
