import BackstopCore
import BackstopTransport
import NIOCore
import NIOHTTP1

/// The per-connection handler: validates and routes each request head, answers what Backstop answers itself
/// (SPEC §3 error table), and hands everything else to an `Exchange`.
///
/// Requests on one connection are handled one at a time so responses leave in order. Pipelined requests that
/// arrive meanwhile are queued here rather than by NIO's pipelining handler, which stops and restarts socket
/// reads around every request (two `epoll_ctl` calls per request even when nobody pipelines); reads are held
/// only when the queue grows.
final class ProxyHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundIn = HTTPServerResponsePart
    typealias OutboundOut = HTTPServerResponsePart

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
    private var closeAfterResponse = false
    /// Whether a response is being written (head sent, end not yet).
    private var responseInProgress = false

    /// `limits.client_idle_timeout`: how long a connection may go without a complete request head.
    private let idleTimeout: TimeAmount
    private var idleTimer: Scheduled<Void>?

    init(runtime: ProxyRuntime, idleTimeout: TimeAmount) {
        self.runtime = runtime
        self.idleTimeout = idleTimeout
    }

    func channelActive(context: ChannelHandlerContext) {
        armIdleTimer(context: context)
        context.fireChannelActive()
    }

    /// Closes the connection unless a complete request head arrives in time. Measured from the end of the
    /// previous response (or the accept), not from the last byte: a client trickling a head one byte at a time
    /// (slowloris) is closed like an idle one.
    private func armIdleTimer(context: ChannelHandlerContext) {
        idleTimer?.cancel()
        let loopBound = NIOLoopBound(self, eventLoop: context.eventLoop)
        idleTimer = context.eventLoop.scheduleTask(in: idleTimeout) {
            let handler = loopBound.value
            handler.idleTimer = nil
            if !handler.inFlight { handler.context?.close(promise: nil) }
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
            idleTimer?.cancel()
            idleTimer = nil
            discardingRequest = false
            inFlight = true
            requestEnded = false
            responseEnded = false
            handleHead(head, context: context)
        case .body(let buffer):
            if discardingRequest { return }
            exchange?.receiveBody(buffer)
        case .end:
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
        idleTimer?.cancel()
        idleTimer = nil
        exchange?.clientGone()
        exchange = nil
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        if let parserError = error as? HTTPParserError {
            exchange?.clientGone()
            exchange = nil
            if !responseInProgress {
                let reason: ProxyErrorReason = parserError == .headerOverflow ? .headersTooLarge : .badRequest
                sendLocalError(reason, version: .http1_1, close: true)
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
            rejectConnect(context: context)
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
        guard let target = RequestTarget.parse(head.uri) else {
            rejectRequest(.badRequest, head: head, close: true)
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
            destination = .upstream(snapshot.upstreams[index], path: path)
        case .passthrough(let url):
            destination = .passthrough(url: url)
        }

        closeAfterResponse = !head.isKeepAlive
        let exchange = Exchange(
            runtime: runtime, snapshot: snapshot, head: head, framing: framing, destination: destination,
            eventLoop: context.eventLoop, handler: self)
        self.exchange = exchange
        if framing.hasBody, head.headers.first(name: "expect")?.caseInsensitiveEquals("100-continue") == true {
            context.writeAndFlush(wrapOutboundOut(.head(HTTPResponseHead(version: head.version, status: .continue))),
                                  promise: nil)
        }
        exchange.start()
    }

    /// Answers a request with a Backstop error and ignores its body.
    private func rejectRequest(_ reason: ProxyErrorReason, head: HTTPRequestHead, close: Bool) {
        discardingRequest = true
        runtime.metrics.recordRequest(upstream: "-", status: reason.status, seconds: 0)
        runtime.logger.debug(
            "request rejected",
            metadata: ["reason": .string(reason.rawValue), "method": .string(head.method.rawValue)])
        sendLocalError(reason, version: head.version, close: close || !head.isKeepAlive)
    }

    /// NIO's HTTP codec treats whatever follows a CONNECT as a tunnel and frames its response without a body, so
    /// the 405 is written as raw bytes below the encoder, and the connection is closed.
    private func rejectConnect(context: ChannelHandlerContext) {
        discardingRequest = true
        let reason = ProxyErrorReason.connectNotSupported
        let body = reason.message + "\n"
        let text = "HTTP/1.1 405 Method Not Allowed\r\nContent-Type: text/plain; charset=utf-8\r\n"
            + "Content-Length: \(body.utf8.count)\r\nX-Backstop-Error: \(reason.rawValue)\r\nConnection: close\r\n\r\n"
            + body
        let channel = context.channel
        guard let encoder = try? context.pipeline.syncOperations.context(handlerType: HTTPResponseEncoder.self) else {
            channel.close(promise: nil)
            return
        }
        let buffer = channel.allocator.buffer(string: text)
        encoder.writeAndFlush(NIOAny(buffer)).whenComplete { _ in channel.close(promise: nil) }
    }

    private func sendLocalError(_ reason: ProxyErrorReason, version: HTTPVersion, close: Bool) {
        guard let context else { return }
        let body = reason.message + "\n"
        var headers = HTTPHeaders()
        headers.add(name: "Content-Type", value: "text/plain; charset=utf-8")
        headers.add(name: "Content-Length", value: String(body.utf8.count))
        headers.add(name: "X-Backstop-Error", value: reason.rawValue)
        if close { headers.add(name: "Connection", value: "close") }
        let head = HTTPResponseHead(
            version: version, status: HTTPResponseStatus(statusCode: reason.status), headers: headers)
        context.write(wrapOutboundOut(.head(head)), promise: nil)
        var buffer = context.channel.allocator.buffer(capacity: body.utf8.count)
        buffer.writeString(body)
        context.write(wrapOutboundOut(.body(.byteBuffer(buffer))), promise: nil)
        let done = context.writeAndFlush(wrapOutboundOut(.end(nil)))
        if close {
            queued.removeAll()
            let channel = context.channel
            done.whenComplete { _ in channel.close(promise: nil) }
        }
        responseDone()
    }

    // MARK: called by the exchange (on the event loop)

    /// The exchange answers with a Backstop error; `requestComplete` says whether the client's body was read.
    func exchangeFailed(_ reason: ProxyErrorReason, version: HTTPVersion, requestComplete: Bool) {
        exchange = nil
        releaseReads()
        if !requestComplete { discardingRequest = true }
        sendLocalError(reason, version: version, close: closeAfterResponse || !requestComplete)
    }

    func writeResponseHead(_ head: HTTPResponseHead) {
        guard let context else { return }
        responseInProgress = true
        var head = head
        if closeAfterResponse { head.headers.replaceOrAdd(name: "Connection", value: "close") }
        context.write(wrapOutboundOut(.head(head)), promise: nil)
    }

    func writeResponseBody(_ buffer: ByteBuffer, written: @escaping @Sendable () -> Void) {
        guard let context else { return }
        let promise = context.eventLoop.makePromise(of: Void.self)
        promise.futureResult.whenComplete { _ in written() }
        context.writeAndFlush(wrapOutboundOut(.body(.byteBuffer(buffer))), promise: promise)
    }

    func flush() { context?.flush() }

    /// The response is complete. `requestComplete` false means the client's body was not fully read.
    func writeResponseEnd(requestComplete: Bool) {
        exchange = nil
        responseInProgress = false
        releaseReads()
        guard let context else { return }
        let close = closeAfterResponse || !requestComplete
        if !requestComplete { discardingRequest = true }
        let done = context.writeAndFlush(wrapOutboundOut(.end(nil)))
        if close {
            queued.removeAll()
            let channel = context.channel
            done.whenComplete { _ in channel.close(promise: nil) }
        }
        responseDone()
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
        resumeReadingIfAllowed()
    }

    private func resumeReadingIfAllowed() {
        if !readsHeld && pendingRead {
            pendingRead = false
            context?.read()
        }
    }
}

/// How a request's body is framed, checked against smuggling (RFC 9112 §6.3).
struct RequestFraming {
    var contentLength: Int?
    var chunked: Bool
    var hasBody: Bool { chunked || (contentLength ?? 0) > 0 }

    init?(_ headers: HTTPHeaders) {
        var lengths: [String] = []
        var encodings: [Substring] = []
        for (name, value) in headers {
            if name.caseInsensitiveEquals("content-length") {
                for part in value.split(separator: ",", omittingEmptySubsequences: false) {
                    lengths.append(part.trimmingASCIISpaces())
                }
            } else if name.caseInsensitiveEquals("transfer-encoding") {
                encodings += value.split(separator: ",", omittingEmptySubsequences: false)
            }
        }
        if !lengths.isEmpty && !encodings.isEmpty { return nil }
        if !encodings.isEmpty {
            // Only a lone "chunked" is acceptable; "chunked, identity" and friends are smuggling vectors.
            guard encodings.count == 1, encodings[0].trimmingASCIISpaces().caseInsensitiveEquals("chunked") else {
                return nil
            }
            chunked = true
            contentLength = nil
            return
        }
        chunked = false
        if lengths.isEmpty {
            contentLength = nil
            return
        }
        let distinct = Set(lengths)
        guard distinct.count == 1, let value = distinct.first, !value.isEmpty,
            value.utf8.allSatisfy({ $0 >= 48 && $0 <= 57 }), value.utf8.count <= 18, let length = Int(value)
        else { return nil }
        contentLength = length
    }
}

extension StringProtocol {
    /// Trims spaces and tabs (HTTP optional whitespace).
    func trimmingASCIISpaces() -> String {
        var s = self[...]
        while let f = s.first, f == " " || f == "\t" { s = s.dropFirst() }
        while let l = s.last, l == " " || l == "\t" { s = s.dropLast() }
        return String(s)
    }
}
