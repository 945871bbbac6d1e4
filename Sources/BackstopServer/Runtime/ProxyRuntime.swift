import BackstopCore
import BackstopStatus
import BackstopTracing
import BackstopTransport
import Logging
import NIOConcurrencyHelpers
import NIOCore
import Synchronization

/// Process-wide state shared by every connection: the transport, the current config snapshot, the logger,
/// and the draining flag.
public final class ProxyRuntime: Sendable {
    public let transport: any TransferStarting
    public let logger: Logger
    /// The time every exchange, connection and token source reads.
    public let clock: any BackstopClock
    public let metrics = ProxyMetrics()
    public let tunnelMetrics = TunnelMetrics()
    public let upgradeMetrics = UpgradeMetrics()
    /// Endpoint states, ejections, fast failures, hedges and network changes (docs/reference/operations.md#metrics).
    public let outageMetrics: OutageMetrics
    /// Fires when the host's network changes (a link up, an address or a route added), for attempts waiting out a
    /// backoff for want of a network (docs/reference/behaviour.md#the-network-coming-back).
    public let networkReturn = NetworkReturnSignal()
    /// The last failed requests, for the status page.
    public let failures = FailureLog()
    /// Starts request and refresh traces; nil without `tracing` (docs/reference/operations.md#tracing).
    public let tracer: Tracer?
    /// Stores and delivers requests to `delivery: queue` upstreams; nil without a spool or such an upstream
    /// (docs/reference/behaviour.md#queued-delivery).
    public let queue: QueueDeliverer?
    /// Where bodies above `limits.retry_buffer` are kept for retries; nil without a spool
    /// (docs/reference/behaviour.md#spooled-bodies).
    public let bodySpool: BodySpool?
    /// Where work that outlives an event-loop callback runs (waiting for a token): children of the server's
    /// `run()`, never unstructured tasks.
    public let background: BackgroundWork
    /// Backstop's own listener addresses, which tunnels never connect to (the transport keeps its own copy).
    private let ownEndpoints = NIOLockedValueBox(DestinationGuard())
    private let current: NIOLockedValueBox<ConfigSnapshot>
    private let draining = Atomic<Bool>(false)
    private let inflight = Atomic<Int>(0)

    public init(
        snapshot: ConfigSnapshot, transport: any TransferStarting, logger: Logger,
        clock: any BackstopClock = SystemClock(), tracer: Tracer? = nil, queue: QueueDeliverer? = nil,
        background: BackgroundWork = BackgroundWork(), outageMetrics: OutageMetrics = OutageMetrics(),
        bodySpool: BodySpool? = nil
    ) {
        self.tracer = tracer
        self.bodySpool = bodySpool
        self.queue = queue
        self.background = background
        self.outageMetrics = outageMetrics
        self.current = NIOLockedValueBox(snapshot)
        self.transport = transport
        self.logger = logger
        self.clock = clock
    }

    /// Where Backstop itself listens, as a tunnel's destination check sees it.
    public var destinationGuard: DestinationGuard {
        get { ownEndpoints.withLockedValue { $0 } }
        set { ownEndpoints.withLockedValue { $0 = newValue } }
    }

    /// The snapshot new requests use.
    public var snapshot: ConfigSnapshot { current.withLockedValue { $0 } }

    /// Makes `snapshot` the one new requests use.
    public func swap(to snapshot: ConfigSnapshot) { current.withLockedValue { $0 = snapshot } }

    /// True once a drain began: new requests get 503 `shutting-down`.
    public var isDraining: Bool { draining.load(ordering: .acquiring) }
    public func beginDraining() { draining.store(true, ordering: .releasing) }

    /// Client connections open now, over every proxy listener.
    private let clientConnections = Atomic<Int>(0)
    public var openClientConnections: Int { clientConnections.load(ordering: .relaxed) }
    func clientConnected() { clientConnections.add(1, ordering: .relaxed) }
    func clientDisconnected() { clientConnections.subtract(1, ordering: .relaxed) }

    /// Config reloads by result, and when the last one succeeded (wall-clock seconds), for `/metrics`.
    private let reloads = NIOLockedValueBox((success: 0, failure: 0, lastSuccess: 0.0))
    public func recordReload(success: Bool, at time: Double) {
        reloads.withLockedValue {
            if success {
                $0.success += 1
                $0.lastSuccess = time
            } else {
                $0.failure += 1
            }
        }
    }
    public var reloadCounts: (success: Int, failure: Int, lastSuccess: Double) { reloads.withLockedValue { $0 } }

    /// Bytes of request bodies kept for retries now, over every connection (`limits.buffer_memory`).
    private let keptBodyBytes = Atomic<Int>(0)
    public var keptBodyMemory: Int { keptBodyBytes.load(ordering: .relaxed) }

    /// Takes `count` bytes of the kept-body budget if they fit under `limit`; false leaves the budget as it was.
    func reserveBodyMemory(_ count: Int, limit: Int) -> Bool {
        var current = keptBodyBytes.load(ordering: .relaxed)
        while true {
            guard current + count <= limit else { return false }
            let (exchanged, original) = keptBodyBytes.compareExchange(
                expected: current, desired: current + count, ordering: .relaxed)
            if exchanged { return true }
            current = original
        }
    }

    func releaseBodyMemory(_ count: Int) {
        if count > 0 { keptBodyBytes.subtract(count, ordering: .relaxed) }
    }

    /// Requests currently being handled.
    public var inflightRequests: Int { inflight.load(ordering: .acquiring) }
    func requestStarted() { inflight.add(1, ordering: .relaxed) }
    func requestFinished() {
        if inflight.subtract(1, ordering: .relaxed).newValue == 0 { idle.resumeAll() }
    }

    /// Tasks waiting for the last request in flight to finish (the drain).
    private let idle = ConditionWaiters()

    /// Returns once no request is in flight (at once when none is), or when the task is cancelled: what a drain
    /// waits for (docs/reference/operations.md#signals-reload-and-drain).
    public func waitUntilNoRequests() async { await idle.wait { inflightRequests == 0 } }
}

extension ProxyRuntime {
    /// One failure in the status page's log (docs/reference/operations.md#status-page), stamped now: an exchange's
    /// end, or a request refused after routing.
    func recordFailure(upstream: String, endpoint: String, status: Int, cause: String) {
        failures.record(
            FailureRecord(at: clock.wall(), upstream: upstream, endpoint: endpoint, status: status, cause: cause))
    }

    /// A request of `upstream`'s answered without an exchange (refused after routing, a queued upstream's own
    /// answer, an upgrade's handshake): its request metrics and activity window, and, for a 5xx, the failures, as
    /// an exchange's end records them. `cause` is read only for a 5xx.
    func recordAnswer(
        upstream: String, status: Int, seconds: Double, attempts: Int, now: Duration, endpoint: String = "-",
        cause: @autoclosure () -> String
    ) {
        metrics.upstream(upstream).recordExchange(
            status: status, seconds: seconds, attempts: attempts, second: now.secondsAndAttoseconds.seconds)
        if status >= 500 { recordFailure(upstream: upstream, endpoint: endpoint, status: status, cause: cause()) }
    }
}
