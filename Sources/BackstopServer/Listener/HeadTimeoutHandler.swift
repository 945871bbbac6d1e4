import NIOCore

/// When a request head must be complete (`limits.header_timeout`): the clock starts with the first byte that
/// arrives while a head is awaited and stops when the head is decoded. Pure; `HeadTimeoutHandler` feeds it.
///
///     awaiting   bytes → receiving(deadline)
///     receiving  head decoded → between;  deadline passed → expired
///     between    the request and its response are done → awaiting
///     expired    terminal: the connection is answered 408 and closed
///
/// Only the bytes read while a head is awaited start the clock: a head whose first bytes came in with the previous
/// request's (pipelined) is bounded by `client_idle_timeout` alone.
struct HeadDeadline: Equatable {
    enum State: Equatable {
        case awaiting
        case receiving(deadline: Duration)
        case between
        case expired
    }

    /// What the timer found.
    enum TimerOutcome: Equatable {
        /// Nothing is due now; fire again at this deadline (nil: no head is being received).
        case wait(next: Duration?)
        /// The head's deadline passed; `waited`: since its first byte.
        case expired(waited: Duration)
    }

    let timeout: Duration
    private(set) var state = State.awaiting

    init(timeout: Duration) { self.timeout = timeout }

    /// Bytes arrived; returns the deadline when they started a head.
    mutating func bytesArrived(now: Duration) -> Duration? {
        guard case .awaiting = state else { return nil }
        let deadline = now + timeout
        state = .receiving(deadline: deadline)
        return deadline
    }

    mutating func headReceived() {
        switch state {
        case .awaiting, .receiving: state = .between
        case .between, .expired: break
        }
    }

    mutating func awaitNextHead() {
        if case .between = state { state = .awaiting }
    }

    mutating func timerFired(now: Duration) -> TimerOutcome {
        guard case .receiving(let deadline) = state else { return .wait(next: nil) }
        guard now >= deadline else { return .wait(next: deadline) }
        state = .expired
        return .expired(waited: now - (deadline - timeout))
    }
}

/// Sits in front of the HTTP decoder on every listener (proxy, admin, intercepted connections) and bounds how long a
/// request head may trickle in (`limits.header_timeout`, docs/reference/behaviour.md#client-connections): a client
/// sending one byte every few seconds would otherwise hold a connection slot for ever. When the deadline passes it
/// fires `Expired` down the pipeline; the HTTP handler behind the decoder answers 408 `request-timeout` and closes.
///
/// The handler behind the decoder reports `headReceived()` and `awaitNextHead()`. One timer per connection, re-armed
/// lazily: a keep-alive connection does not schedule a timer per request.
final class HeadTimeoutHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer

    /// The user event that tells the HTTP handler the head did not complete in time.
    struct Expired: Sendable {
        /// How long the head had been arriving: the request's time on its access line.
        var waited: Duration
    }

    private var deadline: HeadDeadline
    private let now: () -> Duration
    private var context: ChannelHandlerContext?

    /// Whether part of a request head has arrived and the rest is awaited (read when the connection's idle time
    /// runs out: such a connection is a stalled request, answered 408, not an idle one closed silently).
    var isReceivingHead: Bool {
        if case .receiving = deadline.state { true } else { false }
    }
    private var timer: Scheduled<Void>?
    private var timerFiresAt: Duration?

    /// `now` reads the monotonic clock the deadlines are expressed in (`BackstopClock.monotonic`).
    init(timeout: Duration, now: @escaping () -> Duration) {
        self.deadline = HeadDeadline(timeout: timeout)
        self.now = now
    }

    func handlerAdded(context: ChannelHandlerContext) { self.context = context }

    func handlerRemoved(context: ChannelHandlerContext) {
        timer?.cancel()
        timer = nil
        self.context = nil
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if case .awaiting = deadline.state, let due = deadline.bytesArrived(now: now()) { arm(at: due) }
        context.fireChannelRead(data)
    }

    /// The HTTP handler decoded a request head.
    func headReceived() { deadline.headReceived() }

    /// The HTTP handler finished a request and its response: the next bytes start the next head.
    func awaitNextHead() { deadline.awaitNextHead() }

    private func arm(at due: Duration) {
        if let firesAt = timerFiresAt, firesAt <= due { return }
        guard let context else { return }
        timer?.cancel()
        timerFiresAt = due
        let bound = NIOLoopBound(self, eventLoop: context.eventLoop)
        let delay = max((due - now()).nanosecondsClamped, 0)
        timer = context.eventLoop.scheduleTask(in: .nanoseconds(delay)) { bound.value.timerFired() }
    }

    private func timerFired() {
        timer = nil
        timerFiresAt = nil
        switch deadline.timerFired(now: now()) {
        case .expired(let waited):
            context?.fireUserInboundEventTriggered(Expired(waited: waited))
        case .wait(let next):
            if let next { arm(at: next) }
        }
    }
}
