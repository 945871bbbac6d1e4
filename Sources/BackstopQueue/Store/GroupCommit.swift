import SQLiteNIO
import Synchronization

/// Runs every operation of the queue store on its one SQLite connection, in batches: whatever arrived while the
/// previous batch was committing (the `fsync` is most of a commit) goes into the next transaction together, so
/// many enqueues share one `fsync` instead of paying one each (group commit).
///
/// Writes run inside the batch's `BEGIN IMMEDIATE … COMMIT` and their callers hear back only after `COMMIT`
/// returned, so an answer never reports something that a crash could still undo. Reads run before the
/// transaction, on committed data, and answer at once. A failed commit (a full disk) fails every write of the
/// batch; nothing of it is stored and the connection stays usable.
///
/// One caller at a time drains (leader and followers, no task of its own): the operation that arrives while nobody
/// drains runs the batch it is in, inside its caller's task; then it hands the draining on to the owner of the next
/// waiting operation, or stops when none waits. So statements of different operations never interleave on the
/// connection, and no unstructured task outlives its caller.
final class GroupCommit: Sendable {
    /// An operation's SQL work; throws only SQLite's errors (anything else would leave a batch half done).
    typealias Work = @Sendable (SQLiteConnection) async throws -> any Sendable

    private struct Operation {
        let writes: Bool
        let work: Work
        let finish: @Sendable (Result<any Sendable, any Error>) -> Void
        /// Tells the operation's caller to drain the next batch (its own operation is in it).
        let lead: @Sendable () -> Void
    }

    /// Where one caller's operation is, as its caller waits for it.
    private final class Slot: Sendable {
        enum Outcome {
            case done(Result<any Sendable, any Error>)
            /// Drain the next batch, then wait again.
            case lead
        }
        private enum State {
            case pending
            case waiting(CheckedContinuation<Outcome, Never>)
            case ready(Outcome)
        }
        private let state = Mutex(State.pending)

        func settle(_ outcome: Outcome) {
            let waiter = state.withLock { state -> CheckedContinuation<Outcome, Never>? in
                if case .waiting(let continuation) = state {
                    state = .pending
                    return continuation
                }
                state = .ready(outcome)
                return nil
            }
            waiter?.resume(returning: outcome)
        }

        func next() async -> Outcome {
            await withCheckedContinuation { continuation in
                let ready = state.withLock { state -> Outcome? in
                    if case .ready(let outcome) = state {
                        state = .pending
                        return outcome
                    }
                    state = .waiting(continuation)
                    return nil
                }
                if let ready { continuation.resume(returning: ready) }
            }
        }
    }

    /// What an arriving operation finds.
    private enum Arrival { case start, queued, refused }

    private struct State {
        var waiting: [Operation] = []
        var draining = false
        var closed = false
        /// Resumed when the loop stops after `close`.
        var drained: [CheckedContinuation<Void, Never>] = []
    }

    let connection: SQLiteConnection
    private let state = Mutex(State())

    init(connection: SQLiteConnection) {
        self.connection = connection
    }

    /// Runs `work` in the next batch; a write's result comes back once its batch is committed. `then` runs on the
    /// loop as soon as the work succeeded (for a write: committed), before any later operation: bookkeeping that
    /// must match the committed state exactly (the store's byte accounting).
    func perform<T: Sendable>(
        writes: Bool, _ work: @escaping @Sendable (SQLiteConnection) async throws -> T,
        then: (@Sendable (T) -> Void)? = nil
    ) async throws -> T {
        let slot = Slot()
        let operation = Operation(
            writes: writes, work: { try await work($0) },
            finish: { result in
                // The value came from `work`, which returns a T.
                if case .success(let value) = result { then?(value as! T) }
                slot.settle(.done(result))
            },
            lead: { slot.settle(.lead) })
        let arrival = state.withLock { s -> Arrival in
            if s.closed { return .refused }
            s.waiting.append(operation)
            if s.draining { return .queued }
            s.draining = true
            return .start
        }
        switch arrival {
        case .refused: throw QueueError.closed
        case .queued: break
        case .start: await drainBatch()
        }
        while true {
            switch await slot.next() {
            case .done(let result): return try result.get() as! T
            case .lead: await drainBatch()
            }
        }
    }

    /// Refuses new operations, lets the waiting ones finish, and returns when the loop has stopped.
    func close() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let idle = state.withLock { s -> Bool in
                s.closed = true
                if s.draining {
                    s.drained.append(continuation)
                    return false
                }
                return true
            }
            if idle { continuation.resume() }
        }
    }

    /// Runs what waits now as one batch, then hands the draining on to the next waiting operation's caller, or
    /// stops (and, once closed, lets `close` return).
    private func drainBatch() async {
        let batch = state.withLock { s -> [Operation] in
            defer { s.waiting.removeAll() }
            return s.waiting
        }
        await run(batch)
        let (next, waiters) = state.withLock { s -> (Operation?, [CheckedContinuation<Void, Never>]) in
            if let first = s.waiting.first { return (first, []) }
            s.draining = false
            guard s.closed else { return (nil, []) }
            defer { s.drained.removeAll() }
            return (nil, s.drained)
        }
        next?.lead()
        for waiter in waiters { waiter.resume() }
    }

    private func run(_ batch: [Operation]) async {
        for operation in batch where !operation.writes {
            do {
                operation.finish(.success(try await operation.work(connection)))
            } catch {
                operation.finish(.failure(error))
            }
        }
        let writes = batch.filter(\.writes)
        guard !writes.isEmpty else { return }
        var results: [any Sendable] = []
        results.reserveCapacity(writes.count)
        do {
            _ = try await connection.query("BEGIN IMMEDIATE")
            do {
                for operation in writes { results.append(try await operation.work(connection)) }
                _ = try await connection.query("COMMIT")
            } catch {
                // After SQLITE_FULL SQLite may already have rolled back; a second rollback then fails harmlessly.
                _ = try? await connection.query("ROLLBACK")
                throw error
            }
        } catch {
            for operation in writes { operation.finish(.failure(error)) }
            return
        }
        for (operation, result) in zip(writes, results) { operation.finish(.success(result)) }
    }
}
