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
/// One loop drains the waiting operations at a time (started by the first arrival, ending when nothing waits), so
/// statements of different operations never interleave on the connection.
final class GroupCommit: Sendable {
    /// An operation's SQL work; throws only SQLite's errors (anything else would leave a batch half done).
    typealias Work = @Sendable (SQLiteConnection) async throws -> any Sendable

    private struct Operation {
        let writes: Bool
        let work: Work
        let finish: @Sendable (Result<any Sendable, any Error>) -> Void
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
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, any Error>) in
            let operation = Operation(writes: writes, work: { try await work($0) }) { result in
                // The value came from `work`, which returns a T.
                let typed = result.map { $0 as! T }
                if case .success(let value) = typed { then?(value) }
                continuation.resume(with: typed)
            }
            let next = state.withLock { s -> Arrival in
                if s.closed { return .refused }
                s.waiting.append(operation)
                if s.draining { return .queued }
                s.draining = true
                return .start
            }
            switch next {
            case .refused: continuation.resume(throwing: QueueError.closed)
            case .queued: break
            case .start: Task { await self.drain() }
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

    private func drain() async {
        while true {
            let batch = state.withLock { s -> [Operation] in
                let batch = s.waiting
                s.waiting.removeAll()
                if batch.isEmpty { s.draining = false }
                return batch
            }
            if batch.isEmpty { break }
            await run(batch)
        }
        let waiters = state.withLock { s -> [CheckedContinuation<Void, Never>] in
            // Another operation may have started a new loop after this one found nothing: only a loop that is
            // really the last one (closed and idle) hands the waiters back.
            guard s.closed, !s.draining else { return [] }
            defer { s.drained.removeAll() }
            return s.drained
        }
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
