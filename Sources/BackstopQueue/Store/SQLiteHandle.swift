// The SQLite library that sqlite-nio vendors (the same build, not a second copy): the queue store calls it
// synchronously on its commit thread (docs/performance.md#queued-delivery says why).
import VaporCSQLite

/// One SQLite connection, called synchronously: statements are prepared once and kept, and a whole group commit
/// (`BEGIN`, every operation of the batch, `COMMIT`) runs in one go on one thread, with no hop between threads per
/// statement. Owns the `sqlite3` handle and its prepared statements, and frees them on `deinit`.
///
/// Opened in SQLite's multi-thread mode (`SQLITE_OPEN_NOMUTEX`): a connection may move between threads but must
/// never be used by two at once.
final class SQLiteHandle: @unchecked Sendable {
    // @unchecked Sendable: the handle has mutable state (the connection and its statement cache) and no lock. It is
    // shared only through `GroupCommit`, which calls it from one drain job at a time (its `running` flag, set and
    // cleared under its mutex, orders one job's calls before the next's), and from `open`/`close`, which run when no
    // job can (before the store is returned; after `GroupCommit.close` waited for the last job). The checkpointer's
    // handle likewise: one copy at a time (`CheckpointSchedule.running`, under `Checkpointer`'s mutex), closed once
    // none runs. `walFrames` is written by SQLite's WAL hook during `COMMIT`, on the thread that commits.

    /// A value bound to or read from a statement.
    enum Value: Sendable, Equatable {
        case integer(Int)
        case text(String)
        case blob([UInt8])
        case real(Double)
        case null
    }

    /// A result row, its columns in the order the statement selects them.
    struct Row: Sendable {
        let values: [Value]

        func integer(_ column: Int) -> Int? {
            if case .integer(let value) = values[column] { return value }
            return nil
        }

        func text(_ column: Int) -> String? {
            if case .text(let value) = values[column] { return value }
            return nil
        }

        /// Nil when the column is not a blob (an edited row), so the caller can tell it from an empty blob.
        func blob(_ column: Int) -> [UInt8]? {
            if case .blob(let value) = values[column] { return value }
            return nil
        }
    }

    /// SQLite's extended result code and message.
    struct Failure: Error, CustomStringConvertible {
        let code: Int32
        let message: String
        /// The disk or the file's size limit is full: `SQLITE_FULL`, or `SQLITE_IOERR_SHMSIZE`, the shared-memory
        /// file that every connection in WAL mode maps (created again at each open) could not grow.
        var isFull: Bool { code & 0xff == SQLITE_FULL || code == Self.ioErrorShmSize }
        /// `SQLITE_IOERR_SHMSIZE`, a macro Swift does not import: `SQLITE_IOERR | (19 << 8)`.
        static let ioErrorShmSize = SQLITE_IOERR | (19 << 8)
        var description: String { "\(message) (SQLite code \(code))" }
    }

    private var connection: OpaquePointer?
    private var statements: [String: OpaquePointer] = [:]
    /// Statements kept at most; the store's are a dozen, so this bound is never reached in practice.
    private static let maxStatements = 64

    init(path: String) throws(Failure) {
        var connection: OpaquePointer?
        let flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_EXRESCODE
        let code = sqlite_nio_sqlite3_open_v2(path, &connection, flags, nil)
        guard code == SQLITE_OK else {
            let message = connection.map { String(cString: sqlite_nio_sqlite3_errmsg($0)) } ?? "cannot open"
            // A failed open still allocates a handle (unless out of memory), which must be closed.
            _ = sqlite_nio_sqlite3_close_v2(connection)
            throw Failure(code: code, message: message)
        }
        self.connection = connection
    }

    deinit { close() }

    /// Finalizes the statements and closes the connection (checkpointing the WAL when it is the last one).
    func close() {
        // `finalize` repeats the statement's last error, already thrown when it happened.
        for statement in statements.values { _ = sqlite_nio_sqlite3_finalize(statement) }
        statements = [:]
        // With every statement finalized, close_v2 closes at once; it fails only for a handle that is not one.
        _ = sqlite_nio_sqlite3_close_v2(connection)
        connection = nil
    }

    /// Runs `sql` (one statement) with `binds` and returns its rows. The statement is prepared once and kept.
    @discardableResult
    func query(_ sql: String, _ binds: [Value] = []) throws(Failure) -> [Row] {
        let statement = try prepared(sql)
        defer {
            // Ready for the next use, and no bound blob kept alive in SQLite. `reset` repeats the last step's
            // error, already thrown; `clear_bindings` always succeeds.
            _ = sqlite_nio_sqlite3_reset(statement)
            _ = sqlite_nio_sqlite3_clear_bindings(statement)
        }
        for (index, value) in binds.enumerated() {
            try check(bind(value, at: Int32(index + 1), in: statement))
        }
        var rows: [Row] = []
        while true {
            let code = sqlite_nio_sqlite3_step(statement)
            if code == SQLITE_DONE { return rows }
            guard code == SQLITE_ROW else { throw failure(code) }
            let count = sqlite_nio_sqlite3_column_count(statement)
            rows.append(Row(values: (0..<count).map { column(Int32($0), of: statement) }))
        }
    }

    /// Frames in the write-ahead log after this connection's last commit, once `reportCommits` is on (SQLite's WAL
    /// hook sets it during `COMMIT`, on the thread that commits).
    private(set) var walFrames = 0

    /// From now on SQLite no longer checkpoints at commit time on this connection (its default, 1,000 frames): each
    /// commit reports the WAL's size in `walFrames` instead, and `CheckpointSchedule` decides
    /// (docs/performance.md#queued-delivery).
    func reportCommits() {
        // Replaces the hook through which SQLite's automatic checkpoints run. `self` outlives the hook: it fires
        // only during a commit of this connection, which `close` (before `self` goes) ends.
        _ = sqlite_nio_sqlite3_wal_hook(
            connection,
            { context, _, _, frames in
                guard let context else { return SQLITE_OK }
                Unmanaged<SQLiteHandle>.fromOpaque(context).takeUnretainedValue().walFrames = Int(frames)
                return SQLITE_OK
            }, Unmanaged.passUnretained(self).toOpaque())
    }

    /// Copies what it can of the WAL into the database file without waiting for any reader or writer
    /// (`SQLITE_CHECKPOINT_PASSIVE`, with the `fsync`s `synchronous` asks for): the WAL's frames, and how many of them
    /// are now copied. Nil when this connection does not see the database in WAL mode (it has not read it yet).
    func checkpoint() throws(Failure) -> (walFrames: Int, copied: Int)? {
        var frames: Int32 = 0
        var copied: Int32 = 0
        try check(sqlite_nio_sqlite3_wal_checkpoint_v2(connection, nil, SQLITE_CHECKPOINT_PASSIVE, &frames, &copied))
        return frames < 0 ? nil : (Int(frames), Int(copied))
    }

    /// Runs `sql` without keeping a prepared statement (the schema, run once).
    func execute(_ sql: String) throws(Failure) {
        try check(sqlite_nio_sqlite3_exec(connection, sql, nil, nil, nil))
    }

    private func prepared(_ sql: String) throws(Failure) -> OpaquePointer {
        if let statement = statements[sql] { return statement }
        var statement: OpaquePointer?
        let code = sqlite_nio_sqlite3_prepare_v3(
            connection, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &statement, nil)
        guard code == SQLITE_OK, let statement else { throw failure(code) }
        if statements.count >= Self.maxStatements {
            for old in statements.values { _ = sqlite_nio_sqlite3_finalize(old) }
            statements = [:]
        }
        statements[sql] = statement
        return statement
    }

    private func bind(_ value: Value, at index: Int32, in statement: OpaquePointer) -> Int32 {
        switch value {
        case .integer(let value):
            return sqlite_nio_sqlite3_bind_int64(statement, index, Int64(value))
        case .text(let value):
            return sqlite_nio_sqlite3_bind_text64(
                statement, index, value, UInt64(value.utf8.count), transient, UInt8(SQLITE_UTF8))
        case .blob(let value):
            return value.withUnsafeBytes {
                // A zero-length blob needs a non-null pointer, or SQLite stores NULL.
                sqlite_nio_sqlite3_bind_blob64(
                    statement, index, $0.baseAddress ?? UnsafeRawPointer(bitPattern: 1), UInt64($0.count), transient)
            }
        case .real(let value):
            return sqlite_nio_sqlite3_bind_double(statement, index, value)
        case .null:
            return sqlite_nio_sqlite3_bind_null(statement, index)
        }
    }

    private func column(_ index: Int32, of statement: OpaquePointer) -> Value {
        switch sqlite_nio_sqlite3_column_type(statement, index) {
        case SQLITE_INTEGER:
            return .integer(Int(sqlite_nio_sqlite3_column_int64(statement, index)))
        case SQLITE_TEXT:
            guard let text = sqlite_nio_sqlite3_column_text(statement, index) else { return .text("") }
            return .text(String(cString: text))
        case SQLITE_BLOB:
            let count = Int(sqlite_nio_sqlite3_column_bytes(statement, index))
            guard count > 0, let bytes = sqlite_nio_sqlite3_column_blob(statement, index) else { return .blob([]) }
            return .blob(Array(UnsafeRawBufferPointer(start: bytes, count: count)))
        case SQLITE_FLOAT:
            return .real(sqlite_nio_sqlite3_column_double(statement, index))
        default:
            return .null
        }
    }

    private func check(_ code: Int32) throws(Failure) {
        guard code == SQLITE_OK else { throw failure(code) }
    }

    private func failure(_ code: Int32) -> Failure {
        let message = connection.map { String(cString: sqlite_nio_sqlite3_errmsg($0)) } ?? "closed"
        return Failure(code: code, message: message)
    }
}

/// SQLite copies a value bound with this destructor before the bind returns.
private let transient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)
