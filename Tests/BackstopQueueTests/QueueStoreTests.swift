import BackstopCore
import BackstopKeychain
import BackstopTestSupport
import Foundation
import NIOPosix
import SQLiteNIO
import Synchronization
import Testing

@testable import BackstopQueue

/// The queue store on real SQLite files (docs/reference/behaviour.md#queued-delivery): what is accepted is listed and
/// claimed oldest first within the concurrency, outcomes move it on, dead letters come back only by an operator,
/// damaged rows are set aside, and the budget follows every byte.
@Suite("Queue store")
struct QueueStoreTests {
    /// A spool directory with a store in it, a key and a manual clock; removed after the test.
    final class Fixture: Sendable {
        let directory: String
        let key = KeychainKey.generate()
        let clock = ManualClock(wall: 1_800_000_000)
        let budget: SpoolBudget

        init(limit: Int = 1 << 30) throws {
            directory = try TestFiles.makeTemporaryDirectory(prefix: "backstop-queue")
            budget = SpoolBudget(limit: limit)
        }

        deinit { TestFiles.remove(directory) }

        func open(owner: Bool = true, budget: SpoolBudget? = nil, key: KeychainKey? = nil) async throws -> QueueStore {
            try await QueueStore.open(
                directory: directory, key: key ?? self.key, budget: budget ?? self.budget, owner: owner, clock: clock)
        }

        /// A raw connection to the same database, for what no store operation does (tampering).
        func withRawDatabase<T: Sendable>(_ body: @Sendable (SQLiteConnection) async throws -> T) async throws -> T {
            let connection = try await SQLiteConnection.open(
                storage: .file(path: directory + "/" + QueueStore.fileName))
            do {
                let result = try await body(connection)
                try await connection.close()
                return result
            } catch {
                try await connection.close()
                throw error
            }
        }
    }

    static func request(_ n: Int, body: Int = 10) -> QueuedRequest {
        QueuedRequest(
            method: "POST", target: "/events/\(n)?signature=s3cret",
            headers: [.init("Content-Type", "application/json"), .init("Authorization", "Bearer t0ken")],
            body: Array(repeating: UInt8(n % 256), count: body))
    }

    let policy = DeliveryPolicy(maxAge: .seconds(3600))

    @Test("accepted requests are listed oldest first without query, header values or body; they survive reopening")
    func enqueueAndList() async throws {
        let f = try Fixture()
        let store = try await f.open()
        var ids: [DeliveryID] = []
        for n in 0..<3 {
            ids.append(try await store.enqueue(upstream: n == 1 ? "audit" : "events", Self.request(n)))
            f.clock.advance(by: .seconds(1))
        }
        let listed = try await store.list(.queued)
        #expect(listed.map(\.id) == ids)
        #expect(listed.map(\.upstream) == ["events", "audit", "events"])
        #expect(
            listed.first
                == DeliverySummary(
                    id: ids[0], upstream: "events", method: "POST", path: "/events/0", acceptedAt: 1_800_000_000,
                    attempts: 0,
                    lastOutcome: nil, state: .queued, nextAttemptAt: 1_800_000_000))
        #expect(try await store.list(.dead).isEmpty)
        let used = f.budget.used
        #expect(used > 0)
        await store.close()
        #expect(f.budget.used == 0, "closing gives the stored rows' bytes back")

        let reopened = try await f.open()
        #expect(try await reopened.list(.queued).map(\.id) == ids)
        #expect(f.budget.used == used, "reopening counts what is stored")
        await reopened.close()

        // Nothing of the request is readable in the files.
        for name in try FileManager.default.contentsOfDirectory(atPath: f.directory) {
            let bytes = try Data(contentsOf: URL(fileURLWithPath: f.directory + "/" + name))
            for secret in ["s3cret", "t0ken", "/events/0", "application/json"] {
                #expect(bytes.firstRange(of: Data(secret.utf8)) == nil, "\(secret) readable in \(name)")
            }
        }
    }

    @Test("claims are oldest first, within the concurrency, per upstream; settled ones leave the queue")
    func claimOrderAndConcurrency() async throws {
        let f = try Fixture()
        let store = try await f.open()
        var ids: [DeliveryID] = []
        for n in 0..<4 { ids.append(try await store.enqueue(upstream: "events", Self.request(n))) }
        let other = try await store.enqueue(upstream: "audit", Self.request(9))

        let first = try await store.claim(upstream: "events", concurrency: 2, policy: policy)
        #expect(first.deliveries.map(\.id) == Array(ids[0..<2]))
        #expect(first.deliveries[0].request == Self.request(0))
        #expect(first.deliveries[0].attempts == 0)
        #expect(first.expired.isEmpty && first.damaged.isEmpty)
        #expect(
            try await store.claim(upstream: "events", concurrency: 2, policy: policy).deliveries.isEmpty,
            "two in flight already")
        #expect(
            try await store.claim(upstream: "audit", concurrency: 2, policy: policy).deliveries.map(\.id) == [other])

        try await store.settle(first.deliveries[0], .delivered)
        let next = try await store.claim(upstream: "events", concurrency: 2, policy: policy)
        #expect(next.deliveries.map(\.id) == [ids[2]])
        store.unclaim(first.deliveries[1])
        #expect(
            try await store.claim(upstream: "events", concurrency: 3, policy: policy).deliveries.map(\.id)
                == [ids[1], ids[3]], "an unclaimed delivery is due again, in its place")
        #expect(try await store.list(.queued).map(\.id) == [ids[1], ids[2], ids[3], other])
        await store.close()
    }

    @Test("a claim takes no more than its memory by stored size, oldest first; the oldest alone when asked to")
    func claimWithinMemory() async throws {
        let f = try Fixture()
        let store = try await f.open()
        var ids: [DeliveryID] = []
        for n in 0..<4 { ids.append(try await store.enqueue(upstream: "events", Self.request(n, body: 1000))) }
        // Four rows of one size (same head and body lengths): the budget holds exactly their sizes.
        let size = f.budget.used / 4
        #expect(size > 1000 && f.budget.used == 4 * size)
        let two = try await store.claim(
            upstream: "events", concurrency: 4, policy: policy, memory: 2 * size + size / 2, atLeastOne: false)
        #expect(two.deliveries.map(\.id) == Array(ids[0..<2]))
        #expect(two.deliveries.allSatisfy { $0.request.body.count == 1000 })
        let none = try await store.claim(
            upstream: "events", concurrency: 4, policy: policy, memory: size - 1, atLeastOne: false)
        #expect(none.deliveries.isEmpty)
        let one = try await store.claim(upstream: "events", concurrency: 4, policy: policy, memory: 0, atLeastOne: true)
        #expect(one.deliveries.map(\.id) == [ids[2]])
        let rest = try await store.claim(upstream: "events", concurrency: 4, policy: policy)
        #expect(rest.deliveries.map(\.id) == [ids[3]])
        await store.close()
    }

    @Test("a retry waits until its time and counts the attempt; a dead letter waits for an operator")
    func retryAndDead() async throws {
        let f = try Fixture()
        let store = try await f.open()
        let a = try await store.enqueue(upstream: "events", Self.request(1))
        let b = try await store.enqueue(upstream: "events", Self.request(2))
        let claimed = try await store.claim(upstream: "events", concurrency: 4, policy: policy).deliveries
        try await store.settle(claimed[0], .retry(at: f.clock.wall() + 30, lastOutcome: "status 503"))
        try await store.settle(claimed[1], .dead(lastOutcome: "status 400"))
        #expect(try await store.claim(upstream: "events", concurrency: 4, policy: policy).deliveries.isEmpty)
        #expect(try await store.nextDue(upstream: "events") == f.clock.wall() + 30)
        f.clock.advance(by: .seconds(30))
        let again = try await store.claim(upstream: "events", concurrency: 4, policy: policy).deliveries
        #expect(again.map(\.id) == [a])
        #expect(again.first?.attempts == 1)
        #expect(try await store.nextDue(upstream: "events") == nil, "the only queued one is in flight")

        let dead = try await store.list(.dead)
        #expect(dead.map(\.id) == [b])
        #expect(dead.first?.lastOutcome == "status 400" && dead.first?.attempts == 1)
        #expect(try await store.retryDead(a) == false, "not a dead letter")
        #expect(try await store.retryDead(b))
        #expect(try await store.list(.dead).isEmpty)
        let revived = try await store.claim(upstream: "events", concurrency: 4, policy: policy).deliveries
        #expect(revived.map(\.id) == [b])
        #expect(revived.first?.clockStart == f.clock.wall(), "max_age counts again from the retry")
        #expect(revived.first?.acceptedAt == 1_800_000_000, "the age shown stays the acceptance's")
        await store.close()
    }

    @Test("max_age: what is not delivered in time becomes a dead letter at the next claim, not while in flight")
    func expiry() async throws {
        let f = try Fixture()
        let store = try await f.open()
        let a = try await store.enqueue(upstream: "events", Self.request(1))
        let b = try await store.enqueue(upstream: "events", Self.request(2))
        let c = try await store.enqueue(upstream: "events", Self.request(3))
        let inFlight = try await store.claim(upstream: "events", concurrency: 1, policy: policy).deliveries
        #expect(inFlight.map(\.id) == [a])
        let retried = try await store.claim(upstream: "events", concurrency: 2, policy: policy).deliveries
        try await store.settle(retried[0], .retry(at: f.clock.wall() + 10, lastOutcome: "connect-failure"))
        f.clock.advance(by: .seconds(3600))
        let batch = try await store.claim(upstream: "events", concurrency: 5, policy: policy)
        #expect(batch.deliveries.isEmpty)
        #expect(batch.expired == [b, c].sorted())
        let dead = try await store.list(.dead)
        #expect(
            Dictionary(uniqueKeysWithValues: dead.map { ($0.id, $0.lastOutcome) })
                == [b: "expired (last: connect-failure)", c: "expired"])
        try await store.settle(inFlight[0], .dead(lastOutcome: DeliveryPolicy.expired(after: "status 503")))
        #expect(try await store.retryAllDead() == 3)
        #expect(try await store.claim(upstream: "events", concurrency: 5, policy: policy).deliveries.count == 3)
        await store.close()
    }

    @Test("drop deletes queued or dead deliveries and gives their bytes back")
    func drop() async throws {
        let f = try Fixture()
        let store = try await f.open()
        let before = f.budget.used
        let a = try await store.enqueue(upstream: "events", Self.request(1, body: 1000))
        let b = try await store.enqueue(upstream: "events", Self.request(2, body: 1000))
        let one = f.budget.used - before
        #expect(one > 2000)
        #expect(try await store.drop(a))
        #expect(try await store.drop(a) == false)
        let claimed = try await store.claim(upstream: "events", concurrency: 1, policy: policy).deliveries
        try await store.settle(claimed[0], .dead(lastOutcome: "status 422"))
        #expect(try await store.drop(b))
        #expect(f.budget.used == before)
        #expect(try await store.snapshot() == QueueSnapshot(upstreams: [:], storedBytes: 0))
        await store.close()
    }

    @Test("a full budget refuses a request, stores nothing of it; room freed by another process is seen")
    func budget() async throws {
        let f = try Fixture(limit: 4000)
        let store = try await f.open()
        _ = try await store.enqueue(upstream: "events", Self.request(1, body: 1500))
        let second = try await store.enqueue(upstream: "events", Self.request(2, body: 1500))
        await #expect(throws: QueueError.budgetExhausted) {
            _ = try await store.enqueue(upstream: "events", Self.request(3, body: 1500))
        }
        #expect(try await store.list(.queued).count == 2)
        #expect(f.budget.used <= 4000)

        // An operator drops one from the CLI (another process, its own budget): the daemon's next try fits.
        let cli = try await f.open(owner: false, budget: SpoolBudget(limit: 1 << 20))
        #expect(try await cli.drop(second))
        await cli.close()
        _ = try await store.enqueue(upstream: "events", Self.request(3, body: 1500))
        #expect(try await store.list(.queued).count == 2)
        let snapshot = try await store.snapshot()
        #expect(snapshot.storedBytes == f.budget.used)
        await store.close()
        #expect(f.budget.used == 0)
    }

    @Test("concurrent enqueues all land, each exactly once (group commit)")
    func concurrentEnqueues() async throws {
        let f = try Fixture()
        let store = try await f.open()
        let ids = try await withThrowingTaskGroup(of: DeliveryID.self) { group in
            for n in 0..<200 { group.addTask { try await store.enqueue(upstream: "events", Self.request(n)) } }
            return try await group.reduce(into: [DeliveryID]()) { $0.append($1) }
        }
        #expect(Set(ids).count == 200)
        #expect(Set(try await store.list(.queued).map(\.id)) == Set(ids))
        #expect(try await store.snapshot().upstreams["events"]?.queued == 200)
        await store.close()
    }

    /// How far `enqueuesShareACommit` got, seen from the store's thread and the test's tasks.
    final class Progress: Sendable {
        let holding = Atomic(false)
        let returned = Atomic(0)
    }

    @Test("enqueues that arrive while a batch runs share the next commit, and none returns before it")
    func enqueuesShareACommit() async throws {
        let f = try Fixture()
        let store = try await f.open()
        let group = store.database
        let before = group.commits
        let progress = Progress()
        // A read that holds the store's thread until 64 enqueues wait behind it (10 s at most), and says how many
        // of them had returned by then.
        let hold = Task {
            try await group.perform(writes: false) { _ -> Int in
                progress.holding.store(true, ordering: .releasing)
                // The store's thread cannot await, and GroupCommit has no signal for its queue: a bounded poll.
                let deadline = ContinuousClock.now + .seconds(10)
                while group.waitingCount < 64 && ContinuousClock.now < deadline { usleep(1000) }
                return progress.returned.load(ordering: .acquiring)
            }
        }
        try await Poll.until("the holding read runs") { progress.holding.load(ordering: .acquiring) }
        let ids = try await withThrowingTaskGroup(of: DeliveryID.self) { tasks in
            for n in 0..<64 {
                tasks.addTask {
                    let id = try await store.enqueue(upstream: "events", Self.request(n))
                    progress.returned.add(1, ordering: .releasing)
                    return id
                }
            }
            return try await tasks.reduce(into: [DeliveryID]()) { $0.append($1) }
        }
        #expect(try await hold.value == 0)
        #expect(group.commits == before + 1)
        #expect(Set(ids).count == 64)
        #expect(Set(try await store.list(.queued).map(\.id)) == Set(ids))
        await store.close()
        // Reopened, every one is still there: they were committed before they returned.
        let reopened = try await f.open()
        #expect(try await reopened.list(.queued).count == 64)
        await reopened.close()
    }

    /// Runs `sql` on the store's connection between batches (a setting for what follows: `query_only`,
    /// `max_page_count`).
    static func set(_ store: QueueStore, _ sql: String) async throws {
        _ = try await store.database.perform(writes: false) { try $0.query(sql) }
    }

    @Test("a claim that fails (its transaction does not commit) holds nothing: the rows are claimed next time")
    func failedClaimHoldsNothing() async throws {
        let f = try Fixture()
        let store = try await f.open()
        let id = try await store.enqueue(upstream: "events", Self.request(1))
        // Every write of the store's connection now fails in SQLite, as a transaction on a full disk does.
        try await Self.set(store, "PRAGMA query_only = 1")
        await #expect(throws: QueueError.self) {
            try await store.claim(upstream: "events", concurrency: 4, policy: policy)
        }
        try await Self.set(store, "PRAGMA query_only = 0")
        let batch = try await store.claim(upstream: "events", concurrency: 4, policy: policy)
        #expect(batch.deliveries.map(\.id) == [id], "the failed claim left the row held in memory")
        await store.close()
    }

    @Test("an outcome that cannot be recorded keeps the delivery held without a slot, until it is recorded")
    func failedSettleKeepsItHeld() async throws {
        let f = try Fixture()
        let store = try await f.open()
        let first = try await store.enqueue(upstream: "events", Self.request(1))
        let second = try await store.enqueue(upstream: "events", Self.request(2))
        let claimed = try await store.claim(upstream: "events", concurrency: 1, policy: policy).deliveries
        #expect(claimed.map(\.id) == [first])
        try await Self.set(store, "PRAGMA query_only = 1")
        await #expect(throws: QueueError.self) { try await store.settle(claimed[0], .delivered) }
        try await Self.set(store, "PRAGMA query_only = 0")
        // Not sent again while its outcome waits; its slot is free for the next one.
        #expect(try await store.nextDue(upstream: "events") != nil)
        let next = try await store.claim(upstream: "events", concurrency: 1, policy: policy).deliveries
        #expect(next.map(\.id) == [second])
        #expect(try await store.claim(upstream: "events", concurrency: 4, policy: policy).deliveries.isEmpty)
        try await store.settle(claimed[0], .delivered)
        try await store.settle(next[0], .retry(at: f.clock.wall(), lastOutcome: "status 503"))
        #expect(try await store.list(.queued).map(\.id) == [second])
        #expect(
            try await store.claim(upstream: "events", concurrency: 4, policy: policy).deliveries.map(\.id) == [second])
        await store.close()
    }

    @Test("a failed try whose outcome cannot be recorded is claimed again at the time it named, not at once")
    func unrecordedRetryWaits() async throws {
        let f = try Fixture()
        let store = try await f.open()
        let id = try await store.enqueue(upstream: "events", Self.request(1))
        let claimed = try await store.claim(upstream: "events", concurrency: 1, policy: policy).deliveries
        try await Self.set(store, "PRAGMA query_only = 1")
        await #expect(throws: QueueError.self) {
            try await store.settle(claimed[0], .retry(at: f.clock.wall() + 8, lastOutcome: "connect-failure"))
        }
        try await Self.set(store, "PRAGMA query_only = 0")
        #expect(try await store.nextDue(upstream: "events") == f.clock.wall() + 8)
        #expect(try await store.claim(upstream: "events", concurrency: 1, policy: policy).deliveries.isEmpty)
        f.clock.advance(by: .seconds(8))
        let again = try await store.claim(upstream: "events", concurrency: 1, policy: policy).deliveries
        #expect(again.map(\.id) == [id])
        #expect(again.first?.attempts == 0, "the unrecorded try is not counted")
        await store.close()
    }

    @Test("a write that does not fit fails alone: the claim committed beside it in the same batch stands")
    func failingWriteFailsAlone() async throws {
        let f = try Fixture()
        let store = try await f.open()
        let id = try await store.enqueue(upstream: "events", Self.request(1))
        let group = store.database
        let release = DispatchSemaphore(value: 0)
        let holding = Atomic(false)
        // Holds the store's thread until the claim and a large enqueue wait behind it (10 s at most), and makes
        // the database full: SQLite refuses to grow it past its current size (SQLITE_FULL, as on a full disk).
        let hold = Task {
            try await group.perform(writes: false) { connection in
                let pages = try connection.query("PRAGMA page_count").first?.integer(0) ?? 0
                try connection.query("PRAGMA max_page_count = \(pages)")
                holding.store(true, ordering: .releasing)
                _ = release.wait(timeout: .now() + 10)
            }
        }
        try await Poll.until("the holding read runs") { holding.load(ordering: .acquiring) }
        let claim = Task { try await store.claim(upstream: "events", concurrency: 4, policy: policy) }
        try await Poll.until("the claim waits") { group.waitingCount == 1 }
        let big = Task { try await store.enqueue(upstream: "events", Self.request(2, body: 1 << 20)) }
        try await Poll.until("the enqueue waits") { group.waitingCount == 2 }
        release.signal()
        try await hold.value
        #expect(try await claim.value.deliveries.map(\.id) == [id])
        await #expect(throws: QueueError.diskFull) { try await big.value }
        try await Self.set(store, "PRAGMA max_page_count = 1073741823")
        #expect(try await store.list(.queued).map(\.id) == [id], "nothing of the refused request is kept")
        await store.close()
    }

    @Test("the snapshot counts queued and dead per upstream and dates the oldest queued")
    func snapshot() async throws {
        let f = try Fixture()
        let store = try await f.open()
        _ = try await store.enqueue(upstream: "events", Self.request(1))
        f.clock.advance(by: .seconds(5))
        _ = try await store.enqueue(upstream: "events", Self.request(2))
        _ = try await store.enqueue(upstream: "audit", Self.request(3))
        let claimed = try await store.claim(upstream: "audit", concurrency: 1, policy: policy).deliveries
        try await store.settle(claimed[0], .dead(lastOutcome: "status 404"))
        let snapshot = try await store.snapshot()
        #expect(
            snapshot.upstreams == [
                "events": .init(queued: 2, dead: 0, oldestQueuedAt: 1_800_000_000),
                "audit": .init(queued: 0, dead: 1, oldestQueuedAt: nil),
            ])
        #expect(snapshot.storedBytes == f.budget.used)
        await store.close()
    }

    /// The snapshot's figures counted from the rows themselves (what `snapshot` read before the `counts` table).
    static func countedFromRows(_ store: QueueStore) async throws -> [String: QueueSnapshot.Upstream] {
        let rows = try await store.database.perform(writes: false) { connection in
            try connection.query(
                "SELECT upstream, state, count(*), min(accepted_at) FROM deliveries GROUP BY upstream, state")
        }
        var upstreams: [String: QueueSnapshot.Upstream] = [:]
        for row in rows {
            let upstream = try #require(row.text(0))
            let count = try #require(row.integer(2))
            if row.integer(1) == DeliveryState.queued.rawValue {
                upstreams[upstream, default: .init()].queued = count
                upstreams[upstream, default: .init()].oldestQueuedAt = row.integer(3).map { Double($0) / 1e6 }
            } else {
                upstreams[upstream, default: .init()].dead = count
            }
        }
        return upstreams
    }

    @Test("the snapshot's counts follow every change (accept, outcomes, expiry, retry, drop) and are rebuilt on open")
    func countsFollowEveryChange() async throws {
        let f = try Fixture()
        var store = try await f.open()
        func check(_ step: String, _ expected: [String: QueueSnapshot.Upstream]) async throws {
            let upstreams = try await store.snapshot().upstreams
            #expect(upstreams == expected, "\(step)")
            #expect(upstreams == (try await Self.countedFromRows(store)), "\(step): counts differ from the rows")
        }
        let start = 1_800_000_000.0
        var events: [DeliveryID] = []
        for n in 0..<3 {
            events.append(try await store.enqueue(upstream: "events", Self.request(n)))
            f.clock.advance(by: .seconds(1))
        }
        let audit = try await store.enqueue(upstream: "audit", Self.request(3))
        try await check(
            "accepted",
            ["events": .init(queued: 3, oldestQueuedAt: start), "audit": .init(queued: 1, oldestQueuedAt: start + 3)])

        let claimed = try await store.claim(upstream: "events", concurrency: 2, policy: policy).deliveries
        #expect(claimed.map(\.id) == Array(events[0..<2]))
        try await store.settle(claimed[0], .delivered)
        try await store.settle(claimed[1], .retry(at: start + 10, lastOutcome: "status 503"))
        let auditClaim = try await store.claim(upstream: "audit", concurrency: 1, policy: policy).deliveries
        try await store.settle(auditClaim[0], .dead(lastOutcome: "status 400"))
        try await check(
            "settled",
            ["events": .init(queued: 2, oldestQueuedAt: start + 1), "audit": .init(queued: 0, dead: 1)])

        #expect(try await store.retryDead(audit))
        try await check(
            "retried",
            [
                "events": .init(queued: 2, oldestQueuedAt: start + 1),
                "audit": .init(queued: 1, oldestQueuedAt: start + 3),
            ])

        #expect(try await store.drop(events[1]))
        f.clock.advance(by: .seconds(3600))
        let expiring = try await store.claim(upstream: "events", concurrency: 4, policy: policy)
        #expect(expiring.expired == [events[2]])
        try await check(
            "expired and dropped",
            ["events": .init(queued: 0, dead: 1), "audit": .init(queued: 1, oldestQueuedAt: start + 3)])

        // Counts that went wrong (a file from an older version, a hand edit) are counted again on open.
        try await Self.set(store, "UPDATE counts SET n = n + 7")
        await store.close()
        store = try await f.open()
        try await check(
            "reopened", ["events": .init(queued: 0, dead: 1), "audit": .init(queued: 1, oldestQueuedAt: start + 3)])
        #expect(try await store.retryAllDead() == 1)
        #expect(try await store.drop(audit))
        try await check("retried all, dropped", ["events": .init(queued: 1, oldestQueuedAt: start + 2)])
        await store.close()
    }

    @Test("the WAL is copied off the writer's thread, and starts over once long: nothing committed is lost")
    func checkpointsOffTheWriter() async throws {
        let f = try Fixture()
        var store = try await f.open()
        let checkpointer = try #require(store.database.checkpointer)
        // One commit each (a few frames): past SQLite's 1,000-frame threshold several times, and past the 4,096-frame
        // limit at which the writer copies the rest itself unless the background copies kept up (the WAL then
        // starts over by itself: which of the two happens is the machine's timing, so only a WAL that stays short
        // is asserted here; when the writer copies is CheckpointScheduleTests').
        var ids: [DeliveryID] = []
        for n in 0..<1200 { ids.append(try await store.enqueue(upstream: "events", Self.request(n))) }
        let frames = try await store.database.perform(writes: false) { $0.walFrames }
        let copies = checkpointer.copies
        #expect(copies.background >= 2, "the bulk is copied in the background")
        #expect(
            frames < 4096 + 100, "the WAL started over (\(frames) frames, \(copies.foreground) copies by the writer)")
        await store.close()
        store = try await f.open()
        #expect(try await store.list(.queued).map(\.id) == ids)
        await store.close()
    }

    @Test("one daemon at a time delivers from a spool; commands open it beside the daemon")
    func ownerLock() async throws {
        let f = try Fixture()
        let store = try await f.open()
        await #expect(throws: QueueError.self) { _ = try await f.open() }
        let cli = try await f.open(owner: false)
        await cli.close()
        await store.close()
        let next = try await f.open()
        await next.close()
        #expect(try Self.mode(f.directory + "/" + QueueStore.fileName) == 0o600)
    }

    @Test(
        "a queue.db removed (or replaced) while the store is open takes no request: it would be lost at the next start"
    )
    func removedDatabaseTakesNothing() async throws {
        for replaced in [false, true] {
            let f = try Fixture()
            let store = try await f.open()
            _ = try await store.enqueue(upstream: "events", Self.request(1))
            let path = f.directory + "/" + QueueStore.fileName
            if replaced {
                // A copy moved over it (a restore, a volume swapped): another file under the same name.
                #expect(FileManager.default.createFile(atPath: path + ".new", contents: Data()))
                #expect(rename(path + ".new", path) == 0)
            } else {
                for suffix in ["", "-wal", "-shm"] { #expect(unlink(path + suffix) == 0) }
            }
            await #expect(throws: QueueError.removed(path: path)) {
                _ = try await store.enqueue(upstream: "events", Self.request(2))
            }
            #expect(QueueError.removed(path: path).description.contains("was removed or replaced"))
            await store.close()
        }
    }

    static func mode(_ path: String) throws -> Int {
        (try FileManager.default.attributesOfItem(atPath: path)[.posixPermissions] as? Int) ?? -1
    }

    @Test(
        "altered, swapped, cut or moved rows are set aside as damaged dead letters and never delivered",
        arguments: [
            "flip-body", "swap-heads", "truncate-body", "move-upstream", "rename-id", "edit-accepted", "text-body",
        ])
    func tampering(kind: String) async throws {
        let f = try Fixture()
        let store = try await f.open()
        let a = try await store.enqueue(upstream: "events", Self.request(1))
        let b = try await store.enqueue(upstream: "events", Self.request(2))
        let c = try await store.enqueue(upstream: "events", Self.request(3))
        let renamed = DeliveryID("00000000-0000-4000-8000-000000000000")!
        try await f.withRawDatabase { db in
            switch kind {
            case "flip-body":
                _ = try await db.query(
                    "UPDATE deliveries SET body = substr(body, 1, 20) || X'00' || substr(body, 22) WHERE id = ?",
                    [.text(a.text)])
            case "swap-heads":
                let heads = try await db.query(
                    "SELECT id, head FROM deliveries WHERE id IN (?, ?)", [.text(a.text), .text(b.text)])
                for row in heads {
                    let other = row.column("id")?.string == a.text ? b : a
                    _ = try await db.query(
                        "UPDATE deliveries SET head = ? WHERE id = ?", [row.column("head")!, .text(other.text)])
                }
            case "truncate-body":
                _ = try await db.query("UPDATE deliveries SET body = substr(body, 1, 30) WHERE id = ?", [.text(a.text)])
            case "move-upstream":
                _ = try await db.query("UPDATE deliveries SET upstream = 'audit' WHERE id = ?", [.text(a.text)])
            case "rename-id":
                _ = try await db.query(
                    "UPDATE deliveries SET id = ? WHERE id = ?", [.text(renamed.text), .text(a.text)])
            case "edit-accepted":
                _ = try await db.query(
                    "UPDATE deliveries SET accepted_at = accepted_at + 1 WHERE id = ?", [.text(a.text)])
            default:
                _ = try await db.query("UPDATE deliveries SET body = 'plain text' WHERE id = ?", [.text(a.text)])
            }
        }
        let (upstream, damaged): (String, Set<DeliveryID>) =
            switch kind {
            case "swap-heads": ("events", [a, b])
            case "move-upstream": ("audit", [a])
            case "rename-id": ("events", [renamed])
            default: ("events", [a])
            }
        let batch = try await store.claim(upstream: upstream, concurrency: 5, policy: policy)
        #expect(Set(batch.damaged) == damaged)
        let intact = upstream == "audit" ? [] : Set([b, c]).subtracting(damaged)
        #expect(Set(batch.deliveries.map(\.id)) == intact)
        for delivery in batch.deliveries {
            #expect([Self.request(2), Self.request(3)].contains(delivery.request), "only intact requests come out")
            try await store.settle(delivery, .delivered)
        }
        let dead = try await store.list(.dead)
        #expect(Set(dead.map(\.id)) == damaged, "kept for the operator")
        #expect(dead.allSatisfy { $0.lastOutcome == "damaged" })
        if ["swap-heads", "move-upstream", "rename-id", "edit-accepted"].contains(kind) {
            #expect(dead.allSatisfy { $0.method == nil && $0.path == nil }, "a head bound to other data does not open")
        }
        #expect(try await store.retryAllDead() == damaged.count)
        let again = try await store.claim(upstream: upstream, concurrency: 5, policy: policy)
        #expect(again.deliveries.isEmpty && Set(again.damaged) == damaged, "a retried damaged entry is damaged again")
        await store.close()
    }

    @Test("a store sealed under another key opens nothing, and says so per entry")
    func otherKey() async throws {
        let f = try Fixture()
        let store = try await f.open()
        let a = try await store.enqueue(upstream: "events", Self.request(1))
        await store.close()
        let wrong = try await f.open(key: KeychainKey.generate())
        let batch = try await wrong.claim(upstream: "events", concurrency: 5, policy: policy)
        #expect(batch.deliveries.isEmpty && batch.damaged == [a])
        await wrong.close()
    }
}
