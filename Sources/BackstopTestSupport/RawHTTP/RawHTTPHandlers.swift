import NIOCore
import NIOHTTP1

/// Lets raw request bytes reach the socket while `HTTPResponseDecoder` still learns each request's method
/// (it must know about `HEAD` to frame the response): heads are observed upstream and swallowed here.
final class RawRequestFramer: ChannelOutboundHandler {
    typealias OutboundIn = HTTPClientRequestPart
    typealias OutboundOut = ByteBuffer

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        switch unwrapOutboundIn(data) {
        case .head, .end:
            promise?.succeed(())
        case .body(.byteBuffer(let bytes)):
            context.write(wrapOutboundOut(bytes), promise: promise)
        case .body(.fileRegion(let region)):
            context.write(NIOAny(IOData.fileRegion(region)), promise: promise)
        }
    }
}

/// Assembles decoded response parts into `RawHTTPResponse`s and reports them to the shared state. In slow-reader
/// mode (autoRead off) it requests each next socket read only after `readDelay`.
final class RawResponseCollector: ChannelInboundHandler {
    typealias InboundIn = HTTPClientResponsePart

    private let state: RawHTTPConnectionState
    private let readDelay: Duration
    private var head: RawHTTPResponseHead?
    private var body = ByteBuffer()

    init(state: RawHTTPConnectionState, readDelay: Duration) {
        self.state = state
        self.readDelay = readDelay
    }

    func channelActive(context: ChannelHandlerContext) {
        if readDelay.isPositive {
            context.read()
        }
        context.fireChannelActive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let responseHead):
            let converted = RawHTTPResponseHead(
                status: Int(responseHead.status.code),
                reason: responseHead.status.reasonPhrase,
                version: "HTTP/\(responseHead.version.major).\(responseHead.version.minor)",
                headers: responseHead.headers.map { (name: $0.name, value: $0.value) }
            )
            head = converted
            body = context.channel.allocator.buffer(capacity: 0)
            state.update { $0.heads.append(converted) }
        case .body(let part):
            let count = part.readableBytes
            body.writeImmutableBuffer(part)
            state.update { $0.bodyBytesReceived += count }
        case .end:
            guard let finishedHead = head else { return }
            let response = RawHTTPResponse(head: finishedHead, body: Array(body.readableBytesView))
            head = nil
            body = ByteBuffer()
            state.update { snapshot in
                snapshot.completed.append(response)
                snapshot.completedTotal += 1
            }
        }
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        if readDelay.isPositive && context.channel.isActive {
            context.eventLoop.assumeIsolated().scheduleTask(in: readDelay.timeAmount) {
                context.read()
            }
        }
        context.fireChannelReadComplete()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        let classified = Self.classify(error)
        state.update { snapshot in
            if snapshot.failure == nil {
                snapshot.failure = classified
            }
        }
        context.close(promise: nil)
    }

    func channelInactive(context: ChannelHandlerContext) {
        state.update { $0.isClosed = true }
        context.fireChannelInactive()
    }

    static func classify(_ error: any Error) -> RawHTTPError {
        switch error {
        case let ioError as IOError:
            return .connectionError(String(describing: ioError))
        case let channelError as ChannelError:
            return .connectionError(String(describing: channelError))
        case let decoderError as NIOHTTPDecoderError where decoderError == .unsolicitedResponse:
            return .unsolicitedResponse
        default:
            return .malformedResponse(String(describing: error))
        }
    }
}
