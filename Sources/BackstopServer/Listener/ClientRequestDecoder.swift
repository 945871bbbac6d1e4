import BackstopCore
import NIOCore
import NIOHTTP1

/// The request decoder of the proxy's client connections: `HTTP1RequestReader`'s events as the
/// `HTTPServerRequestPart`s the proxy handler takes (docs/reference/behaviour.md#request-syntax). It replaced NIO's
/// `HTTPRequestDecoder` (llhttp and a callback per span): one pass over a head's bytes, strings made once from bytes
/// already checked. What the client sends after a `CONNECT` or upgrade message stays in the `ByteToMessageHandler`
/// and is handed on, unread, to the handler that takes the connection over when this one leaves the pipeline.
final class ClientRequestDecoder: ByteToMessageDecoder {
    typealias InboundOut = HTTPServerRequestPart

    private var reader: HTTP1RequestReader
    /// Bytes left when the decoder leaves the pipeline go on to the next handler (`false`: dropped).
    private let forwardsLeftOverBytes: Bool

    /// `maxHeadBytes`: see `limits(_:)`.
    init(maxHeadBytes: Int, forwardsLeftOverBytes: Bool) {
        self.reader = HTTP1RequestReader(maxHeadBytes: maxHeadBytes)
        self.forwardsLeftOverBytes = forwardsLeftOverBytes
    }

    /// The decoder's cap on a head. It must not undercut `limits.max_header_bytes`, which the proxy handler
    /// enforces with a 431 of its own; 80 KiB is the cap NIO's decoder had.
    static func maxHeadBytes(_ limits: Limits) -> Int { max(80 << 10, limits.maxHeaderBytes) }

    func decode(context: ChannelHandlerContext, buffer: inout ByteBuffer) throws -> DecodingState {
        // Every part the bytes hold goes out now: a request's end right after its head or last body bytes, as
        // NIO's decoder did (the handler acts on a request without a body when its end arrives).
        while true {
            var offset = 0
            let event = buffer.withUnsafeReadableBytes { reader.next($0, at: &offset) }
            // Sliced before the bytes are taken: a slice must lie within the readable bytes.
            let slice: ByteBuffer? =
                if case .body(let range) = event {
                    buffer.getSlice(at: buffer.readerIndex + range.lowerBound, length: range.count)
                } else { nil }
            buffer.moveReaderIndex(forwardBy: offset)
            switch event {
            case .needMore:
                return .needMoreData
            case .head(let head):
                context.fireChannelRead(wrapInboundOut(.head(Self.requestHead(head))))
            case .body:
                context.fireChannelRead(wrapInboundOut(.body(slice!)))
            case .end(let trailers):
                context.fireChannelRead(wrapInboundOut(.end(trailers.map { HTTPHeaders($0) })))
            case .invalid(let error):
                throw Self.parserError(error)
            }
        }
    }

    func decodeLast(context: ChannelHandlerContext, buffer: inout ByteBuffer, seenEOF: Bool) throws -> DecodingState {
        if !reader.stopped {
            _ = try decode(context: context, buffer: &buffer)
            // A connection that ends inside a request: as NIO's decoder did (llhttp's "invalid EOF state").
            if seenEOF, reader.inRequest { throw HTTPParserError.invalidEOFState }
        }
        // Only what follows a CONNECT or upgrade message is handed on: the start of a head that did not complete
        // is not (llhttp had taken it).
        if reader.stopped, buffer.readableBytes > 0, !seenEOF, forwardsLeftOverBytes {
            context.fireChannelRead(NIOAny(buffer))
            buffer.moveReaderIndex(to: buffer.writerIndex)
        }
        return .needMoreData
    }

    static func requestHead(_ head: HTTP1RequestHead) -> HTTPRequestHead {
        HTTPRequestHead(
            version: head.minorVersion == 1 ? .http1_1 : .http1_0, method: method(head.method), uri: head.target,
            headers: HTTPHeaders(head.fields))
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
