import BackstopCore
import BackstopKeychain
import BackstopTestSupport
import Dispatch
import Logging
import NIOConcurrencyHelpers
import Synchronization
import Testing

@testable import BackstopQueue
@testable import BackstopServer

/// Review of the deliverer's wake-ups (b457403: an accept wakes its lane only with a free slot; `run()` waits on
/// `lanesChanged`): every way work becomes available reaches the lane well before its 5-s recheck
/// (docs/reference/behaviour.md#queued-delivery).
@Suite("Queue deliverer wake-up review")
struct QueueDelivererReviewTests {
    typealias Fixture = QueueDelivererTests.Fixture

    @Test(
        "after a claim that took nothing, a lane waits for the next due time or at most the recheck, never unbounded",
        arguments: [
            // (next due, unsettled due, expected wait until); now is 100.
            (nil, nil, 105.0), (99.0, nil, 105.0), (100.0, nil, 105.0), (100.5, nil, 100.5), (103.0, 102.0, 102.0),
            (500.0, nil, 105.0), (nil, 101.0, 101.0), (99.0, 130.0, 105.0),
        ] as [(Double?, Double?, Double)])
    func waitAfterEmptyClaim(nextDue: Double?, unsettledDue: Double?, expected: Double) {
        #expect(
            DeliveryLaneStep.waitAfterEmptyClaim(nextDue: nextDue, now: 100, unsettledDue: unsettledDue) == expected)
    }

    /// Sends delivery 1 and waits until it is in flight (the sender's gate closed: it stays there).
    static func firstInFlight(_ fixture: Fixture) async throws {
        try await fixture.enqueue(1)
        try await fixture.sender.wait("1 is in flight") { $0.inFlight == 1 }
    }

    /// Waits until `count` deliveries were recorded as delivered.
    static func recorded(_ count: Int, _ fixture: Fixture) async throws {
        try await Poll.until("\(count) were recorded", every: .milliseconds(10)) { fixture.delivered() == count }
    }

    /// Runs `body` and fails unless it took less than 4 s: a wake-up, not the 5-s recheck (which sleeps at least
    /// that long), brought the work in. Not 2 s as elsewhere: on a loaded 2-core machine that fails without a bug.
    static func promptly(_ what: String, _ body: () async throws -> Void) async throws {
        let clock = ContinuousClock()
        let start = clock.now
        try await body()
        #expect(clock.now - start < .seconds(4), "\(what) waited for the recheck")
    }

    @Test("a request accepted while every slot is taken (no wake-up then) goes as soon as a slot frees")
    func acceptedWhileFull() async throws {
        let fixture = try await Fixture(concurrency: 1)
        fixture.sender.setGate(open: false)
        try await fixture.running {
            try await Self.firstInFlight(fixture)
            // Accepted with the one slot taken: `accepted` does not wake the lane; the finishing delivery must.
            try await fixture.enqueue(2)
            try await Self.promptly("the second") {
                fixture.sender.setGate(open: true)
                try await fixture.sender.wait("both were sent") { $0.sent == [1, 2] && $0.inFlight == 0 }
            }
            try await Self.recorded(2, fixture)
        }
        await fixture.close()
    }

    @Test("with more slots than one, accepts while full and while a slot is free all go, within the concurrency")
    func acceptsAroundTheLimit() async throws {
        let fixture = try await Fixture(concurrency: 2)
        fixture.sender.setGate(open: false)
        try await fixture.running {
            try await Self.firstInFlight(fixture)
            try await Self.promptly("the second, with a free slot") {
                try await fixture.enqueue(2)
                try await fixture.sender.wait("2 is in flight") { $0.inFlight == 2 }
            }
            for marker: UInt8 in 3...6 { try await fixture.enqueue(marker) }
            try await Self.promptly("the four accepted while full") {
                fixture.sender.setGate(open: true)
                try await fixture.sender.wait("six were sent") { $0.sent.count == 6 && $0.inFlight == 0 }
            }
            try await Self.recorded(6, fixture)
        }
        #expect(fixture.sender.record.withLockedValue { $0.maxInFlight } == 2)
        await fixture.close()
    }

    @Test("a try to be made again comes back at its backoff's end with nothing else waking the lane")
    func retryComesBack() async throws {
        let fixture = try await Fixture(concurrency: 1)
        fixture.sender.record.withLockedValue {
            $0.answers[1] = [.response(status: 503, retryAfter: nil, rateLimitReset: nil)]
        }
        try await fixture.running {
            try await Self.promptly("the retry (20-40 ms backoff)") {
                try await fixture.enqueue(1)
                try await fixture.sender.wait("1 was sent twice") { $0.sent == [1, 1] && $0.inFlight == 0 }
            }
            try await Self.recorded(1, fixture)
        }
        await fixture.close()
    }

    @Test("deliveries stored before the deliverer runs (a restart) go without any accept waking it")
    func queuedBeforeRun() async throws {
        let fixture = try await Fixture(concurrency: 2)
        for marker: UInt8 in 1...3 {
            // The store alone, as rows left by the last run: `accepted` is never called.
            _ = try await fixture.store.enqueue(
                upstream: "events", QueuedRequest(method: "POST", target: "/", headers: [], body: [marker]))
        }
        try await fixture.running {
            try await Self.promptly("the stored ones") {
                try await fixture.sender.wait("three were sent") { $0.sent.count == 3 && $0.inFlight == 0 }
            }
            try await Self.recorded(3, fixture)
        }
        await fixture.close()
    }

    @Test("a reload that adds slots while every one is taken lets the lane claim at once")
    func reloadAddsSlots() async throws {
        let fixture = try await Fixture(concurrency: 1)
        fixture.sender.setGate(open: false)
        try await fixture.running {
            try await Self.firstInFlight(fixture)
            try await fixture.enqueue(2)
            try await Self.promptly("the second, after the reload") {
                fixture.deliverer.update(lanes: [
                    "events": DeliveryLaneSettings(concurrency: 2, policy: DeliveryPolicy(maxAge: .seconds(3600)))
                ])
                try await fixture.sender.wait("two are in flight") { $0.inFlight == 2 }
            }
            fixture.sender.setGate(open: true)
            try await fixture.sender.wait("both were sent") { $0.sent.count == 2 && $0.inFlight == 0 }
        }
        await fixture.close()
    }

    @Test("a lane added by a reload starts (run() waits on lanesChanged) and takes what was accepted before it")
    func reloadAddsLane() async throws {
        let fixture = try await Fixture(concurrency: 1)
        try await fixture.running {
            // Accepted for an upstream with no lane: no wake-up, nothing to wake.
            try await fixture.enqueue(5, upstream: "audit")
            try await Self.promptly("the new lane") {
                fixture.deliverer.update(lanes: [
                    "events": DeliveryLaneSettings(concurrency: 1, policy: DeliveryPolicy(maxAge: .seconds(3600))),
                    "audit": DeliveryLaneSettings(concurrency: 1, policy: DeliveryPolicy(maxAge: .seconds(3600))),
                ])
                try await fixture.sender.wait("5 was sent") { $0.sent == [5] && $0.inFlight == 0 }
            }
        }
        await fixture.close()
    }

    /// A wall clock the test sets to the exact value it needs.
    final class SetClock: BackstopClock {
        let wallValue: NIOLockedValueBox<Double>
        init(wall: Double) { wallValue = NIOLockedValueBox(wall) }
        func monotonic() -> Duration { .seconds(1000) }
        func wall() -> Double { wallValue.withLockedValue { $0 } }
        func set(_ wall: Double) { wallValue.withLockedValue { $0 = wall } }
    }

    @Test("a failed try whose outcome could not be recorded is sent again when its time comes, with nothing to wake it")
    func unrecordedRetryComesBack() async throws {
        // A wall time whose fraction of a microsecond, once the 20-ms backoff is added, rounds down to whole
        // microseconds (the unit the store keeps and claims by): 1,800,000,000.020000238.
        let start = 1_800_000_000.000_000_238
        let clock = SetClock(wall: start)
        let directory = try TestFiles.makeTemporaryDirectory(prefix: "backstop-review29")
        defer { TestFiles.remove(directory) }
        let store = try await QueueStore.open(
            directory: directory, key: KeychainKey.generate(), budget: SpoolBudget(limit: 1 << 30), owner: true,
            clock: clock)
        let sender = QueueDelivererTests.ScriptedSender()
        sender.record.withLockedValue { $0.answers[1] = [.response(status: 503, retryAfter: nil, rateLimitReset: nil)] }
        sender.setGate(open: false)
        let backoff = Duration.milliseconds(20)
        let policy = DeliveryPolicy(
            maxAge: .seconds(3600), backoff: BackoffConfig(base: backoff, max: backoff, jitter: .none))
        let deliverer = QueueDeliverer(
            store: store, sender: sender, lanes: ["events": DeliveryLaneSettings(concurrency: 1, policy: policy)],
            metrics: QueueMetrics(), logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }),
            clock: clock, seed: 7)
        let setSQL: @Sendable (String) async throws -> Void = { sql in
            _ = try await store.database.perform(writes: false) { try $0.query(sql) }
        }
        _ = try await store.enqueue(
            upstream: "events", QueuedRequest(method: "POST", target: "/", headers: [], body: [1]))
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await deliverer.run() }
            do {
                try await sender.wait("1 is in flight") { $0.inFlight == 1 }
                // The disk is full as the 503 comes back: the try's outcome is not recorded; the row is held until
                // the time the decision named, and the lane waits for it.
                try await setSQL("PRAGMA query_only = 1")
                sender.setGate(open: true)
                try await Poll.until("the outcome was not recorded", every: .milliseconds(5)) {
                    try await store.nextDue(upstream: "events") != nil
                }
                try await setSQL("PRAGMA query_only = 0")
                let at = start + backoff.seconds
                #expect(QueueStore.seconds(QueueStore.micros(at)) < at, "the case this test is about")
                clock.set(at)
                // Before the fix: nextDue said due, the claim (by whole microseconds) took nothing, and the lane
                // waited without a deadline for a wake-up nothing sends: nothing in flight, nothing accepted.
                try await sender.wait("1 was sent again") { $0.sent == [1, 1] && $0.inFlight == 0 }
            } catch {
                deliverer.stop()
                throw error
            }
            deliverer.stop()
            try await group.waitForAll()
        }
        await store.close()
    }

    @Test("a row edited so its id no longer reads does not hold up the lane: set aside, the one behind it goes at once")
    func unreadableRowDoesNotBlock() async throws {
        let fixture = try await Fixture(concurrency: 1)
        let edited = try await fixture.enqueue(1)
        try await fixture.enqueue(2)
        _ = try await fixture.store.database.perform(writes: true) {
            try $0.query("UPDATE deliveries SET id = 'edited' WHERE id = ?", [.text(edited.text)])
        }
        try await fixture.running {
            try await Self.promptly("the one behind it") {
                try await fixture.sender.wait("2 was sent") { $0.sent == [2] && $0.inFlight == 0 }
            }
            try await Poll.until("both were recorded", every: .milliseconds(10)) {
                fixture.delivered() == 1 && fixture.dead() == 1
            }
        }
        await fixture.close()
    }

    @Test("a request committed while the lane's look at the queue waits for the store's thread goes at once")
    func acceptedBetweenCheckAndWait() async throws {
        let fixture = try await Fixture(concurrency: 2)
        fixture.sender.setGate(open: false)
        try await fixture.running {
            try await Self.firstInFlight(fixture)
            // Hold the store's thread (10 s at most); wake the lane (a reload with the same settings), whose look
            // at the queue (nextDue) then waits behind the hold; then an accept waits behind that. Released, the
            // lane finds nothing due and goes to wait, and the accept's commit lands between its check and its
            // wait: only the wake number it read before looking brings it back.
            let group = fixture.store.database
            let release = DispatchSemaphore(value: 0)
            let holding = Atomic(false)
            let hold = Task {
                try await group.perform(writes: false) { _ in
                    holding.store(true, ordering: .releasing)
                    _ = release.wait(timeout: .now() + 10)
                }
            }
            try await Poll.until("the store's thread is held") { holding.load(ordering: .acquiring) }
            // The fixture's settings again.
            let policy = DeliveryPolicy(
                maxAge: .seconds(3600),
                backoff: BackoffConfig(base: .milliseconds(20), max: .milliseconds(40), jitter: .equal))
            fixture.deliverer.update(lanes: ["events": DeliveryLaneSettings(concurrency: 2, policy: policy)])
            // (At least: the counts' refresh may wait there too.)
            try await Poll.until("the lane's look waits") { group.waitingCount >= 1 }
            let accepted = Task { try await fixture.enqueue(2) }
            try await Poll.until("the accept waits") { group.waitingCount >= 2 }
            try await Self.promptly("the second") {
                release.signal()
                try await hold.value
                _ = try await accepted.value
                try await fixture.sender.wait("2 is in flight") { $0.inFlight == 2 }
            }
            fixture.sender.setGate(open: true)
            try await fixture.sender.wait("both were sent") { $0.sent.count == 2 && $0.inFlight == 0 }
        }
        await fixture.close()
    }
}
