import BackstopCore
import Logging
import NIOConcurrencyHelpers

/// What Backstop knows about one upstream's endpoints, shared by every request to it on every event loop: which
/// endpoint an attempt goes to, which are ejected or being probed, how many requests are in progress
/// (`circuit.max_inflight`), and the time to response head that `hedge.after: p95` follows
/// (docs/reference/behaviour.md#when-an-upstream-is-down).
///
/// The decisions are `EndpointSet`'s and `HeadLatencyWindow`'s (pure, with `now` passed in); this type reads the
/// injected clock, keeps them behind locks, and records the state changes they return in `OutageMetrics` and the log.
///
/// Why locks rather than one owning event loop: every request of the upstream, on any loop, must see an ejection or
/// a probe permit the moment another takes it (one probe at a time means one decision for the whole process), and
/// the exchange asks for an endpoint synchronously as one of its inputs. A hop to an owning loop would make every
/// attempt's start asynchronous and add a thread wake-up to it. The critical sections are a few integer operations
/// over the endpoints (a handful) with no I/O and no allocation on the usual path, as `SharedRetryBudget`'s are.
public final class UpstreamHealth: Sendable {
    public let upstream: String
    /// `scheme://host:port` of each endpoint, in config order: metric labels and the access line's `endpoint=`.
    public let endpointKeys: [String]
    public let policy: EndpointPolicy
    private let endpoints: NIOLockedValueBox<EndpointSet>
    private let latency = NIOLockedValueBox(HeadLatencyWindow())
    private let clock: any BackstopClock
    private let metrics: OutageMetrics
    private let logger: Logger

    public init(upstream: UpstreamConfig, clock: any BackstopClock, metrics: OutageMetrics, logger: Logger) {
        self.upstream = upstream.name
        self.endpointKeys = upstream.endpoints.map(\.endpointKey)
        self.policy = EndpointPolicy(upstream: upstream)
        self.endpoints = NIOLockedValueBox(EndpointSet(upstream: upstream))
        self.clock = clock
        self.metrics = metrics
        self.logger = logger
        metrics.register(upstream: upstream.name, endpoints: endpointKeys)
    }

    /// The health to keep for `upstream` after a reload: `previous` when its endpoints and policy are the same (what
    /// was learned about them still holds, and requests in flight report into it), else a fresh one.
    public static func carried(
        _ previous: UpstreamHealth?, for upstream: UpstreamConfig, clock: any BackstopClock, metrics: OutageMetrics,
        logger: Logger
    ) -> UpstreamHealth {
        if let previous, previous.upstream == upstream.name,
            previous.endpointKeys == upstream.endpoints.map(\.endpointKey),
            previous.policy == EndpointPolicy(upstream: upstream)
        {
            return previous
        }
        return UpstreamHealth(upstream: upstream, clock: clock, metrics: metrics, logger: logger)
    }

    // MARK: admission (`circuit.max_inflight`)

    /// Takes a slot for a request about to be forwarded; `.admitted` must be followed by one `release()`. A refusal
    /// is counted as a fast failure here: the request ends with it.
    public func acquire() -> EndpointAdmission {
        let clock = self.clock
        let (admission, events) = endpoints.withLockedValue { $0.acquire(now: clock.monotonic()) }
        if !events.isEmpty { record(events, reason: "probe unanswered") }
        switch admission {
        case .admitted: break
        case .overloaded: metrics.record(.upstreamOverloaded, upstream: upstream)
        case .circuitOpen: metrics.record(.circuitOpen, upstream: upstream)
        }
        return admission
    }

    public func release() { endpoints.withLockedValue { $0.release() } }

    /// Requests holding a slot now.
    public var inflight: Int { endpoints.withLockedValue { $0.inflight } }

    // MARK: endpoints

    /// The endpoint for the next attempt (passing over `avoiding` while another may be tried), or `circuitOpen`.
    /// `circuit-open` is counted as a fast failure where a request ends with it (`Exchange.finish`), not here: a
    /// hedged copy goes without, and a retry that finds no endpoint ends as its last attempt did.
    public func choose(avoiding: [Int] = []) -> EndpointVerdict {
        let now = clock.monotonic()
        let choice = endpoints.withLockedValue { $0.choose(avoiding: avoiding, now: now) }
        record(choice.events, reason: nil)
        return choice.verdict
    }

    /// Whether an attempt could be sent now (some endpoint healthy or due for its probe): a retry asks before it is
    /// granted, so a request whose own failures ejected the last endpoint ends with its last outcome instead of
    /// waiting a backoff for `circuit-open`.
    public var mayBeTried: Bool {
        let now = clock.monotonic()
        let (events, open) = endpoints.withLockedValue { ($0.expirePermits(now: now), $0.mayBeTried(now: now)) }
        record(events, reason: "probe unanswered")
        return open
    }

    /// How the attempt holding `ticket` ended; `reason` (the `retry.on` condition, `status-503`, `connect-failure`…)
    /// goes on the `endpoint ejected` line when this ejects it.
    public func report(_ outcome: EndpointOutcome, ticket: EndpointTicket, reason: String?) {
        let now = clock.monotonic()
        let events = endpoints.withLockedValue { $0.report(outcome, ticket: ticket, now: now) }
        record(events, reason: reason)
    }

    /// Each endpoint's state now (an unanswered probe past its deadline counts as failed first).
    public var health: [EndpointHealth] {
        let now = clock.monotonic()
        let (events, health) = endpoints.withLockedValue { ($0.expirePermits(now: now), $0.health) }
        record(events, reason: "probe unanswered")
        return health
    }

    /// Each endpoint for the status page: its state, its failures in a row while healthy, the time until it may be
    /// probed (ejected) or its probe counts as failed (probing).
    public var endpointDetails: [(health: EndpointHealth, failuresInARow: Int, nextProbeIn: Duration?)] {
        let now = clock.monotonic()
        let (events, rows) = endpoints.withLockedValue { set in
            let events = set.expirePermits(now: now)
            let health = set.health
            let rows = health.indices.map { index in
                (health[index], set.failuresInARow(endpoint: index), set.nextProbe(endpoint: index).map { $0 - now })
            }
            return (events, rows)
        }
        record(events, reason: "probe unanswered")
        return rows
    }

    /// The label of endpoint `index` (`scheme://host:port`).
    public func key(_ index: Int) -> String { endpointKeys.indices.contains(index) ? endpointKeys[index] : "" }

    private func record(_ events: [EndpointEvent], reason: String?) {
        guard !events.isEmpty else { return }
        metrics.record(events, upstream: upstream, endpoints: endpointKeys)
        for event in events {
            switch event {
            case .ejected(let endpoint, let openFor, let ejection):
                var metadata: Logger.Metadata = [
                    "upstream": .string(upstream), "endpoint": .string(key(endpoint)),
                    "for": .string(Self.text(openFor)), "ejection": .stringConvertible(ejection),
                ]
                // A probe that outlived `per_try` without being reported ejects on the next look at the set.
                metadata["reason"] = .string(reason ?? "probe unanswered")
                logger.warning("endpoint ejected", metadata: metadata)
            case .restored(let endpoint):
                logger.notice(
                    "endpoint restored", metadata: ["upstream": .string(upstream), "endpoint": .string(key(endpoint))])
            case .probing, .probeReleased:
                break
            }
        }
    }

    /// `30s`, `1500ms`: an ejection's length as config durations are written.
    static func text(_ duration: Duration) -> String {
        let (seconds, attoseconds) = duration.secondsAndAttoseconds
        if attoseconds == 0 { return "\(seconds)s" }
        return "\(seconds * 1000 + attoseconds / 1_000_000_000_000_000)ms"
    }

    // MARK: time to response head (`hedge.after: p95`)

    /// Counts one attempt's time from sending its request to its response head.
    public func recordHeadLatency(_ latency: Duration) {
        let now = clock.monotonic()
        self.latency.withLockedValue { $0.record(latency, now: now) }
    }

    /// How long an attempt may go without a head before a hedged copy is sent.
    public func hedgeDelay(_ after: HedgeAfter) -> Duration {
        if case .fixed(let delay) = after { return delay }
        let now = clock.monotonic()
        return latency.withLockedValue { $0.hedgeDelay(after, now: now) }
    }
}
