import NIOCore

/// Caps open client connections per listener: at the cap it stops accepting (holds the server channel's reads),
/// so further clients wait in the kernel's backlog instead of being dropped; each close lets one more in.
final class ConnectionLimiter: ChannelDuplexHandler {
    typealias InboundIn = Channel
    typealias InboundOut = Channel
    typealias OutboundIn = Never

    private let limit: Int
    private var open = 0
    private var readPending = false
    private var context: ChannelHandlerContext?

    init(limit: Int) { self.limit = max(1, limit) }

    func handlerAdded(context: ChannelHandlerContext) { self.context = context }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let child = unwrapInboundIn(data)
        open += 1
        let loopBound = NIOLoopBound(self, eventLoop: context.eventLoop)
        child.closeFuture.hop(to: context.eventLoop).whenComplete { _ in loopBound.value.connectionClosed() }
        context.fireChannelRead(data)
    }

    func read(context: ChannelHandlerContext) {
        if open >= limit {
            readPending = true
            return
        }
        context.read()
    }

    private func connectionClosed() {
        open -= 1
        if readPending && open < limit {
            readPending = false
            context?.read()
        }
    }
}
