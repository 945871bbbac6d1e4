import BackstopCore
import BackstopTracing
import BackstopTransport
import NIOCore
import NIOHTTP1

/// The per-connection handler: feeds `ConnectionStateMachine` the connection's events and performs its decisions,
/// admits each request head (`RequestAdmission`), answers what Backstop answers itself
/// (docs/reference/errors.md) and hands everything else to an `Exchange`, for which it is the `ExchangeClient`.
///
/// Responses are written as bytes (`ResponseHeadWriter`): the pipeline has a request decoder but no response
/// encoder. One lazily re-armed timer serves the connection's deadlines and the exchange's: it is scheduled only
/// when a deadline comes earlier than the pending one, so a busy connection does not schedule one per request.
final class ProxyHandler: ChannelDuplexHandler, RemovableChannelHandler, ExchangeClient {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    let runtime: ProxyRuntime
    /// Only the event loop touches it, and every decision returns before the handler acts on it.
    var connection: ConnectionStateMachine
    var context: ChannelHandlerContext?
    var exchange: Exchange?
    /// Small response bytes written but held back until the next flush, so that what follows them is appended:
    /// a head and a small body leave as one buffer, one write through the pipeline instead of two
    /// (`writeResponse`). Only the event loop touches it.
    var heldResponse: ByteBuffer?
    private var timer: Scheduled<Void>?
    private var timerFiresAt: Duration?
    /// The client's address for access lines.
    var clientAddress = "-"
    /// Facts of the current request that its responses depend on.
    private(set) var closeAfterResponse = false
    var clientIsHTTP10 = false
    var requestIsHead = false

    /// Set on the handler of an intercepted connection: every request inside is for this host.
    let intercepted: InterceptedConnection?
    /// The head deadline in front of the decoder (`limits.header_timeout`), told when heads start and end.
    let headTimer: HeadTimeoutHandler?
    /// Who the kernel says the client is, asked the first time a `clients` decision needs it (`groups`: with the
    /// user's groups, which only `unix_group` entries need).
    private var peer: (connection: ClientConnection, groups: Bool)?

    init(
        runtime: ProxyRuntime, idleTimeout: Duration, headTimer: HeadTimeoutHandler?,
        intercepted: InterceptedConnection? = nil
    ) {
        self.runtime = runtime
        self.intercepted = intercepted
        self.headTimer = headTimer
        self.connection = ConnectionStateMachine(idleTimeout: idleTimeout, now: runtime.clock.monotonic())
    }

    var now: Duration { runtime.clock.monotonic() }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        // An intercepted connection's handler joins a channel that is already active: no channelActive follows.
        if let intercepted {
            clientAddress = intercepted.client
            armTimer()
        }
    }
    func handlerRemoved(context: ChannelHandlerContext) { self.context = nil }

    func channelActive(context: ChannelHandlerContext) {
        runtime.clientConnected()
        if let address = context.channel.remoteAddress {
            if case .unixDomainSocket = address {
                clientAddress = "unix"
            } else {
                clientAddress = address.displayString
            }
        }
        armTimer()
        context.fireChannelActive()
    }

    func channelInactive(context: ChannelHandlerContext) {
        runtime.clientDisconnected()
        timer?.cancel()
        timer = nil
        timerFiresAt = nil
        exchange?.clientGone()
        exchange = nil
        connection.close()
        context.fireChannelInactive()
    }

    func read(context: ChannelHandlerContext) {
        if connection.readRequested() { context.read() }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let part = unwrapInboundIn(data)
        guard connection.partArrived(part) == .process else { return }
        process(part, context: context)
    }

    private func process(_ part: HTTPServerRequestPart, context: ChannelHandlerContext) {
        // One clock reading per part, shared by the connection and the exchange.
        let now = self.now
        switch part {
        case .head(let head):
            headTimer?.headReceived()
            connection.headArrived(now: now)
            armTimer()
            handleHead(head, context: context, now: now)
        case .body(let buffer):
            if connection.bodyArrived(now: now) { exchange?.receiveBody(buffer, now: now) }
        case .end:
            if connection.endArrived() { exchange?.receiveEnd(now: now) }
            requestMayBeDone(now: now)
        }
    }

    /// Once a request and its response are both done, the next queued request (if any) starts. `now` is the
    /// caller's reading (one clock read per event, not one per step).
    func requestMayBeDone(now: Duration) {
        if connection.requestMayBeDone(now: now) { context?.read() }
        if case .idle = connection.state { headTimer?.awaitNextHead() }
        guard let context, context.channel.isActive else { return }
        while let part = connection.nextQueuedPart() { process(part, context: context) }
        armTimer()
    }

    /// A request head that did not complete within `limits.header_timeout` (`HeadTimeoutHandler`): 408, closed.
    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        guard event is HeadTimeoutHandler.Expired else {
            context.fireUserInboundEventTriggered(event)
            return
        }
        guard connection.state != .closing, !connection.responseInProgress else { return }
        clientIsHTTP10 = false
        requestIsHead = false
        logLocalAnswer(
            .requestTimeout, method: "-", host: "-", path: "-",
            reason: "request head not complete within limits.header_timeout")
        sendLocalError(.requestTimeout, close: true)
    }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        exchange?.clientGone()
        exchange = nil
        // After an answer that closes the connection, what the client still sends is not another request (it is
        // the rest of a refused body): nothing more is answered or logged, and the answer is left to finish.
        if connection.state == .closing { return }
        guard let parserError = error as? HTTPParserError, !connection.responseInProgress else {
            connection.close()
            context.close(promise: nil)
            return
        }
        let reason: ProxyErrorReason = parserError == .headerOverflow ? .headersTooLarge : .badRequest
        clientIsHTTP10 = false
        requestIsHead = false
        logLocalAnswer(reason, method: "-", host: "-", path: "-")
        sendLocalError(reason, close: true)
    }

    /// The connection leaves this handler (a tunnel or interception takes it over): no deadline of ours fires.
    func cancelTimer() {
        timer?.cancel()
        timer = nil
        timerFiresAt = nil
    }

    // MARK: the timer

    /// Arms the timer for the connection's own deadline; the exchange arms it for its deadlines through `wakeUp`.
    private func armTimer() {
        if let deadline = connection.nextDeadline { wakeUp(at: deadline) }
    }

    func wakeUp(at deadline: Duration) {
        // `timerFiresAt` is set exactly while `timer` is armed: the common case returns before anything is retained.
        if let firesAt = timerFiresAt, firesAt <= deadline { return }
        guard let context else { return }
        timer?.cancel()
        timerFiresAt = deadline
        let loopBound = NIOLoopBound(self, eventLoop: context.eventLoop)
        let delay = deadline - now
        timer = context.eventLoop.scheduleTask(in: .nanoseconds(max(delay.nanosecondsClamped, 0))) {
            loopBound.value.timerFired()
        }
    }

    /// Whatever is due runs; whatever is still to come re-arms the timer (the exchange re-arms its own).
    private func timerFired() {
        timer = nil
        timerFiresAt = nil
        exchange?.timerFired()
        switch connection.timerFired(now: now) {
        case .closeIdle:
            context?.close(promise: nil)
            return
        case .requestStalled:
            if let exchange {
                exchange.clientStalled()
            } else if !connection.responseInProgress {
                logLocalAnswer(.requestTimeout, method: "-", host: "-", path: "-")
                sendLocalError(.requestTimeout, close: true)
            } else {
                abortResponse()
            }
        case .wait:
            break
        }
        armTimer()
    }

    // MARK: request heads

    private func handleHead(_ head: HTTPRequestHead, context: ChannelHandlerContext, now: Duration) {
        let snapshot = runtime.snapshot
        closeAfterResponse = !head.isKeepAlive
        clientIsHTTP10 = head.version.major == 1 && head.version.minor == 0
        requestIsHead = head.method.isHEAD
        switch RequestAdmission.decide(head, snapshot: snapshot, draining: runtime.isDraining, intercepted: intercepted)
        {
        case .reject(let reason, let close):
            refuse(reason, head: head, close: close || !head.isKeepAlive)
        case .connect:
            handleConnect(head, snapshot: snapshot, context: context)
        case .accept(let accepted):
            let clientEntry: String?
            switch clientDecision(head, destination: accepted.destination, snapshot: snapshot, context: context) {
            case .allow(let entry): clientEntry = entry
            case nil: clientEntry = nil
            case .deny:
                refuse(.clientDenied, head: head, close: accepted.framing.hasBody || !head.isKeepAlive)
                return
            case .challenge:
                refuse(.proxyAuthRequired, head: head, close: accepted.framing.hasBody || !head.isKeepAlive)
                return
            }
            if upgradeIfAsked(head, accepted, clientEntry: clientEntry, context: context) { return }
            let configuration = RequestAdmission.exchangeConfiguration(head, accepted, snapshot: snapshot)
            let exchange = Exchange(
                configuration: configuration, head: head,
                target: accepted.target, destination: accepted.destination, client: self,
                environment: ExchangeEnvironment(
                    runtime: runtime, accessLog: snapshot.config.log.accessLog,
                    bufferMemory: snapshot.config.limits.bufferMemory),
                eventLoop: context.eventLoop,
                record: AccessRecord.Request(
                    client: clientAddress, method: configuration.method, host: accepted.clientHost,
                    path: accepted.target.path, clientEntry: clientEntry),
                now: now)
            self.exchange = exchange
            if accepted.framing.hasBody,
                head.headers.first(name: "expect")?.caseInsensitiveEquals("100-continue") == true
            {
                var interim = context.channel.allocator.buffer(capacity: 32)
                ResponseHeadWriter.writeStatusLine(&interim, clientIsHTTP10: clientIsHTTP10, status: 100)
                interim.writeStaticString("\r\n")
                context.writeAndFlush(wrapOutboundOut(interim), promise: nil)
            }
            exchange.start(now: now)
        }
    }

    /// The `clients` decision for a request (or `CONNECT`) to `target` (docs/reference/config.md#clients); nil when
    /// no `clients` section is in force. Inside an intercepted connection the `CONNECT`'s `Proxy-Authorization`
    /// stands for requests that carry none.
    func clientDecision(
        _ head: HTTPRequestHead, destination: ExchangeDestination, snapshot: ConfigSnapshot,
        context: ChannelHandlerContext
    ) -> ClientDecision? {
        guard snapshot.clients != nil else { return nil }
        let target: ClientTarget = destination.upstream.map { .upstream($0.config.name) } ?? .unrouted
        return clientDecision(head, target: target, snapshot: snapshot, context: context)
    }

    func clientDecision(
        _ head: HTTPRequestHead, target: ClientTarget, snapshot: ConfigSnapshot, context: ChannelHandlerContext
    ) -> ClientDecision? {
        guard let policy = snapshot.clients else { return nil }
        if peer == nil || (policy.usesGroups && peer?.groups == false) {
            peer = (ClientIdentification.connection(of: context.channel, groups: policy.usesGroups), policy.usesGroups)
        }
        let authorization = head.headers.first(name: "proxy-authorization") ?? intercepted?.proxyAuthorization
        return policy.decide(connection: peer!.connection, proxyAuthorization: authorization, target: target)
    }

    /// Answers a request with a Backstop error before any exchange, and ignores its body.
    private func refuse(_ reason: ProxyErrorReason, head: HTTPRequestHead, close: Bool) {
        connection.discardRequest()
        runtime.metrics.recordRequest(upstream: "-", status: reason.status, seconds: 0)
        let target = RequestTarget.parse(head.uri)
        let host: String
        if let target, case .absolute(_, let urlHost, _) = target.form {
            host = urlHost
        } else {
            host = head.headers.first(name: "host") ?? "-"
        }
        let request = AccessRecord.Request(
            client: clientAddress, method: head.method.rawValue, host: host, path: AccessRecord.path(of: head.uri))
        if let tracer = runtime.tracer {
            // A refused request is a request too: its server span, with the reason (docs/reference/operations.md#tracing).
            let now = self.now
            tracer.startRequest(headers: head.headers, at: now).finish(
                RequestFacts(
                    head, request, target: target, status: reason.status, upstream: nil, errorReason: reason.rawValue,
                    attempts: 0), at: now)
        }
        logLocalAnswer(reason, method: request.method, host: request.host, path: request.path)
        sendLocalError(reason, close: close)
    }

    func logLocalAnswer(
        _ reason: ProxyErrorReason, method: String, host: String, path: String, reason detail: String? = nil
    ) {
        runtime.logAccess(
            AccessRecord(
                request: AccessRecord.Request(client: clientAddress, method: method, host: host, path: path),
                status: reason.status, error: reason.rawValue, reason: detail, upstream: "-", attempts: 0, retries: [],
                elapsed: .zero, bytes: 0), enabled: runtime.snapshot.config.log.accessLog)
    }

    /// `message` replaces the reason's usual one-line body.
    func sendLocalError(_ reason: ProxyErrorReason, close: Bool, attempts: Int? = nil, message: String? = nil) {
        guard let context else { return }
        writeHeldResponse(context)
        var buffer = context.channel.allocator.buffer(capacity: 256)
        ResponseHeadWriter.localError(
            reason, into: &buffer, clientIsHTTP10: clientIsHTTP10,
            connection: close ? .close : (clientIsHTTP10 ? .keepAlive : .none), omitBody: requestIsHead,
            attempts: attempts, message: message)
        // The state changes before the write: a write that completes at once closes the channel at once, and
        // what the decoder reports then must find the connection closing.
        let now = self.now
        let resumeReading = connection.responseEnded(close: close, now: now)
        let done = context.writeAndFlush(wrapOutboundOut(buffer))
        if close {
            let channel = context.channel
            done.whenComplete { _ in channel.close(promise: nil) }
        }
        if resumeReading { context.read() }
        requestMayBeDone(now: now)
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable { exchange?.clientWritable() }
        context.fireChannelWritabilityChanged()
    }
}
