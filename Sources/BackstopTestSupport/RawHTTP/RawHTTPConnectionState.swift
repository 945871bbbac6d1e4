import NIOConcurrencyHelpers
import NIOCore

/// What the channel handlers have observed on a raw connection, and the tasks waiting on it.
///
/// Handlers report from the event loop; tests wait from any task. Each wait is a condition re-evaluated on every
/// change, so no one polls or sleeps.
final class RawHTTPConnectionState: Sendable {
    struct Snapshot {
        /// Heads of every response so far, in order (including the one in progress).
        var heads: [RawHTTPResponseHead] = []
        /// Complete responses not yet returned by `nextResponse`.
        var completed: [RawHTTPResponse] = []
        /// Complete responses handed out so far.
        var consumed = 0
        var completedTotal = 0
        var bodyBytesReceived = 0
        var isClosed = false
        var failure: RawHTTPError?
    }

    private struct Waiter {
        /// Returns the resumption to run (outside the lock) once the condition holds.
        let poll: @Sendable (inout Snapshot) -> (@Sendable () -> Void)?
        let fail: @Sendable (any Error) -> Void
    }

    private struct Inner {
        var snapshot = Snapshot()
        var waiters: [Int: Waiter] = [:]
        var nextWaiterID = 0
    }

    private let inner = NIOLockedValueBox(Inner())

    func read<T>(_ body: (Snapshot) -> T) -> T {
        inner.withLockedValue { body($0.snapshot) }
    }

    /// Applies a change from the channel and wakes every waiter whose condition now holds.
    func update(_ change: (inout Snapshot) -> Void) {
        let resumptions: [@Sendable () -> Void] = inner.withLockedValue { state in
            change(&state.snapshot)
            var ready: [@Sendable () -> Void] = []
            for (id, waiter) in state.waiters {
                if let resume = waiter.poll(&state.snapshot) {
                    state.waiters[id] = nil
                    ready.append(resume)
                }
            }
            return ready
        }
        resumptions.forEach { $0() }
    }

    /// Suspends until `condition` yields a result, the timeout passes, or the task is cancelled.
    func wait<T: Sendable>(
        timeout: Duration,
        on eventLoop: any EventLoop,
        for what: String,
        _ condition: @escaping @Sendable (inout Snapshot) -> Result<T, RawHTTPError>?
    ) async throws -> T {
        let id = inner.withLockedValue { state in
            defer { state.nextWaiterID += 1 }
            return state.nextWaiterID
        }
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, any Error>) in
                register(id: id, timeout: timeout, on: eventLoop, for: what, condition, continuation)
            }
        } onCancel: {
            self.failWaiter(id, with: CancellationError())
        }
    }

    private func register<T: Sendable>(
        id: Int,
        timeout: Duration,
        on eventLoop: any EventLoop,
        for what: String,
        _ condition: @escaping @Sendable (inout Snapshot) -> Result<T, RawHTTPError>?,
        _ continuation: CheckedContinuation<T, any Error>
    ) {
        let poll: @Sendable (inout Snapshot) -> (@Sendable () -> Void)? = { snapshot in
            guard let result = condition(&snapshot) else { return nil }
            return { continuation.resume(with: result) }
        }
        let fail: @Sendable (any Error) -> Void = { error in continuation.resume(throwing: error) }
        let immediate: Result<T, RawHTTPError>? = inner.withLockedValue { state in
            if let result = condition(&state.snapshot) {
                return result
            }
            state.waiters[id] = Waiter(poll: poll, fail: fail)
            return nil
        }
        if let immediate {
            continuation.resume(with: immediate)
            return
        }
        let timeoutError = RawHTTPError.timeout(timeout, waitingFor: what)
        eventLoop.scheduleTask(in: timeout.timeAmount) {
            self.failWaiter(id, with: timeoutError)
        }
    }

    private func failWaiter(_ id: Int, with error: any Error) {
        let waiter = inner.withLockedValue { $0.waiters.removeValue(forKey: id) }
        waiter?.fail(error)
    }
}
