import BackstopCore
import NIOCore

/// First in an intercepted connection's pipeline: reads the client's ClientHello as it arrives
/// (`ClientHelloReader`), hands what it names to `decided`, and once the future `decided` returns succeeds, leaves
/// the pipeline; the bytes it held then go on to the TLS handler `decided` installed. Takes the place of SwiftNIO's
/// `SNIHandler`, which could not tell a ClientHello without a name from one it could not read
/// (`ClientHelloServerName`).
///
/// Event-loop confined, like every handler.
final class ClientHelloNameHandler: ByteToMessageDecoder {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer

    private let decided: (ClientHelloServerName) -> EventLoopFuture<Void>
    private var reader = ClientHelloReader()
    /// How many of the held bytes the reader has seen (the buffer is held whole, never consumed here).
    private var seen = 0
    private var waiting = false

    init(decided: @escaping (ClientHelloServerName) -> EventLoopFuture<Void>) {
        self.decided = decided
    }

    func decode(context: ChannelHandlerContext, buffer: inout ByteBuffer) -> DecodingState {
        guard !waiting, buffer.readableBytes > seen else { return .needMoreData }
        let answer = buffer.withUnsafeReadableBytes { reader.read($0[seen...]) }
        seen = buffer.readableBytes
        if case .needMore = answer { return .needMoreData }
        waiting = true
        let bound = NIOLoopBound(context, eventLoop: context.eventLoop)
        decided(answer).hop(to: context.eventLoop).whenSuccess {
            let context = bound.value
            context.pipeline.syncOperations.removeHandler(context: context, promise: nil)
        }
        return .needMoreData
    }

    func decodeLast(context: ChannelHandlerContext, buffer: inout ByteBuffer, seenEOF: Bool) -> DecodingState {
        // The client closed before its ClientHello was complete: what it sent goes on, and the connection's close
        // is logged by the observer behind.
        context.fireChannelRead(wrapInboundOut(buffer))
        buffer.moveReaderIndex(to: buffer.writerIndex)
        return .needMoreData
    }
}

@available(*, unavailable)
extension ClientHelloNameHandler: Sendable {}
