import BackstopCore
import NIOCore
import NIOHTTP1

/// The request decoder of the proxy's client connections: `HTTP1RequestReader`'s events as the
/// `ClientRequestPart`s the proxy handler takes (docs/reference/behaviour.md#request-syntax). It replaced NIO's
/// `HTTPRequestDecoder` (llhttp and a callback per span): one pass over a head's bytes, strings made once from bytes
/// already checked.
///
/// A handler of its own rather than a `ByteToMessageDecoder` in NIO's `ByteToMessageHandler`, which cost ~2,000
/// instructions per request in its generic buffering and decode loop (docs/performance.md#reference-counting-per-request).
/// It keeps that handler's contract, which the proxy handler and the hand-overs rely on:
/// - every part the bytes hold goes out at once, a request's end right after its head or last body bytes (the
///   handler acts on a request without a body when its end arrives); bytes that end mid-part wait for the next read;
/// - a malformed request fires its `HTTPParserError` once, and bytes after it fire
///   `ByteToMessageDecoderError.dataReceivedInErrorState`;
/// - at the end of input a request cut short fires `HTTPParserError.invalidEOFState`;
/// - taken out of the pipeline (a `CONNECT` or upgrade hand-over), it leaves on the next loop turn, and what the
///   client sent after the `CONNECT` or upgrade message goes on, unread, to the handler after it.
///
/// Parts go to the proxy handler behind it by a direct call (`deliver(to:)`) rather than `fireChannelRead`, which
/// boxed each part in `NIOAny` (an allocation: a part is larger than an existential's inline buffer) and cast it
/// back in the handler, ~1,300 instructions per request (docs/performance.md#smaller-per-request-costs).
final class ClientRequestDecoder: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ClientRequestPart

    private var reader: HTTP1RequestReader
    /// Bytes left when the decoder leaves the pipeline go on to the next handler (`false`: dropped).
    private let forwardsLeftOverBytes: Bool
    /// Bytes received and not yet decoded (nil: none).
    private var buffer: ByteBuffer?
    /// True while parts are being handed on: a read that arrives meanwhile (re-entrantly) is appended and decoded by
    /// the loop already running.
    private var decoding = false
    private var state = State.active
    /// The proxy handler right behind this decoder, which takes parts by a direct call; nil: parts go through the
    /// pipeline. Cut when either leaves the pipeline, so a part never passes a handler a hand-over put between them.
    private var receiver: ProxyHandler?

    private enum State {
        case active
        /// The decoder refused the bytes; every later read is reported, none decoded.
        case failed(HTTPParserError)
        /// Removed, or the input ended: nothing more is decoded.
        case done
    }

    /// `maxHeadBytes`: see `limits(_:)`.
    init(maxHeadBytes: Int, forwardsLeftOverBytes: Bool) {
        self.reader = HTTP1RequestReader(maxHeadBytes: maxHeadBytes)
        self.forwardsLeftOverBytes = forwardsLeftOverBytes
    }

    /// The decoder's cap on a head. It must not undercut `limits.max_header_bytes`, which the proxy handler
    /// enforces with a 431 of its own; 80 KiB is the cap NIO's decoder had.
    static func maxHeadBytes(_ limits: Limits) -> Int { max(80 << 10, limits.maxHeaderBytes) }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var bytes = unwrapInboundIn(data)
        switch state {
        case .active:
            break
        case .failed(let error):
            context.fireErrorCaught(ByteToMessageDecoderError.dataReceivedInErrorState(error, bytes))
            return
        case .done:
            return
        }
        if buffer == nil {
            buffer = bytes
        } else {
            // What was decoded goes once it is over half the buffer (NIO's decoder's rule), so that a head that
            // arrives in pieces does not keep every earlier read's bytes.
            if buffer!.readerIndex > 1024 && buffer!.readerIndex > buffer!.capacity / 2 { buffer!.discardReadBytes() }
            buffer!.writeBuffer(&bytes)
        }
        guard !decoding else { return }
        decodeParts(context: context)
    }

    func channelInactive(context: ChannelHandlerContext) {
        finish(context: context, seenEOF: true)
        context.fireChannelInactive()
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if event as? ChannelEvent == .some(.inputClosed) { finish(context: context, seenEOF: true) }
        context.fireUserInboundEventTriggered(event)
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        if case .active = state { state = .done }
        receiver?.partSource = nil
        receiver = nil
    }

    /// Hands parts to `handler` directly from now on. It must be the handler added right after this decoder
    /// (`ProxyServer.addProxyHandlers`, an intercepted connection's hand-over).
    func deliver(to handler: ProxyHandler) {
        receiver = handler
        handler.partSource = self
    }

    /// The link the handler cuts when it leaves before the decoder (a hand-over puts other handlers behind it).
    func stopDelivering() { receiver = nil }

    private func deliver(_ part: ClientRequestPart, context: ChannelHandlerContext) {
        if let receiver {
            receiver.partArrived(part)
        } else {
            context.fireChannelRead(wrapInboundOut(part))
        }
    }

    func removeHandler(context: ChannelHandlerContext, removalToken: ChannelHandlerContext.RemovalToken) {
        // On the next turn of the loop, as NIO's decoder leaves: a hand-over adds the handlers that take the
        // connection over first, and they get the bytes left here.
        context.eventLoop.assumeIsolated().execute {
            self.finish(context: context, seenEOF: false)
            context.leavePipeline(removalToken: removalToken)
        }
    }

    /// Hands on every part the buffered bytes hold.
    private func decodeParts(context: ChannelHandlerContext) {
        decoding = true
        defer { decoding = false }
        while case .active = state {
            var offset = 0
            let event: HTTP1RequestReader.Event
            var slice: ByteBuffer?
            // Taken and put back before any part is handed on: a read can only come in (re-entrantly) while one
            // is, and then finds what is left here to append to.
            if var bytes = buffer {
                buffer = nil  // the only reference while it is read from
                event = bytes.withUnsafeReadableBytes { reader.next($0, at: &offset) }
                // Sliced before the bytes are taken: a slice must lie within the readable bytes.
                if case .body(let range) = event {
                    slice = bytes.getSlice(at: bytes.readerIndex + range.lowerBound, length: range.count)
                }
                bytes.moveReaderIndex(forwardBy: offset)
                if bytes.readableBytes > 0 { buffer = bytes }
            } else {
                // No bytes left, and still an event may be due: the end of a request whose last bytes were read.
                event = reader.next(UnsafeRawBufferPointer(start: nil, count: 0), at: &offset)
            }
            switch event {
            case .needMore:
                return
            case .head(let head):
                deliver(.head(Self.requestHead(head, keepAlive: reader.keepAlive)), context: context)
            case .body:
                deliver(.body(slice!), context: context)
            case .end(let trailers):
                deliver(.end(trailers.map { HTTPHeaders($0) }), context: context)
            case .invalid(let error):
                let parserError = Self.parserError(error)
                state = .failed(parserError)
                buffer = nil
                context.fireErrorCaught(parserError)
                return
            }
        }
    }

    /// The input ended (`seenEOF`) or the decoder leaves the pipeline: the parts still in the buffer go out, a
    /// request cut short by the end of input is an error, and after a `CONNECT` or upgrade message the bytes left
    /// go on to the next handler.
    private func finish(context: ChannelHandlerContext, seenEOF: Bool) {
        guard case .active = state else { return }
        if !reader.stopped {
            decodeParts(context: context)
            guard case .active = state else { return }
            // A connection that ends inside a request: as NIO's decoder did (llhttp's "invalid EOF state").
            if seenEOF, reader.inRequest {
                state = .failed(.invalidEOFState)
                context.fireErrorCaught(HTTPParserError.invalidEOFState)
                return
            }
        }
        state = .done
        // Only what follows a CONNECT or upgrade message is handed on: the start of a head that did not complete
        // is not (llhttp had taken it).
        let left = buffer
        buffer = nil
        if reader.stopped, let left, left.readableBytes > 0, !seenEOF, forwardsLeftOverBytes {
            context.fireChannelRead(NIOAny(left))
        }
    }

    static func requestHead(_ head: HTTP1RequestHead, keepAlive: Bool) -> ClientRequestHead {
        ClientRequestHead(
            method: method(head.method), uri: head.target, version: head.minorVersion == 1 ? .http1_1 : .http1_0,
            headers: head.fields, isKeepAlive: keepAlive)
    }

    /// NIO's own case for each method (the handler tests methods by case: `HTTPMethod+Cases`).
    static func method(_ method: HTTP1Method) -> HTTPMethod {
        switch method {
        case .delete: .DELETE
        case .get: .GET
        case .head: .HEAD
        case .post: .POST
        case .put: .PUT
        case .connect: .CONNECT
        case .options: .OPTIONS
        case .trace: .TRACE
        case .copy: .COPY
        case .lock: .LOCK
        case .mkcol: .MKCOL
        case .move: .MOVE
        case .propfind: .PROPFIND
        case .proppatch: .PROPPATCH
        case .search: .SEARCH
        case .unlock: .UNLOCK
        case .bind: .BIND
        case .rebind: .REBIND
        case .unbind: .UNBIND
        case .acl: .ACL
        case .report: .REPORT
        case .mkactivity: .MKACTIVITY
        case .checkout: .CHECKOUT
        case .merge: .MERGE
        case .msearch: .MSEARCH
        case .notify: .NOTIFY
        case .subscribe: .SUBSCRIBE
        case .unsubscribe: .UNSUBSCRIBE
        case .patch: .PATCH
        case .purge: .PURGE
        case .mkcalendar: .MKCALENDAR
        case .link: .LINK
        case .unlink: .UNLINK
        case .source: .SOURCE
        case .query: .RAW(value: "QUERY")
        }
    }

    /// The error the proxy handler answers (`headerOverflow`: 431, any other: 400), as NIO's decoder threw them.
    static func parserError(_ error: HTTP1RequestError) -> HTTPParserError {
        switch error {
        case .headTooLarge: .headerOverflow
        case .method: .invalidMethod
        case .target: .invalidURL
        case .version: .invalidVersion
        case .field: .invalidHeaderToken
        case .lineEnding: .lfExpected
        case .framing: .unexpectedContentLength
        case .chunk: .invalidChunkSize
        case .afterClose: .closedConnection
        }
    }
}

@available(*, unavailable)
extension ClientRequestDecoder: Sendable {}
