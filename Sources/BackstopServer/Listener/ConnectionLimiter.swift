import NIOCore

/// Caps open client connections per listener. At the cap it stops accepting (holds the server channel's reads),
/// so further clients wait in the kernel's backlog instead of being dropped; each close lets one more in.
///
/// One read of the server socket may accept several connections at once (`maxMessagesPerRead`); those past the
/// cap are held here, not yet handed to the bootstrap (so not read from or answered), until a slot frees.
final class ConnectionLimiter: ChannelDuplexHandler {
    typealias InboundIn = Channel
    typealias InboundOut = Channel
    typealias OutboundIn = Never

    private let limit: Int
    private var open = 0
    /// Accepted past the cap, oldest first.
    private var held: [Channel] = []
    private var readPending = false
    private var context: ChannelHandlerContext?

    init(limit: Int) { self.limit = max(1, limit) }

    func handlerAdded(context: ChannelHandlerContext) { self.context = context }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let child = unwrapInboundIn(data)
        guard open < limit else {
            held.append(child)
            return
        }
        admit(child, context: context)
    }

    private func admit(_ child: Channel, context: ChannelHandlerContext) {
        open += 1
        let loopBound = NIOLoopBound(self, eventLoop: context.eventLoop)
        child.closeFuture.hop(to: context.eventLoop).whenComplete { _ in loopBound.value.connectionClosed() }
        context.fireChannelRead(wrapInboundOut(child))
    }

    func read(context: ChannelHandlerContext) {
        if open + held.count >= limit {
            readPending = true
            return
        }
        context.read()
    }

    func channelInactive(context: ChannelHandlerContext) {
        for child in held { child.close(promise: nil) }
        held.removeAll()
        context.fireChannelInactive()
    }

    private func connectionClosed() {
        open -= 1
        guard let context else { return }
        if !held.isEmpty {
            admit(held.removeFirst(), context: context)
            return
        }
        if readPending && open < limit {
            readPending = false
            context.read()
        }
    }
}
