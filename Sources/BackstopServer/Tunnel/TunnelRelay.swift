import BackstopCore
import Logging
import NIOCore

/// One blind tunnel once it is established: two channels on one event loop, glued by a pair of `TunnelGlueHandler`s
/// that copy bytes both ways with backpressure in both directions (a side is read only while the other side can
/// take what it reads). Nothing is parsed. Ends when both directions are closed, when either side fails or closes
/// completely, or after `idleTimeout` without a byte either way; then logs one `tunnel` access line
/// (docs/reference/operations.md#logs) and updates the tunnel metrics.
///
/// Event-loop confined: both channels and every callback run on `eventLoop`.
final class TunnelRelay {
    struct Description {
        var client: String
        var target: ConnectTarget
        /// The resolved address connected to.
        var address: String
        /// The `clients` entry that allowed the tunnel.
        var clientEntry: String? = nil
    }

    private let description: Description
    private let eventLoop: EventLoop
    private let clock: any BackstopClock
    private let idleTimeout: Duration
    private let logger: Logger
    private let accessLog: Bool
    private let metrics: TunnelMetrics
    private let onClose: () -> Void
    private let started: Duration
    private var lastActivity: Duration
    private var idleCheck: Scheduled<Void>?
    private(set) var bytesUp = 0
    private(set) var bytesDown = 0
    private var closed = false
    private var endReason = RelayEnd.closed
    let clientSide: TunnelGlueHandler
    let upstreamSide: TunnelGlueHandler

    init(
        description: Description, eventLoop: EventLoop, clock: any BackstopClock, idleTimeout: Duration,
        logger: Logger, accessLog: Bool, metrics: TunnelMetrics, onClose: @escaping () -> Void
    ) {
        self.description = description
        self.eventLoop = eventLoop
        self.clock = clock
        self.idleTimeout = idleTimeout
        self.logger = logger
        self.accessLog = accessLog
        self.metrics = metrics
        self.onClose = onClose
        self.started = clock.monotonic()
        self.lastActivity = started
        self.clientSide = TunnelGlueHandler(side: .client)
        self.upstreamSide = TunnelGlueHandler(side: .upstream)
        clientSide.relay = self
        upstreamSide.relay = self
        clientSide.partner = upstreamSide
        upstreamSide.partner = clientSide
        scheduleIdleCheck(at: started + idleTimeout)
    }

    func carried(_ bytes: Int, from side: TunnelGlueHandler.Side) {
        lastActivity = clock.monotonic()
        switch side {
        case .client:
            bytesUp += bytes
            metrics.carried(up: bytes)
        case .upstream:
            bytesDown += bytes
            metrics.carried(down: bytes)
        }
    }

    private func scheduleIdleCheck(at deadline: Duration) {
        let loopBound = NIOLoopBound(self, eventLoop: eventLoop)
        let delay = max(deadline - clock.monotonic(), .zero)
        idleCheck = eventLoop.scheduleTask(in: .nanoseconds(delay.nanosecondsClamped)) {
            loopBound.value.idleCheckFired()
        }
    }

    private func idleCheckFired() {
        guard !closed else { return }
        let due = lastActivity + idleTimeout
        if clock.monotonic() >= due {
            endReason = .idleTimeout
            clientSide.closeChannel()
            upstreamSide.closeChannel()
        } else {
            scheduleIdleCheck(at: due)
        }
    }

    /// Bytes the client sent before the tunnel existed were handed on without a read-complete event: flush them.
    func flushUpstream() { upstreamSide.partnerFlush() }

    /// A side failed: the tunnel ends.
    func failed(_ side: TunnelGlueHandler.Side, _ error: any Error) {
        if endReason == .closed { endReason = side == .client ? .clientError : .upstreamError }
        clientSide.closeChannel()
        upstreamSide.closeChannel()
    }

    /// One side's channel closed completely: the other one closes too, and the tunnel is over.
    func sideClosed(_ side: TunnelGlueHandler.Side) {
        clientSide.closeChannel()
        upstreamSide.closeChannel()
        guard !closed else { return }
        closed = true
        idleCheck?.cancel()
        idleCheck = nil
        metrics.tunnelClosed()
        onClose()
        guard accessLog else { return }
        var metadata: Logger.Metadata = [
            "mode": .string("blind"),
            "client": .string(description.client),
            "host": .string(description.target.host),
            "port": .stringConvertible(description.target.port),
            "address": .string(description.address),
            "result": .string("established"),
            "end": .string(endReason.rawValue),
            "bytes_up": .stringConvertible(bytesUp),
            "bytes_down": .stringConvertible(bytesDown),
            "ms": .stringConvertible(Milliseconds(clock.monotonic() - started)),
        ]
        if let entry = description.clientEntry { metadata["client_entry"] = .string(entry) }
        logger.info("tunnel", metadata: metadata)
    }
}

/// One side of a blind tunnel: what it reads goes to its partner's channel; it reads only while the partner can
/// write (backpressure), and passes a half-close on as a half-close (`allowRemoteHalfClosure` is on for both).
final class TunnelGlueHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    enum Side { case client, upstream }

    let side: Side
    /// The relay and the two sides refer to each other; each side lets go of both when its channel's pipeline
    /// removes it (the channel closed), which frees the whole tunnel.
    var relay: TunnelRelay?
    var partner: TunnelGlueHandler?
    private var context: ChannelHandlerContext?
    private var pendingRead = false
    private var inputClosed = false
    private var outputClosed = false

    init(side: Side) { self.side = side }

    func handlerAdded(context: ChannelHandlerContext) { self.context = context }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
        partner = nil
        relay = nil
    }

    // MARK: from the partner

    fileprivate func partnerWrite(_ buffer: ByteBuffer) {
        context?.write(wrapOutboundOut(buffer), promise: nil)
    }

    fileprivate func partnerFlush() { context?.flush() }

    fileprivate func partnerInputClosed() {
        guard let context, !outputClosed else { return }
        outputClosed = true
        if inputClosed {
            context.close(promise: nil)
        } else {
            context.close(mode: .output, promise: nil)
        }
    }

    fileprivate func partnerBecameWritable() {
        guard pendingRead, let context else { return }
        pendingRead = false
        context.read()
    }

    fileprivate var isWritable: Bool { context?.channel.isWritable ?? false }

    func closeChannel() { context?.close(promise: nil) }

    // MARK: channel events

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let buffer = unwrapInboundIn(data)
        relay?.carried(buffer.readableBytes, from: side)
        partner?.partnerWrite(buffer)
    }

    func channelReadComplete(context: ChannelHandlerContext) { partner?.partnerFlush() }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if case ChannelEvent.inputClosed = event {
            inputClosed = true
            partner?.partnerInputClosed()
            if outputClosed { context.close(promise: nil) }
            return
        }
        context.fireUserInboundEventTriggered(event)
    }

    func channelInactive(context: ChannelHandlerContext) {
        relay?.sideClosed(side)
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        relay?.failed(side, error)
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable { partner?.partnerBecameWritable() }
        context.fireChannelWritabilityChanged()
    }

    func read(context: ChannelHandlerContext) {
        if partner?.isWritable ?? false {
            context.read()
        } else {
            pendingRead = true
        }
    }
}
