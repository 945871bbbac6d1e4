import BackstopCore
import Glibc
import Testing

@testable import BackstopQueue

/// Review of the queued-delivery wake-ups and of the time-ordered ids (b457403, 29c0331), on the store's side
/// (docs/reference/behaviour.md#queued-delivery): what `nextDue` calls due, `claim` takes, to the microsecond; and
/// nothing depends on ids being in acceptance order, which a wall clock stepping back breaks.
@Suite("Queue wake-up review")
struct QueueWakeReviewTests {
    typealias Fixture = QueueStoreTests.Fixture
    let policy = DeliveryPolicy(maxAge: .seconds(3600))

    @Test(
        "an unrecorded failed try is due to the microsecond like a recorded one: once nextDue says due, claim takes it"
    )
    func deferredRetryDueAsClaimed() async throws {
        let f = try Fixture()
        let store = try await f.open()
        let id = try await store.enqueue(upstream: "events", QueueStoreTests.request(1))
        let claimed = try await store.claim(upstream: "events", concurrency: 1, policy: policy).deliveries
        // A backoff with a fraction of a microsecond, as the policy's jitter makes them: 0.24 µs past a whole one at
        // this wall time (one step of a Double there), which whole microseconds (`next_at`, the claim's clock) round
        // down.
        let backoff: Duration = .seconds(8) + .nanoseconds(250)
        let at = f.clock.wall() + backoff.seconds
        try await QueueStoreTests.set(store, "PRAGMA query_only = 1")
        await #expect(throws: QueueError.self) {
            try await store.settle(claimed[0], .retry(at: at, lastOutcome: "connect-failure"))
        }
        try await QueueStoreTests.set(store, "PRAGMA query_only = 0")
        f.clock.advance(by: backoff)
        #expect(f.clock.wall() == at)
        let due = try #require(try await store.nextDue(upstream: "events"))
        #expect(due <= f.clock.wall(), "the lane now claims")
        // Before the fix the claim compared the unrounded time with the clock rounded to whole microseconds: it
        // took nothing, and the lane, told something was due but given nothing, waited for a wake-up that nothing
        // was going to send (no delivery in flight, accepts refused by the full disk).
        let again = try await store.claim(upstream: "events", concurrency: 1, policy: policy).deliveries
        #expect(again.map(\.id) == [id])
        await store.close()
    }

    @Test("a failed try recorded or not comes back at the same time")
    func deferredAndRecordedAgree() async throws {
        let f = try Fixture()
        let store = try await f.open()
        _ = try await store.enqueue(upstream: "events", QueueStoreTests.request(1))
        _ = try await store.enqueue(upstream: "audit", QueueStoreTests.request(2))
        let at = f.clock.wall() + (Duration.seconds(3) + .nanoseconds(1_300)).seconds
        let events = try await store.claim(upstream: "events", concurrency: 1, policy: policy).deliveries
        let audit = try await store.claim(upstream: "audit", concurrency: 1, policy: policy).deliveries
        try await store.settle(audit[0], .retry(at: at, lastOutcome: "status 503"))
        try await QueueStoreTests.set(store, "PRAGMA query_only = 1")
        await #expect(throws: QueueError.self) {
            try await store.settle(events[0], .retry(at: at, lastOutcome: "status 503"))
        }
        try await QueueStoreTests.set(store, "PRAGMA query_only = 0")
        let recorded = try await store.nextDue(upstream: "audit")
        #expect(recorded != nil)
        #expect(try await store.nextDue(upstream: "events") == recorded)
        await store.close()
    }

    @Test("ids made while the wall clock steps back are unique, out of order; claims and lists keep acceptance order")
    func clockStepsBack() async throws {
        let f = try Fixture()
        let store = try await f.open()
        var ids: [DeliveryID] = []
        ids.append(try await store.enqueue(upstream: "events", QueueStoreTests.request(1)))
        f.clock.advance(by: .seconds(-2))
        for n in 2...4 { ids.append(try await store.enqueue(upstream: "events", QueueStoreTests.request(n))) }
        #expect(Set(ids).count == ids.count)
        #expect(ids[1] < ids[0] && ids[2] < ids[0] && ids[3] < ids[0], "the id carries the (stepped back) time")
        #expect(ids[1].text.prefix(13) == ids[3].text.prefix(13), "the same millisecond")
        #expect(try await store.list(.queued).map(\.id) == ids)
        // The step back makes the later ones due 2 s "ago" relative to the first: claims still go by acceptance.
        f.clock.advance(by: .seconds(2))
        let claimed = try await store.claim(upstream: "events", concurrency: 4, policy: policy).deliveries
        #expect(claimed.map(\.id) == ids)
        await store.close()
    }

    @Test(
        "version 7 ids: unique within one millisecond (74 random bits), not in order within it; later ones sort after")
    func withinAMillisecond() {
        var random = SplitMix64(seed: 29)
        let millis: Int64 = 1_800_000_000_000
        let same = (0..<5_000).map { _ in DeliveryID(unixMillis: millis, random: &random) }
        #expect(Set(same).count == same.count)
        #expect(Set(same.map { $0.text.prefix(13) }).count == 1)
        // Not monotonic within the millisecond (RFC 9562's optional counter is not used): nothing may rely on it.
        #expect(same != same.sorted())
        let later = (0..<100).map { _ in DeliveryID(unixMillis: millis + 1, random: &random) }
        #expect(same.max()! < later.min()!)
        // A step back of the clock: earlier ids again, still distinct from all made before.
        let back = (0..<100).map { _ in DeliveryID(unixMillis: millis, random: &random) }
        #expect(Set(same + later + back).count == same.count + later.count + back.count)
    }

    @Test(
        "a row whose id or time no longer reads is set aside as damaged, not left first in line taking the one slot",
        arguments: ["id", "accepted_at", "attempts"])
    func unreadableRow(column: String) async throws {
        let f = try Fixture()
        let store = try await f.open()
        let a = try await store.enqueue(upstream: "events", QueueStoreTests.request(1))
        let b = try await store.enqueue(upstream: "events", QueueStoreTests.request(2))
        try await f.withRawDatabase { db in
            _ = try await db.query("UPDATE deliveries SET \(column) = 'edited' WHERE id = ?", [.text(a.text)])
        }
        // Before the fix the claim read the row, dropped it, and took nothing: with one slot, every claim again,
        // and nothing behind it was ever delivered.
        let first = try await store.claim(upstream: "events", concurrency: 1, policy: policy)
        #expect(first.deliveries.isEmpty)
        // An id that does not read is replaced: the dead letter is named, listed and can be dropped.
        let damaged = try #require(first.damaged.first)
        #expect(first.damaged.count == 1)
        #expect((damaged == a) == (column != "id"))
        let second = try await store.claim(upstream: "events", concurrency: 1, policy: policy)
        #expect(second.deliveries.map(\.id) == [b])
        #expect(try await store.snapshot().upstreams["events"]?.dead == 1, "kept as a dead letter, not dropped")
        let dead = try await store.list(.dead)
        #expect(dead.map(\.id) == [damaged] && dead.first?.lastOutcome == "damaged", "\(dead)")
        let used = f.budget.used
        #expect(try await store.drop(damaged))
        #expect(f.budget.used < used, "its bytes are given back")
        await store.close()
    }

    @Test(
        "a row edited while dead (an id, a time that no longer reads) is listed and droppable after the next open",
        arguments: ["id", "next_at"])
    func unreadableDeadRowAtOpen(column: String) async throws {
        let f = try Fixture()
        var store = try await f.open()
        let a = try await store.enqueue(upstream: "events", QueueStoreTests.request(1))
        try await f.withRawDatabase { db in
            _ = try await db.query(
                "UPDATE deliveries SET state = 1, last_outcome = 'status 400', \(column) = 'edited' WHERE id = ?",
                [.text(a.text)])
        }
        await store.close()
        store = try await f.open()
        let dead = try await store.list(.dead)
        try #require(dead.count == 1, "listed: \(dead)")
        #expect(dead[0].lastOutcome == "damaged")
        #expect((dead[0].id == a) == (column != "id"))
        #expect(try await store.drop(dead[0].id))
        #expect(f.budget.used == 0)
        await store.close()
    }

    @Test("sizes edited to anything (negative, huge) neither trap nor skew the budget: the real sizes are counted")
    func editedSizes() async throws {
        let f = try Fixture()
        var store = try await f.open()
        let a = try await store.enqueue(upstream: "events", QueueStoreTests.request(1))
        let b = try await store.enqueue(upstream: "events", QueueStoreTests.request(2))
        let used = f.budget.used
        await store.close()
        try await f.withRawDatabase { db in
            _ = try await db.query("UPDATE deliveries SET size = -100000 WHERE id = ?", [.text(a.text)])
        }
        // Before the fix: the budget was asked to give back 100,000 bytes it never held, and trapped at open.
        store = try await f.open()
        #expect(f.budget.used == used)
        // Edited while open: dropping the row gives back no more than the rows held.
        try await f.withRawDatabase { db in
            _ = try await db.query("UPDATE deliveries SET size = 9000000000 WHERE id = ?", [.text(b.text)])
        }
        #expect(try await store.drop(b))
        #expect(try await store.drop(a))
        #expect(f.budget.used == 0)
        await store.close()
    }

    @Test("a spool another user could write is refused, naming why; this user's own files are made 0600")
    func untrustedSpool() async throws {
        let f = try Fixture()
        let db = f.directory + "/" + QueueStore.fileName
        try await f.open().close()
        for (mode, why) in [(0o777 as mode_t, "writable by every user"), (0o770, "writable by its group")] {
            #expect(chmod(f.directory, mode) == 0)
            await #expect {
                try await f.open()
            } throws: { error in
                "\(error)".contains("spool.dir is \(why)") && "\(error)".contains("fix: chmod go-w")
            }
        }
        #expect(chmod(f.directory, 0o700) == 0)
        #expect(chmod(db, 0o666) == 0)
        try await f.open().close()
        var info = stat()
        #expect(stat(db, &info) == 0 && info.st_mode & 0o777 == 0o600)
        // Root (as the tests run) can give the file away: a queue.db of another user is refused.
        if geteuid() == 0 {
            #expect(chown(db, 65534, 65534) == 0)
            await #expect {
                try await f.open()
            } throws: { error in
                "\(error)".contains("is owned by uid 65534, not by the user running backstop")
            }
        }
    }

    @Test("deliveries queued for upstreams that are not queue upstreams are counted per upstream; nothing changes")
    func waitingForUnconfigured() async throws {
        let f = try Fixture()
        let store = try await f.open()
        _ = try await store.enqueue(upstream: "events", QueueStoreTests.request(1))
        _ = try await store.enqueue(upstream: "renamed", QueueStoreTests.request(2))
        _ = try await store.enqueue(upstream: "renamed", QueueStoreTests.request(3))
        _ = try await store.enqueue(upstream: "it's \"odd\"", QueueStoreTests.request(4))
        #expect(try await store.queuedDeliveries(notFor: ["events"]) == ["renamed": 2, "it's \"odd\"": 1])
        #expect(try await store.queuedDeliveries(notFor: ["events", "renamed", "it's \"odd\""]) == [:])
        #expect(try await store.list(.queued).count == 4, "they stay queued")
        await store.close()
    }

    @Test("a claim whose damaged rows cannot be set aside gives back the good rows it took: none keeps a slot")
    func failedSetAsideGivesBack() async throws {
        let f = try Fixture()
        let store = try await f.open()
        let damaged = try await store.enqueue(upstream: "events", QueueStoreTests.request(1))
        let good = try await store.enqueue(upstream: "events", QueueStoreTests.request(2))
        // The first row's body no longer opens, and marking it damaged fails (as on a full disk) while the claim's
        // own transaction, which changes nothing, commits.
        try await f.withRawDatabase { db in
            _ = try await db.query(
                "UPDATE deliveries SET body = substr(body, 1, 30) WHERE id = ?", [.text(damaged.text)])
            _ = try await db.query(
                "CREATE TRIGGER review_full BEFORE UPDATE OF last_outcome ON deliveries "
                    + "WHEN NEW.last_outcome = 'damaged' BEGIN SELECT RAISE(FAIL, 'database or disk is full'); END")
        }
        await #expect(throws: QueueError.self) {
            try await store.claim(upstream: "events", concurrency: 2, policy: policy)
        }
        try await f.withRawDatabase { db in _ = try await db.query("DROP TRIGGER review_full") }
        // Before the fix the good row stayed held as being sent, by nobody: never claimed again, and with one
        // slot fewer for ever after.
        let batch = try await store.claim(upstream: "events", concurrency: 2, policy: policy)
        #expect(batch.deliveries.map(\.id) == [good])
        #expect(batch.damaged == [damaged])
        await store.close()
    }
}
