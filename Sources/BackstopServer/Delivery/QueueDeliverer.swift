import BackstopCore
import BackstopQueue
import Logging
import NIOConcurrencyHelpers

/// Delivers what the queue store holds (docs/reference/behaviour.md#queued-delivery): one loop per upstream with
/// `delivery: queue`, oldest due first, at most `queue.concurrency` in flight, each try settled in the store by
/// `DeliveryPolicy` (delivered, tried again later, or a dead letter). Everything runs as child tasks of `run()`.
///
/// A loop sleeps until its next delivery falls due or something wakes it: a request accepted for its upstream
/// (`accepted(upstream:)`), a delivery of its own finishing, a reload (`update(lanes:)`), or `stop()`. Claims are
/// in memory only, so a delivery cut short by a crash is simply queued again (at least once); one cut short by
/// `stop()` is given back untried.
public final class QueueDeliverer: Sendable {
    private struct State {
        var lanes: [String: DeliveryLaneSettings]
        /// Bumped to wake a lane; a lane waits until its number moves.
        var wakes: [String: UInt64] = [:]
        var started: Set<String> = []
        /// Bumped by each `update(lanes:)`: `run()` then says which deliveries wait for an upstream not queued.
        var lanesVersion: UInt64 = 0
        /// Deliveries in flight, by upstream.
        var inFlight: [String: Int] = [:]
        /// Tries whose outcome the store could not record yet, by upstream (not sent again meanwhile).
        var unsettled: [String: [UnsettledDelivery]] = [:]
        /// Until when a lane claims nothing: Backstop refused one of its tries for now (`DeliveryResult.notSentNow`).
        var pausedUntil: [String: Double] = [:]
        var stopped = false
    }

    private let store: QueueStore
    private let sender: any DeliverySending
    private let memory: DeliveryMemory
    /// How many copies of its body a delivery in flight holds: the opened one, and the one written to the proxy.
    static let copiesHeld = 2
    private let metrics: QueueMetrics
    private let logger: Logger
    private let clock: any BackstopClock
    private let random: NIOLockedValueBox<SplitMix64>
    private let state: NIOLockedValueBox<State>
    /// The lanes wait on these (a wake number moved, `stop()`); `run()` waits on `lanesChanged` (a reload, `stop()`),
    /// so waking a lane, up to twice per request accepted or delivered, resumes only the lanes' tasks
    /// (docs/performance.md#queued-delivery).
    private let wakeups = ConditionWaiters()
    private let lanesChanged = ConditionWaiters()

    public init(
        store: QueueStore, sender: any DeliverySending, lanes: [String: DeliveryLaneSettings], metrics: QueueMetrics,
        logger: Logger, memory: DeliveryMemory = .unbounded, clock: any BackstopClock = SystemClock(),
        seed: UInt64 = .random(in: .min ... .max)
    ) {
        self.store = store
        self.sender = sender
        self.memory = memory
        self.metrics = metrics
        self.logger = logger
        self.clock = clock
        self.random = NIOLockedValueBox(SplitMix64(seed: seed))
        self.state = NIOLockedValueBox(State(lanes: lanes))
    }

    /// Stores `request` for delivery to `upstream` and wakes that upstream's loop, without a task (the caller is an
    /// event loop): `completion` runs on the store's thread once the row is committed or could not be
    /// (`QueueStore.enqueue`'s errors: `budgetExhausted` or `diskFull` are 507 `spool-full`), and must be short.
    public func accept(
        upstream: String, _ request: QueuedRequest,
        completion: @escaping @Sendable (Result<DeliveryID, QueueError>) -> Void
    ) {
        store.enqueue(upstream: upstream, request) { result in
            if case .success = result { self.accepted(upstream: upstream) }
            completion(result)
        }
    }

    /// A request for `upstream` was stored: its loop claims it now if it has a free slot. With every slot taken the
    /// loop is not woken: only a finishing delivery, which wakes it, lets it claim (docs/performance.md#queued-delivery).
    public func accepted(upstream: String) {
        let woken = state.withLockedValue { state in
            guard
                DeliveryLaneStep.wakesOnAccept(
                    settings: state.lanes[upstream], inFlight: state.inFlight[upstream, default: 0])
            else { return false }
            state.wakes[upstream, default: 0] &+= 1
            return true
        }
        if woken { wakeups.resumeAll() }
        countsChanged()
    }

    // MARK: the numbers for /metrics

    /// The queue's depth and oldest delivery per upstream as last read from the store: `/metrics` is rendered
    /// synchronously, so it reads this copy, which `run()` refreshes at most once a second while the queue changes.
    public var snapshot: QueueSnapshot { counts.withLockedValue { $0.snapshot } }

    private struct Counts {
        var snapshot = QueueSnapshot()
        var changed = true
    }
    private let counts = NIOLockedValueBox(Counts())
    private let countsWaiters = ConditionWaiters()
    /// The shortest time between two reads of the counts.
    static let countsInterval: Duration = .seconds(1)

    private func countsChanged() {
        counts.withLockedValue { $0.changed = true }
        countsWaiters.resumeAll()
    }

    /// Re-reads the counts whenever they changed, at most once per `countsInterval`, until stopped.
    private func refreshCounts() async {
        while !Task.isCancelled {
            await countsWaiters.wait {
                self.counts.withLockedValue { $0.changed } || self.state.withLockedValue { $0.stopped }
            }
            if Task.isCancelled || state.withLockedValue({ $0.stopped }) { return }
            counts.withLockedValue { $0.changed = false }
            if let snapshot = try? await store.snapshot() {
                counts.withLockedValue { $0.snapshot = snapshot }
            }
            try? await Task.sleep(for: Self.countsInterval)
        }
    }

    /// The upstreams with `delivery: queue` after a reload: new ones get a loop, changed settings apply from the
    /// next round, removed ones stop claiming (their deliveries stay queued).
    public func update(lanes: [String: DeliveryLaneSettings]) {
        let names = state.withLockedValue { state in
            state.lanes = lanes
            state.lanesVersion &+= 1
            return Array(state.wakes.keys) + Array(lanes.keys)
        }
        wake(names)
        lanesChanged.resumeAll()
    }

    /// Ends `run()`: loops stop claiming, deliveries in flight are cancelled and given back untried.
    public func stop() {
        state.withLockedValue { $0.stopped = true }
        wakeups.resumeAll()
        lanesChanged.resumeAll()
        countsWaiters.resumeAll()
    }

    /// Runs the loops until `stop()` or cancellation.
    public func run() async {
        await withDiscardingTaskGroup { group in
            group.addTask { await self.refreshCounts() }
            var sweptVersion: UInt64?
            while true {
                let (newLanes, lanes, version, stopped) = state.withLockedValue { state in
                    let new = state.lanes.keys.filter { !state.started.contains($0) }.sorted()
                    state.started.formUnion(new)
                    return (new, Set(state.lanes.keys), state.lanesVersion, state.stopped)
                }
                if stopped || Task.isCancelled { break }
                for upstream in newLanes {
                    group.addTask { await self.lane(upstream) }
                }
                if sweptVersion != version {
                    sweptVersion = version
                    await warnAboutWaiting(notFor: lanes)
                }
                let started = state.withLockedValue { $0.started }
                await lanesChanged.wait {
                    state.withLockedValue { state in
                        state.stopped || !Set(state.lanes.keys).isSubset(of: started)
                            || state.lanesVersion != version
                    }
                }
            }
            group.cancelAll()
        }
    }

    /// At start and after a reload: deliveries queued for an upstream that has no `delivery: queue` now (removed,
    /// renamed, set to `direct`) wait for it to come back, and the log says so, once per upstream
    /// (docs/reference/behaviour.md#queued-delivery): nothing else would.
    private func warnAboutWaiting(notFor lanes: Set<String>) async {
        do {
            let waiting = try await store.queuedDeliveries(notFor: lanes)
            for (upstream, count) in waiting.sorted(by: { $0.key < $1.key }) {
                logger.warning(
                    "deliveries wait for an upstream without delivery: queue",
                    metadata: [
                        "upstream": .string(upstream), "count": .stringConvertible(count),
                        "fix": .string(
                            "configure upstream \(upstream) with delivery: queue again (they are sent then), or drop "
                                + "them: backstop deliveries list, backstop deliveries drop ID"),
                    ])
            }
        } catch {
            logger.error(
                "cannot look for deliveries of upstreams without delivery: queue",
                metadata: ["error": .string(error.description)])
        }
    }

    // MARK: one upstream's loop

    private func lane(_ upstream: String) async {
        await withDiscardingTaskGroup { deliveries in
            while !Task.isCancelled {
                let (settings, observed, inFlight, stopped, unsettledDue, pausedUntil) = state.withLockedValue {
                    state in
                    (
                        state.lanes[upstream], state.wakes[upstream, default: 0], state.inFlight[upstream, default: 0],
                        state.stopped, state.unsettled[upstream]?.map(\.retryAt).min(), state.pausedUntil[upstream]
                    )
                }
                if stopped { break }
                var until: Double?
                do throws(QueueError) {
                    // With every slot taken only a finishing delivery changes anything: the store is not asked.
                    let nextDue =
                        settings.map { inFlight < $0.concurrency } == true
                        ? try await store.nextDue(upstream: upstream) : nil
                    switch DeliveryLaneStep.next(
                        settings: settings, inFlight: inFlight, nextDue: nextDue,
                        now: clock.wall(), unsettledDue: unsettledDue, pausedUntil: pausedUntil)
                    {
                    case .recordOutcomes:
                        await recordUnsettled(upstream)
                        continue
                    case .claim:
                        guard let settings else { continue }
                        // Bodies are opened whole, and copied whole into the connection to the proxy (held there
                        // until the proxy has read it, at the upstream's pace): twice each. No more are claimed than
                        // `buffer_memory` has room for, but a lane with nothing in flight takes its oldest anyway,
                        // so a large one is not stuck behind the proxy's traffic.
                        let batch = try await store.claim(
                            upstream: upstream, concurrency: settings.concurrency, policy: settings.policy,
                            memory: max(0, memory.room()) / Self.copiesHeld, atLeastOne: inFlight == 0)
                        recordSetAside(batch, upstream: upstream)
                        let claimed = batch.deliveries.count
                        state.withLockedValue { $0.inFlight[upstream, default: 0] += claimed }
                        for delivery in batch.deliveries {
                            let held = Self.copiesHeld * delivery.request.body.count
                            memory.take(held)
                            deliveries.addTask {
                                defer { self.memory.give(held) }
                                await self.deliver(delivery, settings: settings)
                                self.state.withLockedValue { $0.inFlight[upstream, default: 0] -= 1 }
                                self.wake([upstream])
                            }
                        }
                        // Claimed everything due, or filled the slots: look again at once.
                        if !batch.deliveries.isEmpty || !batch.expired.isEmpty || !batch.damaged.isEmpty { continue }
                        // Nothing claimable although something was due (a row dropped by another process since):
                        // with a free slot nothing is sure to wake this loop, so it looks again by `recheck`.
                        let next = try await store.nextDue(upstream: upstream)
                        until = DeliveryLaneStep.waitAfterEmptyClaim(
                            nextDue: next, now: clock.wall(), unsettledDue: unsettledDue)
                    case .wait(let next):
                        until = next
                    }
                } catch {
                    logger.error(
                        "queue store failed; deliveries wait",
                        metadata: ["upstream": .string(upstream), "error": .string(error.description)])
                    until = DeliveryLaneStep.waitAfterStoreFailure(now: clock.wall(), unsettledDue: unsettledDue)
                }
                await waitForWake(upstream, after: observed, until: until)
            }
            deliveries.cancelAll()
        }
    }

    /// Waits until `upstream`'s wake number moves past `observed`, `stop()`, or the wall clock reaches `until`.
    private func waitForWake(_ upstream: String, after observed: UInt64, until: Double?) async {
        let woken: @Sendable () -> Bool = {
            self.state.withLockedValue { $0.stopped || $0.wakes[upstream, default: 0] != observed }
        }
        guard let until else {
            await wakeups.wait(until: woken)
            return
        }
        let delay = until - clock.wall()
        guard delay > 0 else { return }
        let wakeups = self.wakeups
        _ = await withTimeLimit(.seconds(delay)) { await wakeups.wait(until: woken) }
    }

    private func wake(_ upstreams: [String]) {
        state.withLockedValue { state in
            for upstream in upstreams { state.wakes[upstream, default: 0] &+= 1 }
        }
        wakeups.resumeAll()
    }

    // MARK: one delivery

    private func deliver(_ delivery: ClaimedDelivery, settings: DeliveryLaneSettings) async {
        let result = await sender.send(delivery, settings: settings)
        if case .notSentNow(_, let retryAfter) = result {
            let until = clock.wall() + retryAfter
            state.withLockedValue {
                $0.pausedUntil[delivery.upstream] = max($0.pausedUntil[delivery.upstream] ?? 0, until)
            }
        }
        let policy = settings.policy
        guard !Task.isCancelled else {
            store.unclaim(delivery)
            return
        }
        let decision = random.withLockedValue { random in
            policy.decide(
                result, attempts: delivery.attempts + 1, acceptedAt: delivery.clockStart, now: clock.wall(),
                random: &random)
        }
        do throws(QueueError) {
            try await store.settle(delivery, decision)
        } catch {
            // The store keeps the delivery held (docs/reference/behaviour.md#queued-delivery): delivered or dead, it
            // is not sent again while its outcome waits to be recorded here; to be tried again, it waits for the
            // time its decision named, and that next try records its own outcome. A full disk thus causes neither
            // a resend loop nor a duplicate.
            if case .retry(let at, let outcome) = decision {
                logger.error(
                    "cannot record a delivery's outcome; tried again later",
                    metadata: [
                        "upstream": .string(delivery.upstream), "delivery": .string(delivery.id.text),
                        "outcome": .string(outcome), "error": .string(error.description),
                        "next_in_s": .stringConvertible(Int(max(0, at - clock.wall()).rounded(.up))),
                    ])
                return
            }
            let unsettled = UnsettledDelivery(delivery, decision, failedAt: clock.wall())
            state.withLockedValue { $0.unsettled[delivery.upstream, default: []].append(unsettled) }
            logUnsettled(unsettled, error)
            return
        }
        recorded(delivery, decision)
    }

    /// Tries again to record the outcomes of `upstream` that are due; those that fail again wait longer.
    private func recordUnsettled(_ upstream: String) async {
        let now = clock.wall()
        let due = state.withLockedValue { state -> [UnsettledDelivery] in
            let all = state.unsettled[upstream, default: []]
            state.unsettled[upstream] = all.filter { $0.retryAt > now }
            if state.unsettled[upstream]?.isEmpty == true { state.unsettled[upstream] = nil }
            return all.filter { $0.retryAt <= now }
        }
        for var unsettled in due {
            do throws(QueueError) {
                try await store.settle(unsettled.delivery, unsettled.decision)
                recorded(unsettled.delivery, unsettled.decision)
            } catch {
                unsettled.failedAgain(at: clock.wall())
                state.withLockedValue { $0.unsettled[upstream, default: []].append(unsettled) }
                logUnsettled(unsettled, error)
            }
        }
    }

    private func logUnsettled(_ unsettled: UnsettledDelivery, _ error: QueueError) {
        logger.error(
            "cannot record a delivery's outcome; recorded later, not sent again meanwhile",
            metadata: [
                "upstream": .string(unsettled.delivery.upstream), "delivery": .string(unsettled.delivery.id.text),
                "error": .string(error.description),
                "retry_in_s": .stringConvertible(Int((unsettled.retryAt - clock.wall()).rounded(.up))),
            ])
    }

    /// The outcome of `delivery`'s try is in the store: counted and logged.
    private func recorded(_ delivery: ClaimedDelivery, _ decision: DeliveryDecision) {
        countsChanged()
        var metadata: Logger.Metadata = [
            "upstream": .string(delivery.upstream), "delivery": .string(delivery.id.text),
            "attempts": .stringConvertible(delivery.attempts + 1),
        ]
        switch decision {
        case .delivered:
            metrics.record(upstream: delivery.upstream, .delivered)
            logger.info("delivered", metadata: metadata)
        case .retry(let at, let outcome):
            metadata["outcome"] = .string(outcome)
            metadata["next_in_s"] = .stringConvertible(Int(max(0, at - clock.wall()).rounded(.up)))
            logger.notice("delivery failed; tried again later", metadata: metadata)
        case .dead(let outcome):
            metrics.record(upstream: delivery.upstream, .dead)
            metadata["outcome"] = .string(outcome)
            logger.warning("delivery is a dead letter", metadata: metadata)
        }
    }

    /// Counts and logs what a claim turned into dead letters without sending (expired, damaged).
    private func recordSetAside(_ batch: ClaimBatch, upstream: String) {
        for (ids, outcome) in [(batch.expired, "expired"), (batch.damaged, "damaged")] where !ids.isEmpty {
            countsChanged()
            metrics.record(upstream: upstream, .dead, count: ids.count)
            for id in ids {
                logger.warning(
                    "delivery is a dead letter",
                    metadata: [
                        "upstream": .string(upstream), "delivery": .string(id.text), "outcome": .string(outcome),
                    ])
            }
        }
    }
}
