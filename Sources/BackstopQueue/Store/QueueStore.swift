import BackstopCore
import BackstopKeychain
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// The durable queue of deliveries (docs/reference/behaviour.md#queued-delivery): SQLite in WAL mode with
/// `synchronous=FULL` in `spool.dir`, one row per accepted request.
///
/// A row's method, target and headers (`head`) and its body are sealed separately under the keychain key
/// (`RecordSealer`, AES-256-GCM), each bound to the row's id, upstream and acceptance time: a row edited, swapped
/// with another or cut short does not open, and is set aside as a dead letter (`damaged`) instead of being sent.
/// What stays readable is what `deliveries list` needs besides method and path: id, upstream, times, attempts,
/// last outcome.
///
/// `enqueue` returns only once the row is committed (the WAL `fsync`ed); concurrent enqueues share commits
/// (`GroupCommit`). Stored bytes are counted in the `SpoolBudget` shared with spooled bodies. Deliveries in flight
/// are tracked in memory only: after a crash they are simply queued again (at least once).
public final class QueueStore: Sendable {
    /// The database file in `spool.dir`.
    public static let fileName = "queue.db"
    /// Bytes a row costs in the budget besides its sealed parts (id, upstream, times, index entries).
    static let rowOverhead = 128

    public let path: String
    /// Internal for tests: they look at its commits.
    let database: GroupCommit
    private let threadPool: NIOThreadPool
    /// The checkpointer's thread (`Checkpointer`).
    private let checkpointThread: NIOThreadPool
    private let sealer: RecordSealer
    private let budget: SpoolBudget
    private let clock: any BackstopClock
    private let newID: @Sendable () -> DeliveryID
    /// `queue.db` itself, locked (`flock`, which SQLite's own POSIX locks do not touch) while the owning store is
    /// open: a second daemon on the same spool is refused instead of delivering the same rows. The database is
    /// locked rather than a file of its own, which a cleanup job could remove while it is empty and held. Released
    /// only after SQLite closed the file: closing any descriptor of a file drops the process's POSIX locks on it.
    private let ownerLock: FileLock?
    /// Stored bytes currently reserved in `budget` for committed rows.
    private let accounted = NIOLockedValueBox(0)
    /// Room kept on the spool's filesystem for the writes that free room (`SpoolReserve`).
    private let reserve: SpoolReserve
    /// Rows claimed and not yet settled.
    private let claims = NIOLockedValueBox(ClaimTable())

    private init(
        path: String, database: GroupCommit, threadPool: NIOThreadPool, checkpointThread: NIOThreadPool,
        sealer: RecordSealer, budget: SpoolBudget, clock: any BackstopClock,
        newID: @escaping @Sendable () -> DeliveryID, ownerLock: FileLock?, reserve: SpoolReserve
    ) {
        self.path = path
        self.database = database
        self.threadPool = threadPool
        self.checkpointThread = checkpointThread
        self.sealer = sealer
        self.budget = budget
        self.clock = clock
        self.newID = newID
        self.ownerLock = ownerLock
        self.reserve = reserve
    }

    /// Opens (creating when missing, with mode 0700 for the directory and 0600 for the files) the store in
    /// `directory`. `owner`: this process delivers from it (the daemon); a second owner is refused while the first
    /// runs. Commands that only list, retry or drop (`backstop deliveries`) open it without owning it.
    public static func open(
        directory: String, key: KeychainKey, budget: SpoolBudget, owner: Bool, clock: any BackstopClock = SystemClock(),
        newID: (@Sendable () -> DeliveryID)? = nil
    ) async throws(QueueError) -> QueueStore {
        let path = directory + "/" + fileName
        try createDirectory(directory)
        if let problem = directoryTrustProblem(directory) {
            throw .storage(path: directory, detail: "spool.dir is \(problem)")
        }
        let ownerLock = owner ? try lockOwnership(path) : nil
        try createPrivately(path)
        for suffix in ["-wal", "-shm"] { try keepPrivate(path + suffix) }
        try keepPrivate(directory + "/" + SpoolReserve.fileName)
        let reserve = try SpoolReserve(directory: directory)
        let schedule = reserve.checkpointSchedule
        let openConnections = { () throws(SQLiteHandle.Failure) -> (SQLiteHandle, SQLiteHandle) in
            let connection = try SQLiteHandle(path: path)
            let copier = try SQLiteHandle(path: path)
            // A checkpoint `fsync`s the WAL before it copies and the database file after (as the writer's would).
            // Its first statement maps the shared-memory file, which must grow: a disk someone else filled refuses.
            try copier.execute("PRAGMA synchronous = FULL")
            return (connection, copier)
        }
        let connection: SQLiteHandle
        let copier: SQLiteHandle
        do {
            (connection, copier) = try openConnections()
        } catch let error where error.isFull && reserve.release() {
            // The reserve is what lets a queue on a full disk open: its deliveries are what frees the disk.
            do {
                (connection, copier) = try openConnections()
            } catch {
                throw Self.map(error, path: path)
            }
        } catch {
            throw Self.map(error, path: path)
        }
        // The store's one thread: every batch of statements runs on it (`GroupCommit`); and the checkpointer's.
        let threadPool = NIOThreadPool(numberOfThreads: 1)
        threadPool.start()
        let checkpointThread = NIOThreadPool(numberOfThreads: 1)
        checkpointThread.start()
        let checkpointer = Checkpointer(connection: copier, threadPool: checkpointThread, schedule: schedule)
        let store = QueueStore(
            path: path,
            database: GroupCommit(database: connection, threadPool: threadPool, checkpointer: checkpointer),
            threadPool: threadPool, checkpointThread: checkpointThread,
            sealer: RecordSealer(keychainKey: key), budget: budget, clock: clock,
            newID: newID ?? {
                // Time-ordered: the id index grows at its end (`DeliveryID`).
                DeliveryID(unixMillis: Int64(clamping: Self.micros(clock.wall()) / 1000))
            }, ownerLock: ownerLock, reserve: reserve)
        do throws(QueueError) {
            try await store.run(writes: false, { try store.prepare($0) }, freesRoom: true)
            do {
                try checkpointer.start()
            } catch {
                throw Self.map(error, path: path)
            }
        } catch {
            await store.close()
            throw error
        }
        return store
    }

    /// Waits for operations under way, then closes the database. Deliveries still claimed stay queued.
    public func close() async {
        await database.close()
        // No batch runs any more (`GroupCommit.close` waited for the last), and then no copy: the writer's
        // connection, closed last, copies what is left and removes the WAL.
        await database.checkpointer?.close()
        database.database.close()
        ownerLock?.release()
        try? await threadPool.shutdownGracefully()
        try? await checkpointThread.shutdownGracefully()
        let held = accounted.withLockedValue { value in
            defer { value = 0 }
            return value
        }
        if held > 0 { budget.release(held) }
    }

    private func prepare(_ connection: SQLiteHandle) throws {
        let mode = try connection.query("PRAGMA journal_mode = WAL").first?.text(0)
        guard mode == "wal" else {
            throw QueueError.storage(path: path, detail: "the filesystem does not support SQLite's WAL mode")
        }
        for statement in Schema.open { try connection.execute(statement) }
        if database.checkpointer != nil { connection.reportCommits() }
        // Repairs, each a write: a full disk must not keep the queue from opening (its deliveries are what frees
        // the disk), so they wait for the next open then.
        do {
            for statement in Schema.recount { try connection.execute(statement) }
            try setAsideUnreadableRows(connection)
        } catch let error as SQLiteHandle.Failure where error.isFull {
            _ = try? connection.execute("ROLLBACK")
        }
        try reconcile(connection)
    }

    /// Rows whose id or times do not read (an edited row), in any state, become `damaged` dead letters with an id
    /// and times that read, so `backstop deliveries list --dead` shows them and `drop` can remove them (and give
    /// their bytes back). Once when the store opens; `claim` does the same for a row edited while it is open.
    private func setAsideUnreadableRows(_ connection: SQLiteHandle) throws {
        let rows = try connection.query(
            "SELECT seq, id, typeof(accepted_at) = 'integer' AND typeof(clock_start) = 'integer' "
                + "AND typeof(attempts) = 'integer' AND typeof(next_at) = 'integer' FROM deliveries")
        let now = Self.micros(clock.wall())
        for row in rows {
            guard let seq = row.integer(0) else { continue }
            let id = row.text(1).flatMap(DeliveryID.init)
            guard id == nil || row.integer(2) != 1 else { continue }
            try markDamaged(connection, seq: seq, id: id ?? newID(), now: now)
        }
    }

    /// Makes row `seq` a `damaged` dead letter named `id`, any time or count that does not read replaced by `now`
    /// (or no attempts).
    private func markDamaged(_ connection: SQLiteHandle, seq: Int, id: DeliveryID, now: Int) throws {
        try connection.query(
            "UPDATE deliveries SET state = 1, last_outcome = 'damaged', id = ?, "
                + "accepted_at = CASE WHEN typeof(accepted_at) = 'integer' THEN accepted_at ELSE ? END, "
                + "clock_start = CASE WHEN typeof(clock_start) = 'integer' THEN clock_start ELSE ? END, "
                + "next_at = CASE WHEN typeof(next_at) = 'integer' THEN next_at ELSE ? END, "
                + "attempts = CASE WHEN typeof(attempts) = 'integer' THEN attempts ELSE 0 END WHERE seq = ?",
            [.text(id.text), .integer(now), .integer(now), .integer(now), .integer(seq)])
    }

    // MARK: accepting

    /// Stores `request` for delivery to `upstream` and returns its id once the row is durable. Throws
    /// `budgetExhausted` or `diskFull` (507 `spool-full`) when it cannot be stored; nothing is kept then.
    public func enqueue(upstream: String, _ request: QueuedRequest) async throws(QueueError) -> DeliveryID {
        let result = await withCheckedContinuation { continuation in
            enqueue(upstream: upstream, request) { continuation.resume(returning: $0) }
        }
        return try result.get()
    }

    /// `enqueue` without a task, for a caller on an event loop: the request is sealed on the caller's thread and
    /// `completion` runs on the store's thread once the row is committed (or could not be), so an accept costs two
    /// thread hops (to the store's thread and back) instead of four through the cooperative pool, whose threads the
    /// deliveries keep busy (docs/performance.md#queued-delivery). `completion` must be short.
    public func enqueue(
        upstream: String, _ request: QueuedRequest,
        completion: @escaping @Sendable (Result<DeliveryID, QueueError>) -> Void
    ) {
        let id = newID()
        let acceptedAt = Self.micros(clock.wall())
        let context = Context(id: id, upstream: upstream, acceptedAt: acceptedAt)
        let head = sealer.seal(QueuedRequestCodec.encodeHead(request), context: context.head)
        let body = sealer.seal(request.body, context: context.body)
        let size = head.count + body.count + Self.rowOverhead
        let path = self.path
        let insert: @Sendable () -> Void = {
            // Once committed, the reservation is the row's share of the budget (`accounted`) until it is deleted.
            self.database.submit(
                writes: true,
                { connection in
                    try connection.query(
                        "INSERT INTO deliveries (id, upstream, accepted_at, clock_start, next_at, head, body, size) "
                            + "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        [
                            .text(id.text), .text(upstream), .integer(acceptedAt), .integer(acceptedAt),
                            .integer(acceptedAt), .blob(head), .blob(body), .integer(size),
                        ])
                }, then: { _ in self.accounted.withLockedValue { $0 += size } },
                finish: { result in
                    switch result {
                    case .success: completion(.success(id))
                    case .failure(let error):
                        self.budget.release(size)
                        completion(.failure(Self.map(error, path: path)))
                    }
                })
        }
        let admit: @Sendable () -> Void = {
            // A database removed (or replaced) while running would take the request and lose it at the next start:
            // a `202` is only given for a row the spool will still hold (docs/reference/behaviour.md#queued-delivery).
            if self.ownerLock?.isUnlinked == true { return completion(.failure(.removed(path: path))) }
            if self.budget.reserve(size) {
                insert()
                return
            }
            // Rows an operator dropped from another process free their bytes only once this process looks again.
            self.database.submit(writes: false, { try self.reconcile($0) }) { result in
                switch result {
                case .failure(let error): completion(.failure(Self.map(error, path: path)))
                case .success:
                    guard self.budget.reserve(size) else { return completion(.failure(.budgetExhausted)) }
                    insert()
                }
            }
        }
        // Taken only while the reserve is whole: a queue that filled the disk could record no outcome.
        if reserve.ensure() {
            admit()
            return
        }
        // The reserve was let go (a full disk). The WAL keeps its blocks after a checkpoint for reuse; copied and
        // cut to nothing, it gives them back, and the reserve may fit again. Until it does, nothing is taken: the
        // room it would have kept is what the queue's own outcomes need.
        database.submit(
            writes: false,
            { connection -> Bool in
                _ = try? connection.query("PRAGMA wal_checkpoint(TRUNCATE)")
                return self.reserve.ensure()
            }
        ) { result in
            guard case .success(true) = result else { return completion(.failure(.diskFull)) }
            admit()
        }
    }

    // MARK: delivering

    /// Takes up to `concurrency` minus those already in flight of `upstream`'s due deliveries, oldest first, and
    /// turns into dead letters those whose `max_age` (from `policy`) ran out and those that do not open.
    /// `memory`: the bytes the claimed deliveries may take in memory together (each is opened whole), by their stored
    /// size, which is at least their body's; the oldest due is taken even when larger if `atLeastOne`, so a lane
    /// with nothing in flight always makes progress. Nil: no bound.
    public func claim(
        upstream: String, concurrency: Int, policy: DeliveryPolicy, memory: Int? = nil, atLeastOne: Bool = true
    ) async throws(QueueError) -> ClaimBatch {
        let now = Self.micros(clock.wall())
        let expiredBefore = now - Self.micros(policy.maxAge.seconds)
        let (rows, unreadable, expired) = try await run(
            writes: true,
            { connection -> ([Row], [(seq: Int, id: DeliveryID?)], [DeliveryID]) in
                let (busy, sending) = self.claims.withLockedValue {
                    ($0.held(upstream, at: Self.seconds(now)), $0.sendingCount(upstream))
                }
                // One statement text whatever is in flight, so it is prepared once.
                let busyList = SQLiteHandle.Value.text(Self.jsonArray(busy))
                let expired = try connection.query(
                    "UPDATE deliveries SET state = 1, last_outcome = CASE WHEN last_outcome IS NULL THEN 'expired' "
                        + "ELSE 'expired (last: ' || last_outcome || ')' END "
                        + "WHERE upstream = ? AND state = 0 AND clock_start <= ? "
                        + "AND seq NOT IN (SELECT value FROM json_each(?)) RETURNING id",
                    [.text(upstream), .integer(expiredBefore), busyList]
                ).compactMap { $0.text(0).flatMap(DeliveryID.init) }
                let available = concurrency - sending
                guard available > 0 else { return ([], [], expired) }
                // Walked in `seq` order, stopping at the LIMIT: left to itself SQLite reads every due row through
                // `deliveries_due` and sorts them, 18 ms a claim with 20,000 queued, on the thread every commit
                // waits for (docs/performance.md#queued-delivery).
                // A row whose columns do not read (an edited id or time) is set aside as damaged below: skipped,
                // it would stay first in line and take a slot of every claim, with one slot all of them.
                // The rows that fit `memory` are chosen by their sizes first: reading the sealed parts of every free
                // slot's row, before knowing which fit, would itself hold them all.
                var chosen: [Int] = []
                var bytes = 0
                for raw in try connection.query(
                    "SELECT seq, size FROM deliveries "
                        + "INDEXED BY deliveries_order WHERE upstream = ? AND state = 0 AND next_at <= ? "
                        + "AND seq NOT IN (SELECT value FROM json_each(?)) ORDER BY seq LIMIT ?",
                    [.text(upstream), .integer(now), busyList, .integer(available)])
                {
                    guard let seq = raw.integer(0) else { continue }
                    let size = max(0, raw.integer(1) ?? 0)
                    if let memory, bytes + size > memory, !(chosen.isEmpty && atLeastOne) { break }
                    chosen.append(seq)
                    bytes += size
                }
                guard !chosen.isEmpty else { return ([], [], expired) }
                var rows: [Row] = []
                var unreadable: [(seq: Int, id: DeliveryID?)] = []
                for raw in try connection.query(
                    "SELECT seq, id, accepted_at, clock_start, attempts, head, body FROM deliveries "
                        + "WHERE seq IN (SELECT value FROM json_each(?)) ORDER BY seq",
                    [.text(Self.jsonArray(Set(chosen)))])
                {
                    if let row = Row(raw) {
                        rows.append(row)
                    } else if let seq = raw.integer(0) {
                        unreadable.append((seq, raw.text(1).flatMap(DeliveryID.init)))
                    }
                }
                return (rows, unreadable, expired)
            },
            // Held only once the claim committed: a batch that fails (another write in it did not fit a full disk)
            // claims nothing, instead of leaving rows held that no delivery will ever settle.
            then: { claimed in self.claims.withLockedValue { $0.claimed(upstream, claimed.0.map(\.seq)) } })
        // One whose id does not read gets a new one, by which it is logged, listed and dropped.
        var damagedRows = unreadable.map { (seq: $0.seq, id: $0.id ?? newID()) }
        var batch = ClaimBatch(expired: expired.sorted(), damaged: damagedRows.map(\.id))
        for row in rows {
            let context = Context(id: row.id, upstream: upstream, acceptedAt: row.acceptedAt)
            guard let headBytes = sealer.open(row.head, context: context.head),
                let head = QueuedRequestCodec.decodeHead(headBytes),
                let body = sealer.open(row.body, context: context.body)
            else {
                batch.damaged.append(row.id)
                damagedRows.append((row.seq, row.id))
                continue
            }
            batch.deliveries.append(
                ClaimedDelivery(
                    id: row.id, upstream: upstream,
                    request: QueuedRequest(method: head.method, target: head.target, headers: head.headers, body: body),
                    attempts: row.attempts, acceptedAt: Self.seconds(row.acceptedAt),
                    clockStart: Self.seconds(row.clockStart),
                    seq: row.seq))
        }
        if !damagedRows.isEmpty {
            let damaged = damagedRows
            defer { release(upstream: upstream, damaged.map(\.seq)) }
            do throws(QueueError) {
                try await run(writes: true) { connection in
                    for row in damaged { try self.markDamaged(connection, seq: row.seq, id: row.id, now: now) }
                }
            } catch {
                // Nothing of the batch is handed out, so the rows it took are given back, as by a claim that failed:
                // held, they would take their slots for good with no delivery to settle them.
                release(upstream: upstream, batch.deliveries.map(\.seq))
                throw error
            }
        }
        return batch
    }

    /// Records how a claimed delivery's try ended (`DeliveryPolicy.decide`) and ends its claim: delivered ones are
    /// deleted, others rescheduled or made dead letters. When it throws (a full disk), the delivery stays held
    /// without taking a slot: one delivered or dead is not sent again while the caller tries to record the outcome
    /// later (`unclaim` gives it up); one to be tried again is claimable from the time the decision named.
    public func settle(_ delivery: ClaimedDelivery, _ decision: DeliveryDecision) async throws(QueueError) {
        let seq = SQLiteHandle.Value.integer(delivery.seq)
        do {
            try await settleRow(seq, decision)
        } catch {
            claims.withLockedValue { claims in
                if case .retry(let at, _) = decision {
                    // In whole microseconds, as a recorded retry's `next_at` and the claim's clock: `nextDue` then
                    // never calls due a row the claim still skips (a lane told so and given nothing waits for a
                    // wake-up that may never come).
                    claims.retryUnrecorded(delivery.upstream, delivery.seq, until: Self.seconds(Self.micros(at)))
                } else {
                    claims.settleFailed(delivery.upstream, delivery.seq)
                }
            }
            throw error
        }
        release(upstream: delivery.upstream, [delivery.seq])
    }

    private func settleRow(_ seq: SQLiteHandle.Value, _ decision: DeliveryDecision) async throws(QueueError) {
        try await run(
            writes: true,
            { connection -> Int in
                switch decision {
                case .delivered:
                    return try connection.query("DELETE FROM deliveries WHERE seq = ? RETURNING size", [seq])
                        .compactMap { $0.integer(0) }.reduce(0, +)
                case .retry(let at, let outcome):
                    try connection.query(
                        "UPDATE deliveries SET attempts = attempts + 1, next_at = ?, last_outcome = ? WHERE seq = ?",
                        [.integer(Self.micros(at)), .text(outcome), seq])
                    return 0
                case .dead(let outcome):
                    try connection.query(
                        "UPDATE deliveries SET attempts = attempts + 1, state = 1, last_outcome = ? WHERE seq = ?",
                        [.text(outcome), seq])
                    return 0
                }
            }, then: { self.freed($0) }, freesRoom: decision == .delivered)
    }

    /// How many deliveries are queued per upstream not in `upstreams` (the ones with `delivery: queue` now): no
    /// deliverer claims them until their upstream is queued again (they wait, kept as the `202` promised). Read from
    /// the counts the triggers keep, not the rows.
    public func queuedDeliveries(notFor upstreams: Set<String>) async throws(QueueError) -> [String: Int] {
        try await run(writes: false) { connection in
            var waiting: [String: Int] = [:]
            for row in try connection.query("SELECT upstream, n FROM counts WHERE state = 0 AND n > 0") {
                guard let upstream = row.text(0), let count = row.integer(1), !upstreams.contains(upstream) else {
                    continue
                }
                waiting[upstream] = count
            }
            return waiting
        }
    }

    /// Gives back the budget of rows this process deleted (`then` of a delete: runs as it commits).
    private func freed(_ bytes: Int) {
        // Never more than the rows' share: a size edited while the store is open is not believed.
        let given = accounted.withLockedValue { held in
            let given = Swift.max(0, Swift.min(bytes, held))
            held -= given
            return given
        }
        if given > 0 { budget.release(given) }
    }

    /// Gives a claimed delivery back (the deliverer is stopping; or it gives up recording an outcome): queued as the
    /// store last recorded it.
    public func unclaim(_ delivery: ClaimedDelivery) {
        release(upstream: delivery.upstream, [delivery.seq])
    }

    /// When `upstream`'s next queued delivery that is not in flight is due (wall-clock seconds), nil when none is.
    public func nextDue(upstream: String) async throws(QueueError) -> Double? {
        let (held, deferredUntil) = claims.withLockedValue { $0.allHeld(upstream) }
        let busyList = SQLiteHandle.Value.text(Self.jsonArray(held))
        let stored = try await run(writes: false) { connection in
            try connection.query(
                "SELECT next_at FROM deliveries WHERE upstream = ? AND state = 0 "
                    + "AND seq NOT IN (SELECT value FROM json_each(?)) ORDER BY next_at LIMIT 1",
                [.text(upstream), busyList]
            ).first?.integer(0)
        }
        return [stored.map { Self.seconds($0) }, deferredUntil].compactMap { $0 }.min()
    }

    private func release(upstream: String, _ seqs: [Int]) {
        claims.withLockedValue { $0.release(upstream, seqs) }
    }

    // MARK: operating

    /// Queued or dead deliveries, oldest first: id, upstream, method and path (opened from the sealed head; no query,
    /// no header value, no body), times, attempts and last outcome.
    public func list(_ state: DeliveryState) async throws(QueueError) -> [DeliverySummary] {
        let rows = try await run(writes: false) { connection in
            try connection.query(
                "SELECT id, upstream, accepted_at, attempts, last_outcome, next_at, head FROM deliveries "
                    + "WHERE state = ? ORDER BY seq", [.integer(state.rawValue)])
        }
        return rows.compactMap { row -> DeliverySummary? in
            guard let id = row.text(0).flatMap(DeliveryID.init), let upstream = row.text(1),
                let acceptedAt = row.integer(2), let attempts = row.integer(3), let nextAt = row.integer(5)
            else { return nil }
            let context = Context(id: id, upstream: upstream, acceptedAt: acceptedAt)
            let head = row.blob(6).flatMap { sealer.open($0, context: context.head) }
                .flatMap(QueuedRequestCodec.decodeHead)
            return DeliverySummary(
                id: id, upstream: upstream, method: head?.method,
                path: head.map { QueuedRequest(method: $0.method, target: $0.target, headers: [], body: []).path },
                acceptedAt: Self.seconds(acceptedAt), attempts: attempts,
                lastOutcome: row.text(4), state: state, nextAttemptAt: Self.seconds(nextAt))
        }
    }

    /// Puts dead letter `id` back in the queue, due at once, its `max_age` counted again from now. False when no
    /// dead letter has that id.
    public func retryDead(_ id: DeliveryID) async throws(QueueError) -> Bool {
        try await revive(where: "id = ?", [.text(id.text)]) > 0
    }

    /// Puts every dead letter back in the queue; returns how many.
    public func retryAllDead() async throws(QueueError) -> Int {
        try await revive(where: "1", [])
    }

    private func revive(where condition: String, _ binds: [SQLiteHandle.Value]) async throws(QueueError) -> Int {
        let now = Self.micros(clock.wall())
        return try await run(writes: true) { connection in
            try connection.query(
                "UPDATE deliveries SET state = 0, next_at = ?, clock_start = ? WHERE state = 1 AND \(condition) "
                    + "RETURNING seq", [.integer(now), .integer(now)] + binds
            ).count
        }
    }

    /// Deletes delivery `id`, queued or dead. False when there is none. A delivery in flight in the daemon may
    /// still arrive once.
    public func drop(_ id: DeliveryID) async throws(QueueError) -> Bool {
        let sizes = try await run(
            writes: true,
            { connection in
                try connection.query("DELETE FROM deliveries WHERE id = ? RETURNING size", [.text(id.text)])
                    .compactMap { $0.integer(0) }
            }, then: { self.freed($0.reduce(0, +)) }, freesRoom: true)
        return !sizes.isEmpty
    }

    /// Depth, dead letters and oldest queued delivery per upstream, and the bytes stored (for the metrics).
    ///
    /// Reads a few rows whatever the backlog: the counts the triggers keep (`counts`) and, per upstream, the first
    /// queued row in acceptance order. Counting the rows themselves took 56 ms with 30,000 queued, once a second, on
    /// the thread every commit waits for: the accept latency's tail (docs/performance.md#queued-delivery).
    public func snapshot() async throws(QueueError) -> QueueSnapshot {
        try await run(writes: false) { connection in
            let stored = try self.reconcile(connection)
            var snapshot = QueueSnapshot(storedBytes: stored)
            for row in try connection.query("SELECT upstream, state, n FROM counts WHERE n > 0") {
                guard let upstream = row.text(0), let state = row.integer(1), let count = row.integer(2)
                else { continue }
                if state == DeliveryState.queued.rawValue {
                    snapshot.upstreams[upstream, default: .init()].queued = count
                    snapshot.upstreams[upstream, default: .init()].oldestQueuedAt = try connection.query(
                        "SELECT accepted_at FROM deliveries INDEXED BY deliveries_order "
                            + "WHERE upstream = ? AND state = 0 ORDER BY seq LIMIT 1", [.text(upstream)]
                    ).first?.integer(0).map { Self.seconds($0) }
                } else {
                    snapshot.upstreams[upstream, default: .init()].dead = count
                }
            }
            return snapshot
        }
    }

    // MARK: plumbing

    /// Brings the budget's share for stored rows in line with the committed total (rows another process deleted or
    /// added included); returns that total.
    @discardableResult
    private func reconcile(_ connection: SQLiteHandle) throws -> Int {
        // Not below nothing, whatever an edit made of the sizes since the store opened.
        let total = Swift.max(0, try connection.query("SELECT bytes FROM totals WHERE id = 0").first?.integer(0) ?? 0)
        let delta = accounted.withLockedValue { held in
            defer { held = total }
            return total - held
        }
        if delta > 0 { budget.reserveUnconditionally(delta) } else if delta < 0 { budget.release(-delta) }
        return total
    }

    /// Runs `work` in the store's next batch. `freesRoom`: the work frees room on the disk (a delete) or opens the
    /// store, and may spend the reserve when the disk is full (`SpoolReserve`).
    @discardableResult
    private func run<T: Sendable>(
        writes: Bool, _ work: @escaping @Sendable (SQLiteHandle) throws -> T,
        then: (@Sendable (T) -> Void)? = nil, freesRoom: Bool = false
    ) async throws(QueueError) -> T {
        do {
            return try await database.perform(writes: writes, work, then: then)
        } catch let error as SQLiteHandle.Failure where error.isFull && freesRoom && reserve.release() {
            // The disk is full: the reserve gives the write that frees room (a delivered row's delete, a drop) what
            // it needs, and the opening of a queue on a disk someone else filled the shared-memory file it maps.
            // Only those (`freesRoom`): spent on a failed try's new time, which frees nothing, the reserve was gone
            // when the deliveries that would free the disk came to be recorded (a flake of
            // QueuedDeliveryTests.diskFull: every delete failed for good).
            do {
                return try await database.perform(writes: writes, work, then: then)
            } catch {
                throw Self.map(error, path: path)
            }
        } catch {
            throw Self.map(error, path: path)
        }
    }

    static func map(_ error: any Error, path: String) -> QueueError {
        if let queueError = error as? QueueError { return queueError }
        if let sqlite = error as? SQLiteHandle.Failure {
            return sqlite.isFull ? .diskFull : .storage(path: path, detail: sqlite.description)
        }
        return .storage(path: path, detail: "\(error)")
    }

    /// Wall-clock seconds as whole microseconds, the unit stored (exact in SQLite's integers).
    static func micros(_ seconds: Double) -> Int {
        let value = (seconds * 1e6).rounded()
        return value >= 9.2e18 ? .max : value <= -9.2e18 ? .min : Int(value)
    }

    static func seconds(_ micros: Int) -> Double { Double(micros) / 1e6 }

    /// `seqs` as a JSON array, for `seq NOT IN (SELECT value FROM json_each(?))`.
    static func jsonArray(_ seqs: Set<Int>) -> String {
        "[" + seqs.map(String.init).joined(separator: ",") + "]"
    }

    /// What each sealed part of a row is bound to.
    struct Context {
        let id: DeliveryID
        let upstream: String
        let acceptedAt: Int
        var head: String { "backstop queue v1 head \(id.text) \(acceptedAt) \(upstream)" }
        var body: String { "backstop queue v1 body \(id.text) \(acceptedAt) \(upstream)" }
    }

    /// A due row as claimed, still sealed.
    struct Row: Sendable {
        let seq: Int
        let id: DeliveryID
        let acceptedAt: Int
        let clockStart: Int
        let attempts: Int
        let head: [UInt8]
        let body: [UInt8]

        /// From `SELECT seq, id, accepted_at, clock_start, attempts, head, body`.
        init?(_ row: SQLiteHandle.Row) {
            guard let seq = row.integer(0), let id = row.text(1).flatMap(DeliveryID.init),
                let acceptedAt = row.integer(2), let clockStart = row.integer(3), let attempts = row.integer(4)
            else { return nil }
            self.seq = seq
            self.id = id
            self.acceptedAt = acceptedAt
            self.clockStart = clockStart
            self.attempts = attempts
            // A column that is not a blob (an edited row) opens as nothing and is reported damaged.
            head = row.blob(5) ?? []
            body = row.blob(6) ?? []
        }
    }

    /// Creates `spool.dir` (one level, mode 0700) when missing; an existing directory is left as it is. For the
    /// store, and for the daemon's spooled bodies when there is no store (no keychain).
    public static func createDirectory(_ directory: String) throws(QueueError) {
        var info = stat()
        if stat(directory, &info) == 0 {
            guard info.st_mode & S_IFMT == S_IFDIR else {
                throw .storage(path: directory, detail: "spool.dir is not a directory")
            }
            return
        }
        if mkdir(directory, 0o700) != 0 && errno != EEXIST {
            throw .storage(path: directory, detail: "cannot create spool.dir: \(String(cString: strerror(errno)))")
        }
    }

    /// Takes the lock on `queue.db` without waiting: the spool has one owner.
    private static func lockOwnership(_ path: String) throws(QueueError) -> FileLock {
        do throws(FileLock.Failure) {
            return try FileLock(path: path, wait: false)
        } catch {
            switch error {
            case .busy: throw .storage(path: path, detail: "another backstop process delivers from this spool.dir")
            case .system(let operation, let code):
                throw .storage(path: path, detail: "cannot \(operation): \(String(cString: strerror(code)))")
            }
        }
    }

    /// Why `directory` cannot hold requests that got `202` (`owned by …`, `writable by …`), nil when it can: another
    /// user who may write in it (or
    /// owns it) could remove or replace the queue's files (docs/reference/config.md#spool). Root owning it is fine.
    public static func directoryTrustProblem(_ directory: String) -> String? {
        var info = stat()
        guard stat(directory, &info) == 0 else { return nil }
        if info.st_uid != geteuid() && info.st_uid != 0 {
            return "owned by uid \(info.st_uid), not by the user running backstop (uid \(geteuid())): "
                + "that user could remove or replace queued requests; fix: chown it, or choose a directory of its own"
        }
        if info.st_mode & 0o022 != 0 {
            return "writable by \(info.st_mode & 0o002 != 0 ? "every user" : "its group") (mode "
                + String(info.st_mode & 0o7777, radix: 8)
                + "): others could remove or replace queued requests; fix: chmod go-w (run creates it 0700)"
        }
        return nil
    }

    /// Creates the database file with mode 0600 before SQLite opens it (SQLite would use the umask, and gives its
    /// `-wal` and `-shm` files the main file's mode and owner); an existing one must be this user's, and is made
    /// 0600 if it was more open.
    private static func createPrivately(_ path: String) throws(QueueError) {
        let fd = openPrivate(path)
        guard fd >= 0 else {
            throw .storage(path: path, detail: "cannot open: \(String(cString: strerror(errno)))")
        }
        defer { closeDescriptor(fd) }
        try keepPrivate(path, fd: fd)
    }

    /// An existing `-wal` or `-shm` file (never through a link): this user's, mode 0600.
    private static func keepPrivate(_ path: String) throws(QueueError) {
        let fd = Glibc.open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK)
        guard fd >= 0 else {
            if errno == ENOENT { return }
            throw .storage(path: path, detail: "cannot open: \(String(cString: strerror(errno)))")
        }
        defer { closeDescriptor(fd) }
        try keepPrivate(path, fd: fd)
    }

    /// The open file `fd`: a regular file of this user's, made mode 0600 when more open.
    private static func keepPrivate(_ path: String, fd: Int32) throws(QueueError) {
        var info = stat()
        guard fstat(fd, &info) == 0 else {
            throw .storage(path: path, detail: "cannot stat: \(String(cString: strerror(errno)))")
        }
        guard info.st_mode & S_IFMT == S_IFREG else { throw .storage(path: path, detail: "is not a regular file") }
        guard info.st_uid == geteuid() else {
            throw .storage(
                path: path,
                detail: "is owned by uid \(info.st_uid), not by the user running backstop (uid \(geteuid())): "
                    + "that user could alter or remove queued requests; fix: chown it to this user")
        }
        if info.st_mode & 0o077 != 0, fchmod(fd, 0o600) != 0 {
            throw .storage(path: path, detail: "cannot make it mode 0600: \(String(cString: strerror(errno)))")
        }
    }
}

/// The schema, created when missing. `seq` orders deliveries by acceptance and is never reused (AUTOINCREMENT);
/// `totals` keeps the bytes stored, and `counts` the rows per upstream and state, up to date through triggers, so
/// the budget and the metrics are one read away.
enum Schema {
    static let open = [
        "PRAGMA synchronous = FULL",
        // Statement journals (an `INSERT` whose trigger writes, inside a batch's transaction) and the in-flight
        // exclusion's list stay in memory: spilled to temporary files they cost the store's thread hundreds of
        // writes per batch (docs/performance.md#queued-delivery). They hold a statement's pages at most.
        "PRAGMA temp_store = MEMORY",
        // A busy database (a `backstop deliveries` command writing) is waited for, not an error.
        "PRAGMA busy_timeout = 10000",
        // The WAL is reused after each checkpoint; beyond this size it is cut back.
        "PRAGMA journal_size_limit = 16777216",
        """
        CREATE TABLE IF NOT EXISTS deliveries (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            id TEXT NOT NULL UNIQUE,
            upstream TEXT NOT NULL,
            accepted_at INTEGER NOT NULL,
            clock_start INTEGER NOT NULL,
            state INTEGER NOT NULL DEFAULT 0,
            attempts INTEGER NOT NULL DEFAULT 0,
            next_at INTEGER NOT NULL,
            last_outcome TEXT,
            head BLOB NOT NULL,
            body BLOB NOT NULL,
            size INTEGER NOT NULL
        )
        """,
        "CREATE INDEX IF NOT EXISTS deliveries_order ON deliveries (upstream, state, seq)",
        // The next due (`nextDue`) and the expired (`claim`) are found without reading the whole queue: with a
        // backlog, a scan per claim cost more than the commit (docs/performance.md#queued-delivery).
        "CREATE INDEX IF NOT EXISTS deliveries_due ON deliveries (upstream, state, next_at)",
        "CREATE INDEX IF NOT EXISTS deliveries_age ON deliveries (upstream, state, clock_start)",
        "CREATE TABLE IF NOT EXISTS totals (id INTEGER PRIMARY KEY CHECK (id = 0), bytes INTEGER NOT NULL)",
        "INSERT OR IGNORE INTO totals (id, bytes) VALUES (0, 0)",
        """
        CREATE TRIGGER IF NOT EXISTS deliveries_added AFTER INSERT ON deliveries
        BEGIN UPDATE totals SET bytes = bytes + NEW.size WHERE id = 0; END
        """,
        """
        CREATE TRIGGER IF NOT EXISTS deliveries_removed AFTER DELETE ON deliveries
        BEGIN UPDATE totals SET bytes = bytes - OLD.size WHERE id = 0; END
        """,
        """
        CREATE TABLE IF NOT EXISTS counts (
            upstream TEXT NOT NULL, state INTEGER NOT NULL, n INTEGER NOT NULL, PRIMARY KEY (upstream, state)
        ) WITHOUT ROWID
        """,
        """
        CREATE TRIGGER IF NOT EXISTS deliveries_counted AFTER INSERT ON deliveries
        BEGIN
            INSERT INTO counts (upstream, state, n) VALUES (NEW.upstream, NEW.state, 1)
            ON CONFLICT (upstream, state) DO UPDATE SET n = n + 1;
        END
        """,
        """
        CREATE TRIGGER IF NOT EXISTS deliveries_uncounted AFTER DELETE ON deliveries
        BEGIN UPDATE counts SET n = n - 1 WHERE upstream = OLD.upstream AND state = OLD.state; END
        """,
        """
        CREATE TRIGGER IF NOT EXISTS deliveries_recounted AFTER UPDATE OF upstream, state ON deliveries
        WHEN OLD.upstream IS NOT NEW.upstream OR OLD.state IS NOT NEW.state
        BEGIN
            UPDATE counts SET n = n - 1 WHERE upstream = OLD.upstream AND state = OLD.state;
            INSERT INTO counts (upstream, state, n) VALUES (NEW.upstream, NEW.state, 1)
            ON CONFLICT (upstream, state) DO UPDATE SET n = n + 1;
        END
        """,
    ]

    /// Whatever happened before (a file from an older version, a hand edit), start from the real figures; in one
    /// transaction, so a daemon reading beside a `backstop deliveries` command never sees them half done. A row's
    /// `size` is not sealed: it is what its sealed parts take (as `enqueue` counts it), never what an edit made it
    /// (a negative one would have the budget give back bytes it never held). A write: on a full disk it is skipped
    /// (the figures stay as they were, and the store still opens).
    static let recount = [
        """
        BEGIN IMMEDIATE;
        UPDATE deliveries SET size = length(head) + length(body) + \(QueueStore.rowOverhead)
            WHERE size IS NOT length(head) + length(body) + \(QueueStore.rowOverhead);
        UPDATE totals SET bytes = (SELECT coalesce(sum(size), 0) FROM deliveries) WHERE id = 0;
        DELETE FROM counts;
        INSERT INTO counts (upstream, state, n) SELECT upstream, state, count(*) FROM deliveries GROUP BY upstream, state;
        COMMIT
        """
    ]
}

/// Opens or creates `path` for reading and writing, mode 0600, never through a symbolic link. (A free function:
/// inside `QueueStore` the name `open` is the store's own.)
private func openPrivate(_ path: String) -> Int32 {
    open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)
}

private func closeDescriptor(_ fd: Int32) { close(fd) }
