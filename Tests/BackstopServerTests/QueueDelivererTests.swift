import BackstopCore
import BackstopKeychain
import BackstopTestSupport
import Logging
import NIOConcurrencyHelpers
import Testing

@testable import BackstopQueue
@testable import BackstopServer

/// The deliverer's loops on a real queue store (SQLite in a temporary spool) with a scripted sender in place of
/// the upstream exchange (docs/reference/behaviour.md#queued-delivery): oldest first, within `queue.concurrency`,
/// each outcome settled by the delivery policy, woken by acceptance, and nothing lost when it stops.
@Suite("Queue deliverer")
struct QueueDelivererTests {
    // MARK: the step between rounds (pure)

    @Test(
        "between rounds a lane claims only with a free slot and something due",
        arguments: [
            // (configured, in flight, next due, expected)
            // Nothing due: look again after `recheck` (another process may have put dead letters back).
            (true, 0, nil, DeliveryLaneStep.wait(until: 105)),
            (true, 0, 100.0, .claim),
            (true, 0, 99.5, .claim),
            (true, 0, 100.5, .wait(until: 100.5)),
            (true, 0, 104.9, .wait(until: 104.9)),
            (true, 0, 500.0, .wait(until: 105)),
            (true, 1, 100.0, .claim),
            (true, 2, 100.0, .wait(until: nil)),
            (true, 3, 100.0, .wait(until: nil)),
            (true, 2, 250.0, .wait(until: nil)),
            (false, 0, 100.0, .wait(until: nil)),
            (false, 0, nil, .wait(until: nil)),
        ] as [(Bool, Int, Double?, DeliveryLaneStep)])
    func step(configured: Bool, inFlight: Int, nextDue: Double?, expected: DeliveryLaneStep) {
        let settings =
            configured ? DeliveryLaneSettings(concurrency: 2, policy: DeliveryPolicy(maxAge: .seconds(60))) : nil
        #expect(DeliveryLaneStep.next(settings: settings, inFlight: inFlight, nextDue: nextDue, now: 100) == expected)
    }

    @Test(
        "outcomes waiting to be recorded come first when due, else bound the wait, whatever the slots",
        arguments: [
            // (configured, in flight, next due, unsettled due, expected)
            (true, 0, 100.0, 100.0, DeliveryLaneStep.recordOutcomes),
            (true, 2, nil, 99.0, .recordOutcomes),
            (false, 0, nil, 100.0, .recordOutcomes),
            (true, 0, 100.0, 101.0, .claim),
            (true, 0, nil, 101.0, .wait(until: 101)),
            (true, 0, 103.0, 102.0, .wait(until: 102)),
            (true, 0, 102.0, 103.0, .wait(until: 102)),
            (true, 0, nil, 200.0, .wait(until: 105)),
            (true, 2, 100.0, 130.0, .wait(until: 130)),
            (false, 0, nil, 130.0, .wait(until: 130)),
        ] as [(Bool, Int, Double?, Double, DeliveryLaneStep)])
    func stepWithUnsettled(
        configured: Bool, inFlight: Int, nextDue: Double?, unsettledDue: Double, expected: DeliveryLaneStep
    ) {
        let settings =
            configured ? DeliveryLaneSettings(concurrency: 2, policy: DeliveryPolicy(maxAge: .seconds(60))) : nil
        #expect(
            DeliveryLaneStep.next(
                settings: settings, inFlight: inFlight, nextDue: nextDue, now: 100, unsettledDue: unsettledDue)
                == expected)
    }

    @Test(
        "a lane Backstop refused for now (circuit-open) claims nothing until then, even with a slot free and a delivery due; its outcomes still get recorded",
        arguments: [
            // (in flight, next due, unsettled due, paused until, expected)
            (0, 100.0, nil, 130.0, DeliveryLaneStep.wait(until: 130)),
            (0, 100.0, 110.0, 130.0, .wait(until: 110)),
            (0, 100.0, 100.0, 130.0, .recordOutcomes),
            (1, nil, nil, 130.0, .wait(until: 130)),
            (0, 100.0, nil, 100.0, .claim),
            (0, 100.0, nil, 99.0, .claim),
        ] as [(Int, Double?, Double?, Double, DeliveryLaneStep)])
    func stepWhilePaused(
        inFlight: Int, nextDue: Double?, unsettledDue: Double?, pausedUntil: Double, expected: DeliveryLaneStep
    ) {
        let settings = DeliveryLaneSettings(concurrency: 2, policy: DeliveryPolicy(maxAge: .seconds(60)))
        #expect(
            DeliveryLaneStep.next(
                settings: settings, inFlight: inFlight, nextDue: nextDue, now: 100, unsettledDue: unsettledDue,
                pausedUntil: pausedUntil) == expected)
    }

    @Test(
        "a request accepted wakes the lane only when it has a free slot",
        arguments: [
            // (configured, in flight, expected)
            (true, 0, true), (true, 1, true), (true, 2, false), (true, 3, false), (false, 0, false),
        ] as [(Bool, Int, Bool)])
    func wakesOnAccept(configured: Bool, inFlight: Int, expected: Bool) {
        let settings =
            configured ? DeliveryLaneSettings(concurrency: 2, policy: DeliveryPolicy(maxAge: .seconds(60))) : nil
        #expect(DeliveryLaneStep.wakesOnAccept(settings: settings, inFlight: inFlight) == expected)
    }

    @Test(
        "after the store failed, a loop waits 5 s, or less when an outcome waiting to be recorded falls due sooner",
        arguments: [
            // (unsettled due, expected wait until)
            (nil, 105.0), (101.0, 101.0), (99.0, 99.0), (105.0, 105.0), (130.0, 105.0),
        ] as [(Double?, Double)])
    func waitAfterStoreFailure(unsettledDue: Double?, expected: Double) {
        #expect(DeliveryLaneStep.waitAfterStoreFailure(now: 100, unsettledDue: unsettledDue) == expected)
    }

    @Test("an outcome the store cannot take is tried again after 1 s, 2 s, 4 s, … at most a minute")
    func unsettledWaits() {
        #expect((1...9).map { UnsettledDelivery.wait(afterFailures: $0) } == [1, 2, 4, 8, 16, 32, 60, 60, 60])
        #expect(UnsettledDelivery.wait(afterFailures: 1_000) == 60)
        let delivery = ClaimedDelivery(
            id: DeliveryID("5af14c38-9d4e-4f5b-b017-f28c5c64d024")!, upstream: "events",
            request: QueuedRequest(method: "POST", target: "/", headers: [], body: []), attempts: 0, acceptedAt: 0,
            clockStart: 0, seq: 6)
        var unsettled = UnsettledDelivery(delivery, .delivered, failedAt: 100)
        #expect(unsettled.failures == 1 && unsettled.retryAt == 101)
        unsettled.failedAgain(at: 101.5)
        #expect(unsettled.failures == 2 && unsettled.retryAt == 103.5)
        unsettled.failedAgain(at: 104)
        #expect(unsettled.failures == 3 && unsettled.retryAt == 108)
        #expect(unsettled.decision == .delivered && unsettled.delivery == delivery)
    }

    // MARK: the loops

    /// Answers each delivery with what the test scripted for its body's first byte, records the order and how
    /// many were in flight at most, and holds deliveries while `gate` is closed.
    final class ScriptedSender: DeliverySending {
        struct Record {
            var sent: [UInt8] = []
            var inFlight = 0
            var maxInFlight = 0
            var gateOpen = true
            var answers: [UInt8: [DeliveryResult]] = [:]
        }
        let record = NIOLockedValueBox(Record())
        let changed = ConditionWaiters()

        func send(_ delivery: ClaimedDelivery, settings: DeliveryLaneSettings) async -> DeliveryResult {
            let marker = delivery.request.body.first ?? 0
            record.withLockedValue { record in
                record.sent.append(marker)
                record.inFlight += 1
                record.maxInFlight = max(record.maxInFlight, record.inFlight)
            }
            changed.resumeAll()
            await changed.wait { record.withLockedValue { $0.gateOpen } }
            let result = record.withLockedValue { record -> DeliveryResult in
                record.inFlight -= 1
                guard var queue = record.answers[marker], !queue.isEmpty else {
                    return .response(status: 204, retryAfter: nil, rateLimitReset: nil)
                }
                let first = queue.removeFirst()
                record.answers[marker] = queue
                return first
            }
            changed.resumeAll()
            return result
        }

        func setGate(open: Bool) {
            record.withLockedValue { $0.gateOpen = open }
            changed.resumeAll()
        }

        /// Waits (at most 10 s) until `condition` holds for the record.
        func wait(_ what: String, _ condition: @escaping @Sendable (Record) -> Bool) async throws {
            let held = await withTimeLimit(.seconds(10)) {
                await self.changed.wait { self.record.withLockedValue { condition($0) } }
            }
            if !held {
                throw TestFailure("timed out waiting until \(what); sent \(self.record.withLockedValue { $0.sent })")
            }
        }
    }

    struct TestFailure: Error, CustomStringConvertible {
        let description: String
        init(_ description: String) { self.description = description }
    }

    /// A spool with a store, the deliverer running over it, and the scripted sender.
    final class Fixture: Sendable {
        let directory: String
        let store: QueueStore
        let sender = ScriptedSender()
        let metrics = QueueMetrics()
        let deliverer: QueueDeliverer

        init(concurrency: Int, memory: DeliveryMemory = .unbounded) async throws {
            directory = try TestFiles.makeTemporaryDirectory(prefix: "backstop-deliverer")
            store = try await QueueStore.open(
                directory: directory, key: KeychainKey.generate(), budget: SpoolBudget(limit: 1 << 30), owner: true)
            // Redeliveries after 20-40 ms, so a retried delivery comes back quickly.
            let policy = DeliveryPolicy(
                maxAge: .seconds(3600),
                backoff: BackoffConfig(base: .milliseconds(20), max: .milliseconds(40), jitter: .equal))
            deliverer = QueueDeliverer(
                store: store, sender: sender,
                lanes: ["events": DeliveryLaneSettings(concurrency: concurrency, policy: policy)], metrics: metrics,
                logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }), memory: memory, seed: 7)
        }

        @discardableResult
        func enqueue(_ marker: UInt8, upstream: String = "events") async throws -> DeliveryID {
            let id = try await store.enqueue(
                upstream: upstream,
                QueuedRequest(method: "POST", target: "/hook", headers: [], body: [marker, 1, 2, 3]))
            deliverer.accepted(upstream: upstream)
            return id
        }

        /// Runs `body` with the deliverer running; stops it afterwards and closes the store.
        func running(_ body: () async throws -> Void) async throws {
            let deliverer = self.deliverer
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { await deliverer.run() }
                do {
                    try await body()
                } catch {
                    deliverer.stop()
                    throw error
                }
                deliverer.stop()
                try await group.waitForAll()
            }
        }

        func close() async {
            await store.close()
            TestFiles.remove(directory)
        }

        func delivered() -> Int { metricCount(#"result="delivered""#) }
        func dead() -> Int { metricCount(#"result="dead""#) }

        private func metricCount(_ label: String) -> Int {
            let text = metrics.render(queueUpstreams: ["events"], snapshot: QueueSnapshot(), spoolBytes: 0, now: 0)
            let line = text.split(separator: "\n").first {
                $0.hasPrefix("backstop_deliveries_total") && $0.contains(#"upstream="events""#) && $0.contains(label)
            }
            return line.flatMap { Int($0.split(separator: " ").last ?? "") } ?? -1
        }
    }

    @Test("queued deliveries go out oldest first, one at a time with concurrency 1, and leave the queue")
    func oldestFirst() async throws {
        let fixture = try await Fixture(concurrency: 1)
        for marker: UInt8 in 1...5 { try await fixture.enqueue(marker) }
        try await fixture.running {
            try await fixture.sender.wait("five were sent") { $0.sent.count == 5 && $0.inFlight == 0 }
            try await Poll.until("five were recorded", every: .milliseconds(10)) { fixture.delivered() == 5 }
        }
        let record = fixture.sender.record.withLockedValue { $0 }
        #expect(record.sent == [1, 2, 3, 4, 5])
        #expect(record.maxInFlight == 1)
        #expect(try await fixture.store.list(.queued).isEmpty)
        #expect(fixture.delivered() == 5)
        await fixture.close()
    }

    @Test("no more than queue.concurrency deliveries are in flight; the rest go as slots free up")
    func concurrencyLimit() async throws {
        let fixture = try await Fixture(concurrency: 2)
        fixture.sender.setGate(open: false)
        for marker: UInt8 in 1...6 { try await fixture.enqueue(marker) }
        try await fixture.running {
            try await fixture.sender.wait("two are in flight") { $0.inFlight == 2 }
            // The first two in line; the two sends start concurrently, so in either order.
            #expect(fixture.sender.record.withLockedValue { $0.sent }.sorted() == [1, 2])
            fixture.sender.setGate(open: true)
            try await fixture.sender.wait("six were sent") { $0.sent.count == 6 && $0.inFlight == 0 }
            try await Poll.until("six were recorded", every: .milliseconds(10)) { fixture.delivered() == 6 }
        }
        #expect(fixture.sender.record.withLockedValue { $0.maxInFlight } == 2)
        #expect(fixture.delivered() == 6)
        await fixture.close()
    }

    @Test(
        "deliveries in flight hold their bodies in buffer_memory: no more are claimed than it has room for, but one always goes; all is given back"
    )
    func memoryBound() async throws {
        // Room for no body at all (1 byte): each lane still sends its oldest, one at a time, whatever its slots.
        let held = NIOLockedValueBox(0)
        let memory = DeliveryMemory(
            room: { 1 - held.withLockedValue { $0 } }, take: { n in held.withLockedValue { $0 += n } },
            give: { n in held.withLockedValue { $0 -= n } })
        let fixture = try await Fixture(concurrency: 4, memory: memory)
        fixture.sender.setGate(open: false)
        for marker: UInt8 in 1...3 { try await fixture.enqueue(marker) }
        try await fixture.running {
            try await fixture.sender.wait("one is in flight") { $0.inFlight == 1 }
            #expect(held.withLockedValue { $0 } == 8, "its body's 4 bytes are held, twice (opened, and written)")
            fixture.sender.setGate(open: true)
            try await fixture.sender.wait("three were sent") { $0.sent.count == 3 && $0.inFlight == 0 }
            try await Poll.until("three were recorded", every: .milliseconds(10)) { fixture.delivered() == 3 }
        }
        #expect(fixture.sender.record.withLockedValue { $0.maxInFlight } == 1, "not the 4 slots' worth")
        #expect(fixture.sender.record.withLockedValue { $0.sent } == [1, 2, 3])
        #expect(held.withLockedValue { $0 } == 0, "every body given back")
        await fixture.close()
    }

    @Test(
        "a try refused for now (circuit-open, next probe in 0.4 s) pauses the lane: no other delivery is tried before then"
    )
    func circuitOpenPausesTheLane() async throws {
        let fixture = try await Fixture(concurrency: 1)
        fixture.sender.record.withLockedValue { $0.answers[1] = [.notSentNow("circuit-open", retryAfter: 0.4)] }
        try await fixture.enqueue(1)
        try await fixture.enqueue(2)
        try await fixture.running {
            try await fixture.sender.wait("the first was refused") { $0.sent.count >= 1 }
            let refusedAt = ContinuousClock.now
            try await fixture.sender.wait("a second try was made") { $0.sent.count >= 2 }
            #expect(ContinuousClock.now - refusedAt >= .milliseconds(350), "not before the pause ended")
            // Then the refused one (due at the same time, and older) goes first, and the other after it.
            try await fixture.sender.wait("three sends") { $0.sent.count >= 3 }
            #expect(fixture.sender.record.withLockedValue { $0.sent }.prefix(3) == [1, 1, 2])
            try await Poll.until("both delivered", every: .milliseconds(10)) { fixture.delivered() == 2 }
        }
        await fixture.close()
    }

    @Test("a request accepted while the lane sleeps with an empty queue is delivered at once")
    func acceptanceWakes() async throws {
        let fixture = try await Fixture(concurrency: 1)
        try await fixture.running {
            // Nothing is queued: the lane waits for a wake-up or its 5-s recheck; only the wake-up can bring the
            // delivery in well under that.
            let clock = ContinuousClock()
            let accepted = clock.now
            try await fixture.enqueue(9)
            try await fixture.sender.wait("it was sent") { $0.sent == [9] }
            #expect(clock.now - accepted < .seconds(2))
            try await Poll.until("it was recorded", every: .milliseconds(10)) { fixture.delivered() == 1 }
        }
        #expect(fixture.delivered() == 1)
        await fixture.close()
    }

    @Test("a 503 is tried again later with the same delivery, a 400 becomes a dead letter")
    func outcomesSettle() async throws {
        let fixture = try await Fixture(concurrency: 1)
        fixture.sender.record.withLockedValue {
            $0.answers[1] = [
                .response(status: 503, retryAfter: nil, rateLimitReset: nil), .noResponse("connect-failure"),
            ]
            $0.answers[2] = [.response(status: 400, retryAfter: nil, rateLimitReset: nil)]
        }
        try await fixture.enqueue(1)
        let rejected = try await fixture.enqueue(2)
        try await fixture.running {
            try await fixture.sender.wait("1 was sent three times") {
                $0.sent.filter { $0 == 1 }.count == 3 && $0.inFlight == 0
            }
            try await Poll.until("both were recorded", every: .milliseconds(10)) {
                fixture.delivered() == 1 && fixture.dead() == 1
            }
        }
        #expect(fixture.sender.record.withLockedValue { $0.sent.filter { $0 == 2 } } == [2])
        #expect(try await fixture.store.list(.queued).isEmpty)
        let dead = try await fixture.store.list(.dead)
        #expect(dead.map(\.id) == [rejected])
        #expect(dead.first?.lastOutcome == "status 400")
        #expect(fixture.delivered() == 1)
        #expect(fixture.dead() == 1)
        await fixture.close()
    }

    @Test("stopping gives deliveries in flight back untried: they stay queued with no attempt counted")
    func stopGivesBack() async throws {
        let fixture = try await Fixture(concurrency: 2)
        fixture.sender.setGate(open: false)
        let first = try await fixture.enqueue(1)
        let second = try await fixture.enqueue(2)
        try await fixture.running {
            try await fixture.sender.wait("both are in flight") { $0.inFlight == 2 }
        }
        let queued = try await fixture.store.list(.queued)
        #expect(Set(queued.map(\.id)) == [first, second])
        #expect(queued.allSatisfy { $0.attempts == 0 })
        #expect(fixture.delivered() == 0)
        await fixture.close()
    }

    @Test("an upstream removed by a reload stops claiming; its deliveries stay queued; added back, they go")
    func reloadRemovesAndAddsLanes() async throws {
        let fixture = try await Fixture(concurrency: 1)
        let settings = DeliveryLaneSettings(concurrency: 1, policy: DeliveryPolicy(maxAge: .seconds(3600)))
        fixture.deliverer.update(lanes: [:])
        try await fixture.running {
            let id = try await fixture.enqueue(3)
            try await fixture.enqueue(4, upstream: "audit")
            // Queued for upstreams the deliverer does not serve: still queued after a round trip through the store
            // that a wake-up caused (the enqueue above woke the lane).
            #expect(try await fixture.store.list(.queued).map(\.id).contains(id))
            fixture.deliverer.update(lanes: ["events": settings, "audit": settings])
            try await fixture.sender.wait("both were sent") { Set($0.sent) == [3, 4] && $0.inFlight == 0 }
            try await Poll.until("both were settled", every: .milliseconds(10)) {
                try await fixture.store.list(.queued).isEmpty
            }
        }
        #expect(try await fixture.store.list(.queued).isEmpty)
        await fixture.close()
    }
}
