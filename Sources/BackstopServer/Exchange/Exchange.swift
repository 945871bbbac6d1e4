import BackstopCore
import BackstopTracing
import BackstopTransport
import Logging
import NIOCore
import NIOHTTP1

/// One client request from routing to the last byte of its response. Its decisions are `ExchangeStateMachine`'s;
/// this type feeds it events (body parts, credentials, transport events, timers, the client's state) and performs
/// the actions it returns: it owns the request body, the transfer of the current attempt, and the relay of the
/// response to the client. Confined to the connection's event loop.
final class Exchange {
    /// Every access is on the event loop, and each `mutating` call returns its action before it is performed. The
    /// debug build checks exclusivity; the release build does not (scripts/build-release.sh).
    var machine: ExchangeStateMachine
    let client: ExchangeClient
    let environment: ExchangeEnvironment
    let eventLoop: EventLoop
    let head: HTTPRequestHead
    let target: RequestTarget
    let destination: ExchangeDestination
    /// The destination's counters, looked up once (docs/reference/operations.md#metrics).
    let metrics: ProxyMetrics.Upstream
    let record: AccessRecord.Request

    var body = RequestBodyStorage.none
    var transfer: (any TransferHandle)?
    /// The generation of `transfer`: events of any other attempt are ignored.
    var transferGeneration = 0
    var relay: ResponseRelay?
    /// The `X-Backstop-Error` written on an upstream's response head (`token-refresh-failed`), for the access line.
    var headError: ProxyErrorReason?
    /// Body bytes written to the client but not yet reported to the transport (the client socket was full).
    var unreportedBytes = 0
    var budgetExhaustionCounted = false
    /// The share of `limits.buffer_memory` this exchange's kept body holds (given back once it is no longer kept).
    var keptBodyBytes = 0
    var random = SystemRandomNumberGenerator()
    /// The request's trace while `tracing` is on, and the span of the attempt in flight (`Exchange+Tracing`).
    var trace: RequestTrace?
    var attemptTrace: AttemptTrace?

    init(
        configuration: ExchangeStateMachine.Configuration, head: HTTPRequestHead, target: RequestTarget,
        destination: ExchangeDestination, client: ExchangeClient, environment: ExchangeEnvironment,
        eventLoop: EventLoop, record: AccessRecord.Request, now: Duration
    ) {
        self.machine = ExchangeStateMachine(configuration: configuration, now: now)
        self.client = client
        self.environment = environment
        self.eventLoop = eventLoop
        self.head = head
        self.target = target
        self.destination = destination
        self.metrics = environment.metrics.upstream(destination.name)
        self.record = record
    }

    var now: Duration { environment.clock.monotonic() }

    // MARK: events from the client side (`now`: the connection's clock reading for the part)

    func start(now: Duration) {
        environment.requestStarted()
        traceRequestStarted(now: now)
        perform(machine.start(now: now))
    }

    func receiveBody(_ chunk: ByteBuffer, now: Duration) {
        let action = machine.bodyReceived(count: chunk.readableBytes, now: now)
        switch action {
        case .storeBody:
            // A part kept for replay takes its share of `limits.buffer_memory`; one that does not fit turns the
            // body into a stream (sent once, not retryable) instead of growing memory past the budget.
            if case .stream = body {
            } else if environment.runtime.reserveBodyMemory(chunk.readableBytes, limit: environment.bufferMemory) {
                keptBodyBytes += chunk.readableBytes
            } else {
                perform(machine.bufferDenied(now: now))
            }
            store(chunk)
        case .storeBodyAndBeginStreaming:
            store(chunk)
            beginStreaming()
        default:
            perform(action)
        }
    }

    func receiveEnd(now: Duration) { perform(machine.bodyEnded(now: now)) }

    /// The client disconnected: cancel everything, including pending retries.
    func clientGone() { perform(machine.clientGone()) }

    /// The client stopped sending its request body for `client_idle_timeout`.
    func clientStalled() { perform(machine.clientStalled()) }

    /// The client socket drained: the body bytes written so far count as consumed (backpressure).
    func clientWritable() {
        machine.clientWritable(now: now)
        guard unreportedBytes > 0, let transfer else { return }
        transfer.consumed(unreportedBytes)
        unreportedBytes = 0
    }

    /// The connection's timer fired.
    func timerFired() {
        let wasAttempting: Bool = if case .attempting = machine.state { true } else { false }
        let action = machine.timerFired(now: now, wall: environment.clock.wall(), random: &random)
        if wasAttempting, case .retry = action { metrics.recordAttempt(outcome: "timeout") }
        if wasAttempting, case .failLocally = action { metrics.recordAttempt(outcome: "timeout") }
        perform(action)
    }

    // MARK: the request body

    private func store(_ chunk: ByteBuffer) {
        switch body {
        case .none:
            body = .buffer(chunk)
        case .buffer(var buffer):
            var chunk = chunk
            buffer.writeBuffer(&chunk)
            body = .buffer(buffer)
        case .stream(let stream):
            if !stream.append(chunk) { client.holdReads() }
        }
    }

    /// The body will not fit `retry_buffer`: send it as it arrives (once), starting the attempt now.
    func beginStreaming() {
        let loop = eventLoop
        let bound = NIOLoopBound(client, eventLoop: eventLoop)
        let stream = RequestBodyStream(expectedLength: machine.configuration.declaredLength) {
            loop.execute { bound.value.releaseReads() }
        }
        if case .buffer(let buffered) = body, !stream.append(buffered) { client.holdReads() }
        body = .stream(stream)
        releaseKeptBody()
        perform(machine.streamingBegan(now: now))
    }

    // MARK: performing actions

    /// Performs one action of the machine. `reportedHead` is the head just given to `responseHead`: its
    /// `.deliverHead` refers to it rather than carrying a copy.
    func perform(_ action: ExchangeStateMachine.Action, reportedHead: UpstreamResponseHead? = nil) {
        switch action {
        case .none, .storeBody, .storeBodyAndBeginStreaming:
            break
        case .beginStreaming:
            beginStreaming()
        case .finishBodyStream:
            if case .stream(let stream) = body { stream.finish() }
        case .acquireCredential:
            acquireCredential()
        case .startAttempt(let generation, let credential, let mayResend):
            startAttempt(generation: generation, credential: credential, mayResend: mayResend)
        case .refreshCredential(let rejected):
            guard case .oauth2(let manager, _)? = destination.upstream?.auth else { break }
            traceAttemptEnded(failure: nil)
            let bound = NIOLoopBound(self, eventLoop: eventLoop)
            let loop = eventLoop
            let trace = self.trace
            Task {
                let (replacement, refresh) = await manager.tokenRejected(rejected, trace: trace)
                loop.execute {
                    let exchange = bound.value
                    exchange.traceWaited(on: refresh)
                    exchange.perform(exchange.machine.refreshFinished(replacement, now: exchange.now))
                }
            }
        case .retry(let delay, let reason, let disposal):
            retry(after: delay, reason: reason, disposal: disposal)
        case .deliverHead(let error):
            guard let reportedHead else {
                assertionFailure("deliverHead is only returned by responseHead, performed with its head")
                break
            }
            deliverHead(reportedHead, error: error)
        case .deliverHeldHead(let upstreamHead, let error, let replay):
            deliverHead(upstreamHead, error: error)
            if !replay.isEmpty { handle(replay, generation: transferGeneration) }
        case .relayBody(let buffer):
            relayBody(buffer)
        case .completeResponse(let requestComplete):
            let (tail, short) = relay?.end(allocator: client.allocator) ?? (nil, false)
            if short {
                perform(machine.responseFellShort())
                return
            }
            if case .stream(let stream) = body, !requestComplete { stream.fail() }
            finish(note: nil)
            client.writeResponseEnd(
                tail: tail, requestComplete: requestComplete, close: relay?.framing.endsConnection ?? false)
        case .abortResponse(let note):
            stopTransferAndBody()
            finish(note: note)
            client.flush()
            client.abortResponse()
        case .failLocally(let reason, let requestComplete):
            stopTransferAndBody()
            finish(note: reason.rawValue)
            client.exchangeFailed(
                reason, requestComplete: requestComplete,
                attempts: machine.attempts > 0 ? machine.attempts : nil)
        case .cancel:
            stopTransferAndBody()
            finish(note: "client-closed")
        }
        if let deadline = machine.nextDeadline { client.wakeUp(at: deadline) }
    }
}

extension Exchange {
    /// The body is no longer kept for replay (it became a stream, or the exchange ended).
    func releaseKeptBody() {
        environment.runtime.releaseBodyMemory(keptBodyBytes)
        keptBodyBytes = 0
    }
}

/// The request body as the exchange holds it: kept for replay, or streamed to the transport as it arrives.
enum RequestBodyStorage {
    case none
    case buffer(ByteBuffer)
    case stream(RequestBodyStream)
}

extension RetryCondition {
    /// A condition below HTTP (a failed connection, reset or timeout) rather than a status.
    var isTransportCondition: Bool {
        if case .status = self { return false }
        return true
    }
}
