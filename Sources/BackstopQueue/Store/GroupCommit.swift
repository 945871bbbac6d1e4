import NIOConcurrencyHelpers
import NIOPosix

/// Runs every operation of the queue store on its one SQLite connection, in batches: whatever arrived while the
/// previous batch was committing (the `fsync` is most of a commit) goes into the next transaction together, so
/// many enqueues share one `fsync` instead of paying one each (group commit).
///
/// Writes run inside the batch's `BEGIN IMMEDIATE … COMMIT` and their callers hear back only after `COMMIT`
/// returned, so an answer never reports something that a crash could still undo. Reads run before the
/// transaction, on committed data, and answer at once. When a batch of several writes fails (a full disk), each is
/// run again alone, so only the writes that do not fit fail; nothing of a failed write is stored and the connection
/// stays usable.
///
/// A batch runs synchronously on the store's own thread (one job of its one-thread pool), every statement in one
/// go: a caller's task waits once for its operation, however many statements the batch holds
/// (docs/performance.md#queued-delivery). One job at a time drains: the operation that arrives while none runs
/// starts one, and the job takes batch after batch until nothing waits.
final class GroupCommit: Sendable {
    /// An operation's SQL work; throws only SQLite's errors (anything else would leave a batch half done). A write's
    /// work may run a second time after its batch was rolled back, so it only reads and writes the database (what
    /// must follow its commit goes in `then`).
    typealias Work = @Sendable (SQLiteHandle) throws -> any Sendable

    private struct Operation {
        let writes: Bool
        let work: Work
        /// Runs on the store's thread once the work succeeded (for a write: committed) or failed; resumes the caller.
        let finish: @Sendable (Result<any Sendable, any Error>) -> Void
    }

    private struct State {
        var waiting: [Operation] = []
        var running = false
        var closed = false
        /// Resumed when the running job stops after `close`.
        var drained: [CheckedContinuation<Void, Never>] = []
        /// Transactions committed so far.
        var commits = 0
    }

    let database: SQLiteHandle
    private let threadPool: NIOThreadPool
    /// Copies the WAL into the database file off this thread; nil: SQLite does so at commit time, as by default.
    let checkpointer: Checkpointer?
    private let state = NIOLockedValueBox(State())

    /// `threadPool`: one thread, the store's; started, and shut down by the owner after `close`. `checkpointer`:
    /// `database` reports its commits (`SQLiteHandle.reportCommits`) and no longer checkpoints by itself.
    init(database: SQLiteHandle, threadPool: NIOThreadPool, checkpointer: Checkpointer? = nil) {
        self.database = database
        self.threadPool = threadPool
        self.checkpointer = checkpointer
    }

    /// Runs `work` in the next batch; a write's result comes back once its batch is committed. `then` runs as soon
    /// as the work succeeded (for a write: committed), before any later operation: bookkeeping that must match the
    /// committed state exactly (the store's byte accounting).
    func perform<T: Sendable>(
        writes: Bool, _ work: @escaping @Sendable (SQLiteHandle) throws -> T,
        then: (@Sendable (T) -> Void)? = nil
    ) async throws -> T {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, any Error>) in
            submit(writes: writes, work, then: then) { continuation.resume(with: $0) }
        }
    }

    /// `perform` without a task: `finish` gets the result on the store's thread once the work succeeded (for a
    /// write: committed) or failed, with no hop through the cooperative pool in between
    /// (docs/performance.md#queued-delivery). `finish` must be short: the next batch waits for it.
    func submit<T: Sendable>(
        writes: Bool, _ work: @escaping @Sendable (SQLiteHandle) throws -> T,
        then: (@Sendable (T) -> Void)? = nil, finish: @escaping @Sendable (Result<T, any Error>) -> Void
    ) {
        let operation = Operation(
            writes: writes, work: { try work($0) },
            finish: { result in
                switch result {
                case .success(let value):
                    // The value came from `work`, which returns a T.
                    let value = value as! T
                    then?(value)
                    finish(.success(value))
                case .failure(let error):
                    finish(.failure(error))
                }
            })
        let start = state.withLockedValue { s -> Bool? in
            if s.closed { return nil }
            s.waiting.append(operation)
            if s.running { return false }
            s.running = true
            return true
        }
        switch start {
        case nil: finish(.failure(QueueError.closed))
        case true?: threadPool.submit { self.drain($0) }
        case false?: break
        }
    }

    /// Transactions committed so far (for tests: how many writes shared a commit).
    var commits: Int { state.withLockedValue { $0.commits } }

    /// Operations waiting for the next batch (for tests).
    var waitingCount: Int { state.withLockedValue { $0.waiting.count } }

    /// Refuses new operations, lets the waiting ones finish, and returns when the running job has stopped.
    func close() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let idle = state.withLockedValue { s -> Bool in
                s.closed = true
                if s.running {
                    s.drained.append(continuation)
                    return false
                }
                return true
            }
            if idle { continuation.resume() }
        }
    }

    /// Takes batch after batch until nothing waits; then stops (and, once closed, lets `close` return).
    private func drain(_ job: NIOThreadPool.WorkItemState) {
        while true {
            let (batch, waiters) = state.withLockedValue { s -> ([Operation], [CheckedContinuation<Void, Never>]) in
                if !s.waiting.isEmpty {
                    defer { s.waiting.removeAll(keepingCapacity: true) }
                    return (s.waiting, [])
                }
                s.running = false
                defer { s.drained.removeAll() }
                return ([], s.drained)
            }
            guard !batch.isEmpty else {
                for waiter in waiters { waiter.resume() }
                return
            }
            guard case .active = job else {
                // The pool was shut down under a waiting operation (the owner closes only after `close`).
                for operation in batch { operation.finish(.failure(QueueError.closed)) }
                continue
            }
            run(batch)
        }
    }

    private func run(_ batch: [Operation]) {
        for operation in batch where !operation.writes {
            operation.finish(Result { try operation.work(database) })
        }
        let writes = batch.filter(\.writes)
        guard !writes.isEmpty else { return }
        var committed = false
        switch commit(writes) {
        case .success(let results):
            committed = true
            for (operation, result) in zip(writes, results) { operation.finish(.success(result)) }
        case .failure(let error) where writes.count == 1:
            writes[0].finish(.failure(error))
        case .failure:
            // One write that does not fit (a large request on a full disk) must not fail the small ones beside it
            // (a claim, an outcome): each goes again in a transaction of its own, and fails only for itself.
            for operation in writes {
                switch commit([operation]) {
                case .success(let results):
                    committed = true
                    operation.finish(.success(results[0]))
                case .failure(let error): operation.finish(.failure(error))
                }
            }
        }
        // After the callers were answered: a copy the writer must make itself delays the next batch, not this one.
        if committed, let checkpointer, checkpointer.committed(walFrames: database.walFrames) {
            checkpointer.copyOnWriter(database)
        }
    }

    /// Runs `writes` in one transaction: their results once committed, or the first error (nothing of them kept).
    private func commit(_ writes: [Operation]) -> Result<[any Sendable], any Error> {
        var results: [any Sendable] = []
        results.reserveCapacity(writes.count)
        do {
            try database.query("BEGIN IMMEDIATE")
            do {
                for operation in writes { results.append(try operation.work(database)) }
                try database.query("COMMIT")
                state.withLockedValue { $0.commits += 1 }
            } catch {
                // After SQLITE_FULL SQLite may already have rolled back; a second rollback then fails harmlessly.
                _ = try? database.query("ROLLBACK")
                throw error
            }
        } catch {
            return .failure(error)
        }
        return .success(results)
    }
}
