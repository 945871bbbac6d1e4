import BackstopCore
import BackstopTransport
import Logging
import NIOCore
import NIOConcurrencyHelpers
import Synchronization

/// Process-wide state shared by every connection: the transport, the current config snapshot, the logger,
/// and the draining flag.
public final class ProxyRuntime: Sendable {
    public let transport: CurlMultiTransport
    public let logger: Logger
    public let metrics = ProxyMetrics()
    private let current: NIOLockedValueBox<ConfigSnapshot>
    private let draining = Atomic<Bool>(false)
    private let inflight = Atomic<Int>(0)

    public init(snapshot: ConfigSnapshot, transport: CurlMultiTransport, logger: Logger) {
        self.current = NIOLockedValueBox(snapshot)
        self.transport = transport
        self.logger = logger
    }

    /// The snapshot new requests use.
    public var snapshot: ConfigSnapshot { current.withLockedValue { $0 } }

    /// Makes `snapshot` the one new requests use.
    public func swap(to snapshot: ConfigSnapshot) { current.withLockedValue { $0 = snapshot } }

    /// True once a drain began: new requests get 503 `shutting-down`.
    public var isDraining: Bool { draining.load(ordering: .acquiring) }
    public func beginDraining() { draining.store(true, ordering: .releasing) }

    /// Requests currently being handled.
    public var inflightRequests: Int { inflight.load(ordering: .acquiring) }
    func requestStarted() { inflight.add(1, ordering: .relaxed) }
    func requestFinished() { inflight.subtract(1, ordering: .relaxed) }
}
