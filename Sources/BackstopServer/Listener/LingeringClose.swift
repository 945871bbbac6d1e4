import BackstopCore
import NIOCore

/// How long a client connection that Backstop closes after an answer keeps reading, and throwing away, what its
/// client still sends (nginx's `lingering_close`; docs/reference/behaviour.md#client-connections). Pure: the
/// handler feeds it the time of each read and asks when to give up.
///
/// A connection closed while bytes are still arriving is reset by the next of them, and a reset can throw away
/// the answer before the client reads it; a client uploading a body Backstop refused (413) would see "connection
/// reset" or "broken pipe" instead. So the sending side is shut first (the client reads the answer and then its
/// end), what still arrives is read and dropped, and the connection is closed when the client closes its end, or
/// after `idle` with nothing read, or `total` after the answer, whichever is first.
struct LingeringDeadline: Equatable {
    /// nginx's `lingering_timeout`.
    static let idle = Duration.seconds(5)
    /// nginx's `lingering_time`.
    static let total = Duration.seconds(30)

    /// When the connection is closed at the latest.
    let last: Duration
    /// When it is closed unless more bytes arrive first.
    private(set) var deadline: Duration

    init(answeredAt now: Duration) {
        last = now + Self.total
        deadline = min(now + Self.idle, last)
    }

    mutating func bytesArrived(now: Duration) {
        deadline = min(now + Self.idle, last)
    }

    func isDue(now: Duration) -> Bool { now >= deadline }
}

/// Reads and drops what a client still sends after the answer Backstop closes its connection with, until the
/// client closes its end or `LingeringDeadline` says to give up (then it closes the connection). Put at the front of
/// the pipeline by `close(_:clock:)`, so nothing it drops reaches the decoder or the proxy handler, whose connection
/// is over; it asks for reads itself, past the proxy handler, which asks for none once its connection is closing.
final class LingeringCloseHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer

    private var deadline: LingeringDeadline
    private let clock: any BackstopClock
    private var timer: Scheduled<Void>?

    private init(clock: any BackstopClock) {
        self.clock = clock
        self.deadline = LingeringDeadline(answeredAt: clock.monotonic())
    }

    /// Shuts the sending side of `channel` (the client reads the answer written before, then its end) and reads
    /// what still comes until the client closes or the deadline passes. On the channel's event loop. A channel
    /// that cannot be half-closed (already closed, or not a socket) is closed outright.
    static func close(_ channel: any Channel, clock: any BackstopClock) {
        channel.eventLoop.assertInEventLoop()
        do {
            try channel.pipeline.syncOperations.addHandler(LingeringCloseHandler(clock: clock), position: .first)
        } catch {
            channel.close(promise: nil)
            return
        }
        let shut = channel.eventLoop.makePromise(of: Void.self)
        shut.futureResult.whenFailure { _ in channel.close(promise: nil) }
        channel.close(mode: .output, promise: shut)
    }

    func handlerAdded(context: ChannelHandlerContext) {
        arm(context)
        context.read()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        timer?.cancel()
        timer = nil
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        deadline.bytesArrived(now: clock.monotonic())
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        context.read()
    }

    func channelInactive(context: ChannelHandlerContext) {
        timer?.cancel()
        timer = nil
        context.fireChannelInactive()
    }

    /// One timer at a time, at the deadline as it stood when armed; a read since then moved it later, and the timer
    /// re-arms for that instead of closing.
    private func arm(_ context: ChannelHandlerContext) {
        let delay = max((deadline.deadline - clock.monotonic()).nanosecondsClamped, 0)
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        timer = context.eventLoop.scheduleTask(in: .nanoseconds(delay)) {
            let (handler, context) = bound.value
            handler.timer = nil
            if handler.deadline.isDue(now: handler.clock.monotonic()) {
                context.close(promise: nil)
            } else {
                handler.arm(context)
            }
        }
    }
}
