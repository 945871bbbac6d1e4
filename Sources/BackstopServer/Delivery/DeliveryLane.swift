import BackstopCore
import BackstopQueue

/// Sends one claimed delivery through its upstream (routing, `auth`, `retry` policy and budget, like a client's
/// request) and says how its last try ended (docs/reference/behaviour.md#queued-delivery). The deliverer decides
/// what follows from that (`DeliveryPolicy`); a sender never touches the store.
public protocol DeliverySending: Sendable {
    /// Returns when the exchange ended. Cancelling the calling task (the daemon stops) ends it early with any
    /// result: the deliverer then gives the delivery back untried instead of recording it.
    func send(_ delivery: ClaimedDelivery, settings: DeliveryLaneSettings) async -> DeliveryResult
}

/// The share of `limits.buffer_memory` that deliveries in flight take: each claimed delivery's body is opened
/// whole in memory until its try ends (docs/reference/config.md#limits). `room` says how much is free now; the
/// deliverer claims no more than that (`QueueStore.claim`'s `memory`), takes each claimed body's bytes, and gives
/// them back when the try ends.
public struct DeliveryMemory: Sendable {
    public let room: @Sendable () -> Int
    public let take: @Sendable (Int) -> Void
    public let give: @Sendable (Int) -> Void

    public init(
        room: @escaping @Sendable () -> Int, take: @escaping @Sendable (Int) -> Void,
        give: @escaping @Sendable (Int) -> Void
    ) {
        self.room = room
        self.take = take
        self.give = give
    }

    /// No bound (tests of other things).
    public static let unbounded = DeliveryMemory(room: { .max }, take: { _ in }, give: { _ in })
}

/// What one upstream's queue does in the deliverer: how many deliveries it may have in flight and the rules that
/// decide what follows a try. Read again after every round, so a reload takes effect at once.
public struct DeliveryLaneSettings: Sendable, Equatable {
    public var concurrency: Int
    public var policy: DeliveryPolicy
    /// The header that carries the delivery's idempotency key (`retry.retry_non_idempotent_with_key`).
    public var idempotencyHeader: String
    /// How long one delivery's exchange may take before the deliverer gives up on it (the upstream's
    /// `timeouts.total`, which the exchange enforces itself, and a margin).
    public var exchangeLimit: Duration
    /// How long the deliverer keeps one of its private connections open unused for the next delivery: shorter than
    /// the proxy's own `limits.client_idle_timeout`, so the proxy never closes one as a delivery starts on it.
    public var connectionIdle: Duration

    public init(
        concurrency: Int, policy: DeliveryPolicy, idempotencyHeader: String = "Idempotency-Key",
        exchangeLimit: Duration = .seconds(40), connectionIdle: Duration = .seconds(5)
    ) {
        self.concurrency = concurrency
        self.policy = policy
        self.idempotencyHeader = idempotencyHeader
        self.exchangeLimit = exchangeLimit
        self.connectionIdle = connectionIdle
    }

    /// The settings of every upstream of `config` with `delivery: queue`, by name.
    public static func lanes(of config: Config) -> [String: DeliveryLaneSettings] {
        var lanes: [String: DeliveryLaneSettings] = [:]
        for upstream in config.upstreams where upstream.delivery == .queue {
            lanes[upstream.name] = DeliveryLaneSettings(
                concurrency: upstream.queue.concurrency, policy: DeliveryPolicy(upstream: upstream),
                idempotencyHeader: upstream.retry.retryNonIdempotentWithKey ?? "Idempotency-Key",
                exchangeLimit: upstream.timeouts.total + .seconds(10),
                connectionIdle: min(.seconds(5), config.limits.clientIdleTimeout / 2))
        }
        return lanes
    }
}

/// The decision of one upstream's delivery loop between rounds, without I/O (docs/reference/behaviour.md#queued-delivery):
/// claim more now, or wait for a wake-up (a request accepted, a delivery finished, a reload) until the next queued
/// delivery falls due.
enum DeliveryLaneStep: Equatable {
    /// Record the outcomes the store could not take earlier (`UnsettledDelivery`) that are due again.
    case recordOutcomes
    /// Claim due deliveries (the store returns at most the free slots' worth).
    case claim
    /// Wait for a wake-up, or until this wall-clock time (seconds since the epoch) when given.
    case wait(until: Double?)

    /// How long a lane with a free slot waits at most before it looks at the store again: `backstop deliveries
    /// retry`, run by another process, puts dead letters back without waking the daemon.
    static let recheck = 5.0

    /// `settings` nil: the upstream is no longer configured for queued delivery (its rows stay queued, untouched,
    /// until a reload configures it again or an operator drops them). `nextDue`: when the next queued delivery
    /// not in flight is due, nil when there is none. With every slot taken, only a finishing delivery (which wakes
    /// the lane) can change anything. `unsettledDue`: when the first outcome waiting to be recorded is due again
    /// (whatever the settings: those deliveries were made).
    /// `pausedUntil`: Backstop refused a try of the lane's for now (`circuit-open`) and said when to come back:
    /// nothing is claimed before then, so an outage does not churn the whole backlog through local refusals.
    static func next(
        settings: DeliveryLaneSettings?, inFlight: Int, nextDue: Double?, now: Double, unsettledDue: Double? = nil,
        pausedUntil: Double? = nil
    ) -> DeliveryLaneStep {
        if let unsettledDue, unsettledDue <= now { return .recordOutcomes }
        if let pausedUntil, pausedUntil > now { return .wait(until: min(pausedUntil, unsettledDue ?? .infinity)) }
        guard let settings, inFlight < settings.concurrency else { return .wait(until: unsettledDue) }
        if let nextDue, nextDue <= now { return .claim }
        return .wait(until: min(nextDue ?? .infinity, now + recheck, unsettledDue ?? .infinity))
    }

    /// Whether a request accepted for the lane wakes its loop: only when the loop may claim it, with a free slot
    /// (`inFlight` below `queue.concurrency`). With every slot taken, or no longer configured, the loop could only
    /// wait again; a delivery finishing wakes it anyway. So a backlog accepted at thousands per second does not
    /// resume the loop's task for each request (docs/performance.md#queued-delivery).
    static func wakesOnAccept(settings: DeliveryLaneSettings?, inFlight: Int) -> Bool {
        guard let settings else { return false }
        return inFlight < settings.concurrency
    }

    /// Until when the loop waits after a claim that took nothing although `nextDue` had called something due (a row
    /// dropped by another process meanwhile; a row that no longer reads): until the next due time when it is still
    /// ahead, and never longer than `recheck` or than until `unsettledDue`. Never without a deadline: with a slot free
    /// nothing else is sure to wake the loop (an accept does, but none may come).
    static func waitAfterEmptyClaim(nextDue: Double?, now: Double, unsettledDue: Double?) -> Double {
        let ahead = nextDue.flatMap { $0 > now ? $0 : nil }
        return min(ahead ?? .infinity, now + recheck, unsettledDue ?? .infinity)
    }

    /// How long a loop waits after the store failed before it tries again.
    static let storeFailureWait = 5.0

    /// Until when the loop waits after the store failed it (a full disk refuses a claim): `storeFailureWait`, but no
    /// longer than until the first outcome waiting to be recorded is due (`unsettledDue`): those deliveries were
    /// made, and a failed claim must not put off their bookkeeping, which has its own backoff (`UnsettledDelivery`).
    static func waitAfterStoreFailure(now: Double, unsettledDue: Double?) -> Double {
        min(now + storeFailureWait, unsettledDue ?? .infinity)
    }
}
