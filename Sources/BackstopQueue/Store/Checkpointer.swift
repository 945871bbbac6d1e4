import NIOConcurrencyHelpers
import NIOPosix

/// Copies the queue store's write-ahead log into its database file on a connection and a thread of its own, so that
/// no group commit waits for a checkpoint (docs/performance.md#queued-delivery); `CheckpointSchedule` says when, and
/// when the writer must copy the last frames itself. Checkpoints change nothing a commit made durable: they copy
/// committed pages, and SQLite recovers from a crash in the middle of one.
final class Checkpointer: Sendable {
    private struct State {
        var schedule: CheckpointSchedule
        /// Resumed when the running copy ends after `close`.
        var drained: [CheckedContinuation<Void, Never>] = []
        /// Background copies run so far (for tests).
        var copies = 0
        /// Copies the writer made itself (for tests).
        var foregroundCopies = 0
    }

    /// Its own connection to the store's file: used by one copy at a time (the schedule's `running`), or by
    /// `close` once none runs.
    private let connection: SQLiteHandle
    private let threadPool: NIOThreadPool
    private let state: NIOLockedValueBox<State>

    /// `connection`: a second connection to the store's database; `threadPool`: one thread, started, shut down by
    /// the owner after `close`.
    init(connection: SQLiteHandle, threadPool: NIOThreadPool, schedule: CheckpointSchedule = CheckpointSchedule()) {
        self.connection = connection
        self.threadPool = threadPool
        self.state = NIOLockedValueBox(State(schedule: schedule))
    }

    /// Opens the database on the checkpointer's connection, once the store's schema is in place: a connection that
    /// has not read it does not know it is in WAL mode, and its checkpoints copy nothing.
    func start() throws(SQLiteHandle.Failure) {
        try connection.query("SELECT count(*) FROM sqlite_schema")
    }

    /// The writer committed and the WAL holds `walFrames` frames: starts a background copy when due. Returns true
    /// when the writer must copy the rest itself now (`copyOnWriter`), before its next batch.
    func committed(walFrames: Int) -> Bool {
        switch state.withLockedValue({ $0.schedule.committed(walFrames: walFrames) }) {
        case .none: return false
        case .background:
            startCopy()
            return false
        case .foreground: return true
        }
    }

    /// Copies what is left on the writer's connection (the caller's thread: the writer's).
    func copyOnWriter(_ writer: SQLiteHandle) {
        let result = (try? writer.checkpoint()) ?? nil
        state.withLockedValue {
            $0.foregroundCopies += 1
            $0.schedule.foregroundEnded(walFrames: result?.walFrames, copied: result?.copied)
        }
    }

    /// Background copies run so far, and copies the writer made itself (for tests).
    var copies: (background: Int, foreground: Int) { state.withLockedValue { ($0.copies, $0.foregroundCopies) } }

    /// Starts no copy any more, waits for the running one, and closes the connection.
    func close() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let idle = state.withLockedValue { s -> Bool in
                if s.schedule.close() { return true }
                s.drained.append(continuation)
                return false
            }
            if idle { continuation.resume() }
        }
        connection.close()
    }

    private func startCopy() {
        threadPool.submit { job in
            guard case .active = job else {
                self.ended(nil)
                return
            }
            // A failure (another process checkpointing: `SQLITE_BUSY`) leaves the WAL as it was; the schedule tries
            // again after the next commit.
            self.ended((try? self.connection.checkpoint()) ?? nil)
        }
    }

    private func ended(_ result: (walFrames: Int, copied: Int)?) {
        let (again, waiters) = state.withLockedValue { s -> (Bool, [CheckedContinuation<Void, Never>]) in
            s.copies += 1
            let again = s.schedule.backgroundEnded(walFrames: result?.walFrames, copied: result?.copied) == .background
            if again { return (true, []) }
            defer { s.drained.removeAll() }
            return (false, s.drained)
        }
        if again {
            startCopy()
            return
        }
        for waiter in waiters { waiter.resume() }
    }
}
