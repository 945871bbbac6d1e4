import BackstopCore
import BackstopTransport
import NIOCore
import NIOHTTP1

/// The per-connection handler: validates and routes each request head, answers what Backstop answers itself
/// (docs/reference/errors.md), and hands everything else to an `Exchange`.
///
/// Responses are written as bytes (`ResponseHeadWriter`): the pipeline has a request decoder but no response
/// encoder.
///
/// Requests on one connection are handled one at a time so responses leave in order. Pipelined requests that
/// arrive meanwhile are queued here rather than by NIO's pipelining handler, which stops and restarts socket
/// reads around every request (two `epoll_ctl` calls per request even when nobody pipelines); reads are held
/// only when the queue grows.
final class ProxyHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private let runtime: ProxyRuntime
    private var context: ChannelHandlerContext?
    private var exchange: Exchange?
    /// The current request is being ignored (an error response was sent; the connection closes after it).
    private var discardingRequest = false
    /// Reads are held while an upstream upload is above its high-water mark, or while pipelined requests queue.
    private var uploadHold = false
    private var queueHold = false
    private var readsHeld: Bool { uploadHold || queueHold }
    private var pendingRead = false
    /// A request is being handled: its head arrived and its response or its body has not finished yet.
    private var inFlight = false
    private var requestEnded = true
    private var responseEnded = true
    /// Parts of pipelined requests that arrived while one was in flight.
    private var queued: [HTTPServerRequestPart] = []
    private static let maxQueuedParts = 64
    /// The client asked to close after this response (`Connection: close`, or HTTP/1.0 without keep-alive).
    private(set) var closeAfterResponse = false
    /// The current request is HTTP/1.0 (its response is written as 1.0 and cannot be chunked).
    private(set) var clientIsHTTP10 = false
    /// The current request is `HEAD`: a local error response carries its head only.
    private var requestIsHead = false
    /// Whether a response is being written (head sent, end not yet).
    private var responseInProgress = false

    /// `limits.client_idle_timeout`: how long a connection may go without a complete request head.
    private let idleTimeout: TimeAmount
    /// When the connection closes unless a complete request head arrived (nil while a request is in flight).
    private var idleDeadline: NIODeadline?
    /// While a request's body is incomplete: when its last byte (or its head) arrived. No byte for
    /// `client_idle_timeout` → 408 `request-timeout` and close. Not counted while Backstop itself holds reads.
    private var bodyProgressAt: NIODeadline?
    /// One lazily re-armed timer per connection serves the idle deadline and the exchange's attempt deadline:
    /// it is scheduled only when a deadline comes earlier than the pending one, and when it fires it checks the
    /// real deadlines and re-arms for the next. A busy connection schedules one timer per deadline period instead
    /// of two per request.
    private var timer: Scheduled<Void>?
    private var timerFiresAt = NIODeadline.distantFuture

    init(runtime: ProxyRuntime, idleTimeout: TimeAmount) {
        self.runtime = runtime
        self.idleTimeout = idleTimeout
    }

    /// The client's address for access lines.
    private var clientAddress = "-"
    /// The last response said `Connection: close`: the connection ends once it is written.
    private var closing = false

    func channelActive(context: ChannelHandlerContext) {
        runtime.clientConnected()
        if let address = context.channel.remoteAddress {
            if case .unixDomainSocket = address { clientAddress = "unix" } else { clientAddress = address.displayString }
        }
        armIdleTimer(context: context)
        context.fireChannelActive()
    }

    /// Closes the connection unless a complete request head arrives in time. Measured from the end of the
    /// previous response (or the accept), not from the last byte: a client trickling a head one byte at a time
    /// (slowloris) is closed like an idle one.
    private func armIdleTimer(context: ChannelHandlerContext) {
        let deadline = NIODeadline.now() + idleTimeout
        idleDeadline = deadline
        wakeUp(at: deadline)
    }

    /// Makes sure the connection's timer fires no later than `deadline`.
    func wakeUp(at deadline: NIODeadline) {
        guard timer == nil || deadline < timerFiresAt, let context else { return }
        timer?.cancel()
        timerFiresAt = deadline
        let loopBound = NIOLoopBound(self, eventLoop: context.eventLoop)
        timer = context.eventLoop.scheduleTask(deadline: deadline) { loopBound.value.timerFired() }
    }

    private func timerFired() {
        timer = nil
        timerFiresAt = .distantFuture
        let now = NIODeadline.now()
        var next = exchange?.deadlineCheck(now: now)
        if !inFlight, let idle = idleDeadline {
            if now >= idle {
                context?.close(promise: nil)
                return
            }
            next = min(next ?? idle, idle)
        }
        if let progress = bodyProgressAt {
            if uploadHold { bodyProgressAt = now }
            let deadline = (bodyProgressAt ?? progress) + idleTimeout
            if now >= deadline {
                requestStalled()
                return
            }
            next = min(next ?? deadline, deadline)
        }
        if let next { wakeUp(at: next) }
    }

    /// The client stopped sending a request body it announced: 408 if nothing was answered yet, then close.
    private func requestStalled() {
        bodyProgressAt = nil
        if let exchange {
            exchange.clientStalled()
        } else if !responseInProgress {
            logLocalAnswer(.requestTimeout, method: "-", host: "-", path: "-")
            sendLocalError(.requestTimeout, close: true)
        } else {
            context?.close(promise: nil)
        }
    }

    func handlerAdded(context: ChannelHandlerContext) { self.context = context }
    func handlerRemoved(context: ChannelHandlerContext) { self.context = nil }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let part = unwrapInboundIn(data)
        if inFlight && (requestEnded || !queued.isEmpty) {
            queued.append(part)
            if queued.count >= Self.maxQueuedParts { queueHold = true }
            return
        }
        process(part, context: context)
    }

    private func process(_ part: HTTPServerRequestPart, context: ChannelHandlerContext) {
        switch part {
        case .head(let head):
            idleDeadline = nil
            discardingRequest = false
            inFlight = true
            requestEnded = false
            responseEnded = false
            let now = NIODeadline.now()
            bodyProgressAt = now
            wakeUp(at: now + idleTimeout)
            handleHead(head, context: context)
        case .body(let buffer):
            if bodyProgressAt != nil { bodyProgressAt = .now() }
            if discardingRequest { return }
            exchange?.receiveBody(buffer)
        case .end:
            bodyProgressAt = nil
            requestEnded = true
            if !discardingRequest { exchange?.receiveEnd() }
            requestMayBeDone()
        }
    }

    /// The response went out: once the request's body was also consumed, the next queued request starts.
    private func responseDone() {
        responseEnded = true
        requestMayBeDone()
    }

    private func requestMayBeDone() {
        guard inFlight, requestEnded, responseEnded else { return }
        inFlight = false
        guard let context, context.channel.isActive else {
            queued.removeAll()
            return
        }
        // Feed queued parts until the next request has all its parts (its body and end belong to it).
        while !queued.isEmpty, !inFlight || !requestEnded {
            process(queued.removeFirst(), context: context)
        }
        if !inFlight { armIdleTimer(context: context) }
        if queueHold && queued.count < Self.maxQueuedParts / 2 {
            queueHold = false
            resumeReadingIfAllowed()
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        runtime.clientDisconnected()
        timer?.cancel()
        timer = nil
        exchange?.clientGone()
        exchange = nil
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        if let parserError = error as? HTTPParserError {
            exchange?.clientGone()
            exchange = nil
            // After an answer that closes the connection, what the client still sends is not another request
            // (it is the rest of a refused body): nothing more is answered or logged.
            if closing { return }
            if !responseInProgress {
                let reason: ProxyErrorReason = parserError == .headerOverflow ? .headersTooLarge : .badRequest
                clientIsHTTP10 = false
                requestIsHead = false
                logLocalAnswer(reason, method: "-", host: "-", path: "-")
                sendLocalError(reason, close: true)
            } else {
                context.close(promise: nil)
            }
            return
        }
        exchange?.clientGone()
        exchange = nil
        context.close(promise: nil)
    }

    func read(context: ChannelHandlerContext) {
        if readsHeld {
            pendingRead = true
            return
        }
        context.read()
    }

    // MARK: request heads

    private func handleHead(_ head: HTTPRequestHead, context: ChannelHandlerContext) {
        let snapshot = runtime.snapshot
        let limits = snapshot.config.limits

        if runtime.isDraining {
            rejectRequest(.shuttingDown, head: head, close: true)
            return
        }
        if head.method == .CONNECT {
            rejectConnect(context: context, head: head)
            return
        }
        var headerBytes = head.uri.utf8.count
        for (name, value) in head.headers { headerBytes += name.utf8.count + value.utf8.count + 4 }
        if headerBytes > limits.maxHeaderBytes {
            rejectRequest(.headersTooLarge, head: head, close: true)
            return
        }
        guard let framing = RequestFraming(head.headers) else {
            rejectRequest(.badRequest, head: head, close: true)
            return
        }
        if let length = framing.contentLength, length > limits.maxRequestBody {
            rejectRequest(.bodyTooLarge, head: head, close: true)
            return
        }
        guard let target = RequestTarget.parse(head.uri), !target.hasDotSegment else {
            rejectRequest(.badRequest, head: head, close: true)
            return
        }
        if HeaderRewriter.backstopViaCount(in: head.headers.map { (name: $0.name, value: $0.value) })
            >= HeaderRewriter.viaLoopLimit
        {
            rejectRequest(.loopDetected, head: head, close: true)
            return
        }
        let hostHeader = head.headers.first(name: "host")
        let decision = snapshot.router.route(target: target, hostHeader: hostHeader)
        let destination: Exchange.Destination
        switch decision {
        case .noRoute:
            rejectRequest(.noRoute, head: head, close: framing.hasBody)
            return
        case .upstream(let index, let path):
            let upstream = snapshot.upstreams[index]
            // TRACE echoes the request, injected credential included, back to the client.
            if head.method == .TRACE, upstream.config.auth != .none {
                rejectRequest(.methodNotAllowed, head: head, close: framing.hasBody)
                return
            }
            destination = .upstream(upstream, path: path)
        case .passthrough(let url):
            destination = .passthrough(url: url)
        }

        closeAfterResponse = !head.isKeepAlive
        clientIsHTTP10 = head.version.major == 1 && head.version.minor == 0
        requestIsHead = head.method == .HEAD
        let clientHost: String
        if case .absolute(_, let host, _) = target.form { clientHost = host } else { clientHost = hostHeader ?? "-" }
        let exchange = Exchange(
            runtime: runtime, snapshot: snapshot, head: head, framing: framing, destination: destination,
            eventLoop: context.eventLoop, handler: self, client: clientAddress, clientHost: clientHost, target: target)
        self.exchange = exchange
        if framing.hasBody, head.headers.first(name: "expect")?.caseInsensitiveEquals("100-continue") == true {
            var interim = context.channel.allocator.buffer(capacity: 32)
            ResponseHeadWriter.writeStatusLine(&interim, clientIsHTTP10: clientIsHTTP10, status: 100)
            interim.writeStaticString("\r\n")
            context.writeAndFlush(wrapOutboundOut(interim), promise: nil)
        }
        exchange.start()
    }

    /// Answers a request with a Backstop error and ignores its body.
    private func rejectRequest(_ reason: ProxyErrorReason, head: HTTPRequestHead, close: Bool) {
        discardingRequest = true
        runtime.metrics.recordRequest(upstream: "-", status: reason.status, seconds: 0)
        let host: String
        if let target = RequestTarget.parse(head.uri), case .absolute(_, let urlHost, _) = target.form {
            host = urlHost
        } else {
            host = head.headers.first(name: "host") ?? "-"
        }
        logLocalAnswer(reason, method: head.method.rawValue, host: host, path: AccessRecord.path(of: head.uri))
        clientIsHTTP10 = head.version.major == 1 && head.version.minor == 0
        requestIsHead = head.method == .HEAD
        sendLocalError(reason, close: close || !head.isKeepAlive)
    }

    /// The access line of a request Backstop answered itself before any exchange began.
    private func logLocalAnswer(_ reason: ProxyErrorReason, method: String, host: String, path: String) {
        runtime.logAccess(AccessRecord(
            client: clientAddress, method: method, host: host, path: path, status: reason.status, error: reason.rawValue,
            reason: nil, upstream: "-", attempts: 0, retries: [], elapsed: .zero, bytes: 0),
            enabled: runtime.snapshot.config.log.accessLog)
    }

    /// CONNECT is refused with 405 and the connection closed (whatever follows would be a tunnel's bytes).
    private func rejectConnect(context: ChannelHandlerContext, head: HTTPRequestHead) {
        discardingRequest = true
        runtime.metrics.recordRequest(upstream: "-", status: ProxyErrorReason.connectNotSupported.status, seconds: 0)
        logLocalAnswer(.connectNotSupported, method: "CONNECT", host: head.uri, path: "-")
        clientIsHTTP10 = false
        requestIsHead = false
        closeAfterResponse = true
        sendLocalError(.connectNotSupported, close: true)
    }

    private func sendLocalError(_ reason: ProxyErrorReason, close: Bool, attempts: Int? = nil) {
        guard let context else { return }
        var buffer = context.channel.allocator.buffer(capacity: 256)
        ResponseHeadWriter.localError(
            reason, into: &buffer, clientIsHTTP10: clientIsHTTP10,
            connection: close ? .close : (clientIsHTTP10 ? .keepAlive : .none), omitBody: requestIsHead,
            attempts: attempts)
        let done = context.writeAndFlush(wrapOutboundOut(buffer))
        if close {
            closing = true
            queued.removeAll()
            let channel = context.channel
            done.whenComplete { _ in channel.close(promise: nil) }
        }
        responseDone()
    }

    // MARK: called by the exchange (on the event loop)

    /// The exchange answers with a Backstop error; `requestComplete` says whether the client's body was read,
    /// `attempts` how many upstream attempts were made (nil for none).
    func exchangeFailed(_ reason: ProxyErrorReason, requestComplete: Bool, attempts: Int?) {
        exchange = nil
        releaseReads()
        if !requestComplete { discardingRequest = true }
        sendLocalError(reason, close: closeAfterResponse || !requestComplete, attempts: attempts)
    }

    var allocator: ByteBufferAllocator { context?.channel.allocator ?? ByteBufferAllocator() }

    /// Whether the client socket takes more bytes without queueing past the channel's high-water mark.
    var isWritable: Bool { context?.channel.isWritable ?? false }

    /// Writes response bytes (a head, framing, body data) without flushing: the exchange flushes once per batch.
    func writeResponse(_ buffer: ByteBuffer) {
        guard let context else { return }
        responseInProgress = true
        context.write(wrapOutboundOut(buffer), promise: nil)
    }

    func flush() { context?.flush() }

    /// The response is complete (`tail` ends its framing, if any). `requestComplete` false means the client's body
    /// was not fully read; `close` that the body was delimited by closing the connection.
    func writeResponseEnd(tail: ByteBuffer?, requestComplete: Bool, close: Bool) {
        exchange = nil
        responseInProgress = false
        releaseReads()
        guard let context else { return }
        let close = close || closeAfterResponse || !requestComplete
        if !requestComplete { discardingRequest = true }
        if let tail { context.write(wrapOutboundOut(tail), promise: nil) }
        if close {
            closing = true
            queued.removeAll()
            let channel = context.channel
            context.writeAndFlush(wrapOutboundOut(channel.allocator.buffer(capacity: 0))).whenComplete { _ in
                channel.close(promise: nil)
            }
        } else {
            context.flush()
        }
        responseDone()
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable { exchange?.clientWritable() }
        context.fireChannelWritabilityChanged()
    }

    /// The response broke after its head was sent: the only honest signal left is closing the connection.
    func abortResponse() {
        exchange = nil
        responseInProgress = false
        context?.close(promise: nil)
    }

    func holdReads() { uploadHold = true }

    func releaseReads() {
        guard uploadHold else { return }
        uploadHold = false
        if bodyProgressAt != nil { bodyProgressAt = .now() }
        resumeReadingIfAllowed()
    }

    private func resumeReadingIfAllowed() {
        if !readsHeld && pendingRead {
            pendingRead = false
            context?.read()
        }
    }
}
