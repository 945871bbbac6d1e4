import BackstopCore
import BackstopTracing
import BackstopTransport
import NIOCore
import NIOHTTP1
import Synchronization

/// The effects of one forwarded request that outlive a single action: its body (kept for replay, or streamed to the
/// transport as it arrives, with its share of `limits.buffer_memory`), the transfers of its attempts by generation,
/// its spans, and what its end records (metrics, the access line, logs). `ProxyHandler` calls it to perform the
/// machines' actions; it decides nothing and never sees their state: what it records comes in the actions
/// (docs/architecture.md#the-request-core). Confined to the connection's event loop.
final class Exchange {
    let environment: ExchangeEnvironment
    let head: ClientRequestHead
    let target: RequestTarget
    let destination: ExchangeDestination
    /// The destination's counters, looked up once (docs/reference/operations.md#metrics).
    let metrics: ProxyMetrics.Upstream
    let record: AccessRecord.Request
    let startedAt: Duration
    /// The request has a body (an attempt before any of it arrived sends an empty buffered one, not none).
    let hasBody: Bool
    let declaredLength: Int?
    let connectTimeout: Duration

    private var body = RequestBodyStorage.none
    /// The transfer of the attempt in flight, and of any others beside it (a hedge: docs/architecture.md).
    private var transfer: (generation: Int, handle: any TransferHandle)?
    private var otherTransfers: [(generation: Int, handle: any TransferHandle)] = []
    /// The share of `limits.buffer_memory` this exchange's kept body holds (given back once it is no longer kept).
    private var keptBodyBytes = 0
    /// What was kept when the body began to stream, handed to the stream with it: still in memory until the
    /// upstream has taken it, so its share is given back at the stream's first drain (or when the exchange ends).
    private var streamedKeptBody: KeptBodyShare?
    /// The request's trace while `tracing` is on, and the spans of the attempts in flight: the oldest, and hedged
    /// copies beside it (`Exchange+Tracing`).
    var trace: RequestTrace?
    var attemptTrace: AttemptTrace?
    var hedgeTraces: [AttemptTrace] = []
    /// The upstream's time to response head, counted for each attempt when its `hedge.after` is `p95`
    /// (docs/reference/behaviour.md#hedging); nil otherwise.
    private let headLatency: UpstreamHealth?
    /// The upstream's `circuit.max_inflight` slot this request holds, given back when it ends.
    var inflightSlot: UpstreamHealth?
    /// The network change count when the last attempt started, and the wait for the next change while a backoff
    /// after a failure for want of a network runs (docs/reference/behaviour.md#the-network-coming-back).
    var networkSeen: UInt64 = 0
    var networkWait: NetworkReturnSignal.Wait?
    /// `scheme://host[:port]` of the endpoint the last attempt went to (spans, the status page's failures).
    private(set) var attemptEndpoint: String

    init(
        head: ClientRequestHead, target: RequestTarget, destination: ExchangeDestination,
        configuration: ExchangeStateMachine.Configuration, environment: ExchangeEnvironment,
        record: AccessRecord.Request, metrics: ProxyMetrics.Upstream, now: Duration
    ) {
        self.environment = environment
        self.head = head
        self.target = target
        self.destination = destination
        self.metrics = metrics
        self.record = record
        self.startedAt = now
        self.hasBody = configuration.hasBody
        self.declaredLength = configuration.declaredLength
        self.connectTimeout = configuration.timeouts.connect
        self.attemptEndpoint = destination.endpoint
        if case .upstream(let upstream, _) = destination, upstream.config.hedge.max > 0,
            case .p95 = upstream.config.hedge.after
        {
            headLatency = upstream.health
        } else {
            headLatency = nil
        }
        environment.requestStarted()
        traceRequestStarted(now: now)
    }

    var now: Duration { environment.clock.monotonic() }

    // MARK: the request body

    /// What became of a body part handed to `store`.
    enum Stored {
        case kept
        /// It does not fit `limits.buffer_memory`: not stored (the body turns into a stream, this part after it).
        case overBudget
        /// Streamed, and the stream is above its high-water mark: hold the client's reads.
        case streamFull
        /// The spool could not write it (its disk is full): the body is no longer kept, and the attempts reading
        /// it fail.
        case spoolFailed
    }

    /// Keeps a body part for replay (taking its share of `limits.buffer_memory`), or sends it into the stream.
    func store(_ chunk: ByteBuffer) -> Stored {
        switch body {
        case .stream(let stream):
            return stream.append(chunk) ? .kept : .streamFull
        case .spool(let spooled):
            return spooled.append(chunk) ? .kept : .spoolFailed
        case .none, .buffer:
            guard environment.runtime.reserveBodyMemory(chunk.readableBytes, limit: environment.bufferMemory) else {
                return .overBudget
            }
            keptBodyBytes += chunk.readableBytes
            if case .buffer(var buffer) = body {
                body = .none  // the only reference: appended in place
                var chunk = chunk
                buffer.writeBuffer(&chunk)
                body = .buffer(buffer)
            } else {
                body = .buffer(chunk)
            }
            return .kept
        }
    }

    /// The body is sent as it arrives from now on, starting with what was kept, then `part`; `onDrain` runs (on any
    /// thread) when a full stream drained. Returns false when the stream is above its high-water mark.
    func beginStreaming(then part: ByteBuffer?, onDrain: @escaping @Sendable () -> Void) -> Bool {
        let share = KeptBodyShare(bytes: keptBodyBytes, runtime: environment.runtime)
        keptBodyBytes = 0
        streamedKeptBody = share
        let stream = RequestBodyStream(expectedLength: declaredLength) {
            share.release()
            onDrain()
        }
        var fits = true
        if case .buffer(let buffered) = body { fits = stream.append(buffered) }
        if let part, !stream.append(part) { fits = false }
        body = .stream(stream)
        return fits
    }

    /// The body is kept in the spool from now on (docs/reference/behaviour.md#spooled-bodies), starting with what
    /// was kept in memory, then `part`; each attempt sends it from the first byte. False when there is no spool or
    /// no room in it (then nothing changed).
    func beginSpooling(then part: ByteBuffer?, on eventLoop: any EventLoop, maxLength: Int) -> Bool {
        guard let spool = environment.runtime.bodySpool,
            let spooled = SpooledRequestBody.make(
                spool: spool, expectedLength: declaredLength, maxLength: maxLength, eventLoop: eventLoop)
        else { return false }
        if case .buffer(let buffered) = body { _ = spooled.append(buffered) }
        if let part { _ = spooled.append(part) }
        body = .spool(spooled)
        releaseKeptBody()
        return true
    }

    func finishBodyStream() {
        switch body {
        case .stream(let stream): stream.finish()
        case .spool(let spooled): _ = spooled.finish()
        case .none, .buffer: break
        }
    }

    func failBodyStream() {
        switch body {
        case .stream(let stream): stream.fail()
        case .spool(let spooled): spooled.close()
        case .none, .buffer: break
        }
    }

    /// The body is no longer kept for replay: its share of `limits.buffer_memory` goes back.
    private func releaseKeptBody() {
        environment.runtime.releaseBodyMemory(keptBodyBytes)
        keptBodyBytes = 0
        streamedKeptBody?.release()
    }

    // MARK: attempts

    /// Starts an attempt; its events go to `sink`.
    func startAttempt(
        _ start: ExchangeStateMachine.Start, on eventLoop: EventLoop,
        sink: @escaping @Sendable ([TransportEvent]) -> Void
    ) {
        let transportBody: TransportRequestBody
        switch body {
        case .none: transportBody = hasBody ? .buffered(ByteBuffer()) : .empty
        case .buffer(let buffer): transportBody = .buffered(buffer)
        case .stream(let stream): transportBody = .streaming(stream)
        case .spool(let spooled): transportBody = .streaming(spooled.attemptBody())
        }
        // Only a signed attempt needs the time of day (its `X-Amz-Date`).
        let wall: Double = if case .aws = start.credential { environment.clock.wall() } else { 0 }
        var request = UpstreamRequestBuilder.request(
            head: head, destination: destination, credential: start.credential, body: transportBody,
            mayResend: start.mayResend, connectTimeout: connectTimeout, wall: wall, endpoint: start.endpoint)
        stopWaitingForNetwork()
        networkSeen = environment.runtime.networkReturn.generation
        if let endpoint = start.endpoint, let origins = destination.upstream?.endpointOrigins,
            origins.indices.contains(endpoint)
        {
            attemptEndpoint = origins[endpoint]
        }
        traceAttemptStarted(
            &request, attempt: start.attempt, generation: start.generation, hedge: start.hedge,
            endpoint: attemptEndpoint)
        var sink = sink
        if let headLatency {
            let started = now
            let clock = environment.clock
            let relay = sink
            sink = { events in
                if events.contains(where: \.isHead) { headLatency.recordHeadLatency(clock.monotonic() - started) }
                relay(events)
            }
        }
        let handle = environment.transport.start(consume request, on: eventLoop, sink: sink)
        if let transfer { otherTransfers.append(transfer) }
        transfer = (start.generation, handle)
    }

    func cancelAttempt(_ generation: Int) {
        take(generation)?.cancel()
        traceAttemptCancelled(generation)
    }

    /// Ends the wait for a network change, if one is registered.
    func stopWaitingForNetwork() {
        guard let wait = networkWait else { return }
        networkWait = nil
        environment.runtime.networkReturn.cancel(wait)
    }

    func abandonAttempt(_ generation: Int, within limit: Duration) { take(generation)?.abandon(within: limit) }

    /// The client took `bytes` of attempt `generation`'s body (backpressure).
    func consumed(_ bytes: Int, of generation: Int) {
        if let transfer, transfer.generation == generation {
            transfer.handle.consumed(bytes)
        } else {
            otherTransfers.first { $0.generation == generation }?.handle.consumed(bytes)
        }
    }

    private func take(_ generation: Int) -> (any TransferHandle)? {
        if let current = transfer, current.generation == generation {
            transfer = otherTransfers.popLast()
            return current.handle
        }
        guard let index = otherTransfers.firstIndex(where: { $0.generation == generation }) else { return nil }
        return otherTransfers.remove(at: index).handle
    }

    /// Lets go of every transfer still held (cancelled unless the response completed: the transfer ended) and of
    /// the kept body. A transfer's event sink holds the connection's handler, so keeping it would keep both alive.
    func letGo(cancel: Bool) {
        if cancel {
            transfer?.handle.cancel()
            for other in otherTransfers { other.handle.cancel() }
        }
        transfer = nil
        otherTransfers = []
        releaseKeptBody()
        if case .spool(let spooled) = body { spooled.close() }
    }
}

/// The request body as the exchange holds it: kept for replay, or streamed to the transport as it arrives.
enum RequestBodyStorage {
    case none
    case buffer(ByteBuffer)
    case stream(RequestBodyStream)
    /// Kept in the spool: every attempt reads it from the first byte.
    case spool(SpooledRequestBody)
}

extension TransportEvent {
    fileprivate var isHead: Bool { if case .head = self { true } else { false } }
}

extension RetryCondition {
    /// A condition below HTTP (a failed connection, reset or timeout) rather than a status.
    var isTransportCondition: Bool {
        if case .status = self { return false }
        return true
    }
}

/// A kept body's share of `limits.buffer_memory` after it was handed to a stream: given back once, by whichever
/// comes first, the stream's drain (on the transport's thread) or the exchange's end (on its event loop).
final class KeptBodyShare: Sendable {
    private let bytes: Int
    private let runtime: ProxyRuntime
    private let released = Atomic<Bool>(false)

    init(bytes: Int, runtime: ProxyRuntime) {
        self.bytes = bytes
        self.runtime = runtime
    }

    func release() {
        guard bytes > 0, !released.exchange(true, ordering: .acquiringAndReleasing) else { return }
        runtime.releaseBodyMemory(bytes)
    }
}
