import BackstopCore
import BackstopTracing
import BackstopTransport
import NIOCore
import NIOHTTP1

/// The per-connection executor: feeds `ConnectionStateMachine` the connection's events (request parts, transport
/// events, credentials, timers, the client's state) and performs the actions it returns, in order
/// (`ProxyHandler+Actions`). It decides nothing itself: admission is `RequestAdmission`'s and the client policy's,
/// everything after it the machine's (docs/architecture.md#the-request-core). What outlives one action of a
/// forwarded request (its body, its transfers, its spans) is kept by `Exchange`.
///
/// Responses are written as bytes (`ResponseHeadWriter`): the pipeline has a request decoder but no response
/// encoder. One lazily re-armed timer serves the machine's deadlines: it is scheduled only when a deadline comes
/// earlier than the pending one, so a busy connection does not schedule one per request.
///
/// Events that arrive while actions run (closing a channel reports it inactive at once; a static credential is
/// reported from inside `.acquireCredential`) change the machine at once and append their actions to the same
/// queue, which runs them after the current ones: actions always run in the order the machine decided them.
final class ProxyHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = ClientRequestPart
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer
    typealias Action = ConnectionStateMachine.Action

    let runtime: ProxyRuntime
    /// `runtime.clock`, kept here: read through `runtime`, each of a request's ~10 clock readings retained and
    /// released the runtime as well as the clock (docs/performance.md#reference-counting-line-by-line-2026-11-27).
    let clock: any BackstopClock
    /// Only the event loop touches it, and every event returns its actions before any is performed.
    var machine: ConnectionStateMachine
    var context: ChannelHandlerContext?
    /// The effects of the forwarded request in flight.
    var exchange: Exchange?
    /// The effects of the queued request being read or stored (`delivery: queue`).
    var intake: QueueIntake?
    /// The deliverer's private connection (docs/reference/behaviour.md#queued-delivery): its requests were admitted
    /// when they were queued, so no `clients` check, no upgrade and no queueing apply; each names its delivery.
    let delivery: Bool
    /// Small response bytes written but held back until the next flush, so that what follows them is appended:
    /// a head and a small body leave as one buffer, one write through the pipeline instead of two (`write`).
    var heldResponse: ByteBuffer?
    private var timer: Scheduled<Void>?
    private var timerFiresAt: Duration?
    /// The client's address for access lines.
    var clientAddress = "-"
    /// Set on the handler of an intercepted connection: every request inside is for this host.
    let intercepted: InterceptedConnection?
    /// The head deadline in front of the decoder (`limits.header_timeout`), told when heads start and end.
    let headTimer: HeadTimeoutHandler?
    /// The decoder that hands parts to this handler directly, told when this handler leaves the pipeline first.
    weak var partSource: ClientRequestDecoder?
    /// Who the kernel says the client is, asked the first time a `clients` decision needs it (`groups`: with the
    /// user's groups, which only `unix_group` entries need).
    var peer: (connection: ClientConnection, groups: Bool)?
    var random = SplitMix64()
    /// The channel's allocator, read once: `context.channel.allocator` retains the channel and checks the thread on
    /// every response (docs/performance.md#reference-counting-per-request).
    var allocator = ByteBufferAllocator()
    /// The counters of the upstream this connection's last request went to: a keep-alive connection's requests
    /// mostly go to one upstream, and looking it up takes the metrics' lock and hashes its name.
    var lastUpstreamMetrics: ProxyMetrics.Upstream?

    /// Actions decided but not yet performed, and the next one to perform; reused, so an event allocates nothing.
    private var actions: [Action] = []
    private var next = 0
    private var running = false
    /// Body bytes written to the client since the last `.flushBody`.
    var unflushedBytes = 0
    /// Body bytes written to the client that the transfer has not been told of (the client socket was full), and
    /// the attempt they came from.
    var unreported = (bytes: 0, generation: 0)

    init(
        runtime: ProxyRuntime, idleTimeout: Duration, headTimer: HeadTimeoutHandler?,
        intercepted: InterceptedConnection? = nil, delivery: Bool = false
    ) {
        self.runtime = runtime
        self.clock = runtime.clock
        self.intercepted = intercepted
        self.delivery = delivery
        self.headTimer = headTimer
        self.machine = ConnectionStateMachine(idleTimeout: idleTimeout, now: runtime.clock.monotonic())
        actions.reserveCapacity(8)
    }

    var now: Duration { clock.monotonic() }

    /// Feeds the machine one event and performs what it decided (after whatever was already queued).
    func feed(_ event: (inout ConnectionStateMachine, inout [Action]) -> Void) {
        event(&machine, &actions)
        guard !running else { return }
        running = true
        while next < actions.count {
            // Moved out, not copied (a copy would retain every buffer and head it carries): the slot keeps a
            // payload-less action that has been passed and never runs.
            var action = Action.read
            swap(&action, &actions[next])
            next += 1
            run(consume action)
        }
        actions.removeAll(keepingCapacity: true)
        next = 0
        running = false
        armTimer()
    }

    // MARK: channel events

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        allocator = context.channel.allocator
        // An intercepted connection's handler joins a channel that is already active: no channelActive follows.
        if let intercepted {
            clientAddress = intercepted.client
            armTimer()
        }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
        partSource?.stopDelivering()
        partSource = nil
    }

    func channelActive(context: ChannelHandlerContext) {
        if delivery {
            // Not a listener's client: not counted in `backstop_client_connections`.
            clientAddress = "deliverer"
            armTimer()
            context.fireChannelActive()
            return
        }
        runtime.clientConnected()
        if let address = context.channel.remoteAddress {
            if case .unixDomainSocket = address {
                clientAddress = "unix"
            } else {
                clientAddress = address.displayString
            }
        }
        armTimer()
        context.fireChannelActive()
    }

    func channelInactive(context: ChannelHandlerContext) {
        if !delivery { runtime.clientDisconnected() }
        cancelTimer()
        feed { $0.connectionClosed(into: &$1) }
        context.fireChannelInactive()
    }

    func read(context: ChannelHandlerContext) {
        if machine.readRequested() { context.read() }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) { partArrived(unwrapInboundIn(data)) }

    /// A request part from the decoder, through the pipeline or straight from it (`ClientRequestDecoder.deliver(to:)`).
    func partArrived(_ part: ClientRequestPart) {
        let now = self.now  // one clock reading per part, shared by the connection and the exchange
        feed { $0.partArrived(part, now: now, into: &$1) }
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        let writable = context.channel.isWritable
        if writable { clientWritable() }
        let now = self.now
        feed { $0.clientWritabilityChanged(writable, now: now, into: &$1) }
        context.fireChannelWritabilityChanged()
    }

    /// Under backpressure: once the batch of `bytes` just flushed is in the client socket (an empty write after it
    /// completes), it counts as consumed and as the response's progress. The socket turns writable again only when
    /// NIO's buffer is nearly empty, up to a megabyte (`CurlTransfer.highWater`) later: at a slow reader's steady
    /// pace that outlasted `timeouts.idle`, which then cut a client that was reading all along
    /// (docs/reference/config.md#timeouts).
    func reportWhenWritten(_ bytes: Int, of generation: Int, _ context: ChannelHandlerContext) {
        let promise = context.eventLoop.makePromise(of: Void.self)
        let loopBound = NIOLoopBound(self, eventLoop: context.eventLoop)
        promise.futureResult.whenSuccess { loopBound.value.clientTook(bytes, of: generation) }
        context.writeAndFlush(wrapOutboundOut(context.channel.allocator.buffer(capacity: 0)), promise: promise)
    }

    private func clientTook(_ bytes: Int, of generation: Int) {
        machine.clientTookBytes(now: now)
        guard unreported.generation == generation, unreported.bytes > 0 else { return }
        let reported = min(bytes, unreported.bytes)
        unreported.bytes -= reported
        exchange?.consumed(reported, of: generation)
    }

    /// The client socket drained: the body bytes written so far count as consumed (backpressure).
    func clientWritable() {
        machine.clientTookBytes(now: now)
        guard unreported.bytes > 0 else { return }
        exchange?.consumed(unreported.bytes, of: unreported.generation)
        unreported.bytes = 0
    }

    /// A request head that did not complete within `limits.header_timeout` (`HeadTimeoutHandler`): 408, closed.
    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        guard let expired = event as? HeadTimeoutHandler.Expired else {
            context.fireUserInboundEventTriggered(event)
            return
        }
        let now = self.now
        feed { $0.headTimedOut(now: now, waited: expired.waited, into: &$1) }
    }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        // Bytes after a parse error: that error was reported already (its refusal may still wait for the requests
        // before it to be answered); these are no new failure of the connection.
        if case .dataReceivedInErrorState? = error as? ByteToMessageDecoderError { return }
        guard let parserError = error as? HTTPParserError else {
            feed { $0.connectionFailed(into: &$1) }
            return
        }
        // After an answer that closes the connection, what the client still sends is not another request (it is
        // the rest of a refused body): the machine answers nothing more, and the answer is left to finish.
        let now = self.now
        if parserError == .invalidEOFState {
            feed { $0.inputEndedInsideRequest(now: now, into: &$1) }
            return
        }
        let reason: ProxyErrorReason = parserError == .headerOverflow ? .headersTooLarge : .badRequest
        feed { $0.parseFailed(reason, now: now, into: &$1) }
    }

    // MARK: transport events

    /// A batch of attempt `generation`'s events: they arrived together, so one clock reading serves them, and the
    /// machine takes them all before their actions run (in the order decided, as always).
    func transportEvents(_ events: [TransportEvent], generation: Int) {
        let now = self.now
        let clock = self.clock
        feed { machine, actions in
            // Read through the buffer: an array's subscript hands each event out as a copy (a retain and a release
            // of its payload), the buffer's lends it.
            events.withUnsafeBufferPointer { events in
                for index in events.indices {
                    // Only a head (its retry hints) or a failure (a retry's wait) may need the time of day.
                    let wall: Double
                    switch events[index] {
                    case .head, .failure: wall = clock.wall()
                    case .body, .end: wall = 0
                    }
                    machine.transportEvent(
                        events[index], generation: generation, now: now, wall: wall, random: &random, into: &actions)
                }
            }
            machine.transportBatchEnded(generation: generation, into: &actions)
        }
    }

    // MARK: the timer

    private func armTimer() {
        if let deadline = Self.nextDeadline(of: &machine) { wakeUp(at: deadline) }
    }

    /// Read in place: reading the getter off the handler's property would copy the whole machine first.
    private static func nextDeadline(of machine: inout ConnectionStateMachine) -> Duration? { machine.nextDeadline }

    private func wakeUp(at deadline: Duration) {
        // `timerFiresAt` is set exactly while `timer` is armed: the common case returns before anything is retained.
        if let firesAt = timerFiresAt, firesAt <= deadline { return }
        guard let context else { return }
        timer?.cancel()
        timerFiresAt = deadline
        let loopBound = NIOLoopBound(self, eventLoop: context.eventLoop)
        let delay = deadline - now
        timer = context.eventLoop.scheduleTask(in: .nanoseconds(max(delay.nanosecondsClamped, 0))) {
            loopBound.value.timerFired()
        }
    }

    /// Whatever is due runs; whatever is still to come re-arms the timer.
    private func timerFired() {
        timer = nil
        timerFiresAt = nil
        let now = self.now
        let wall = clock.wall()
        let headArriving = headTimer?.isReceivingHead ?? false
        feed { $0.timerFired(now: now, wall: wall, random: &random, headArriving: headArriving, into: &$1) }
    }

    /// The connection leaves this handler (a tunnel or interception takes it over, or it closed): no deadline of
    /// ours fires.
    func cancelTimer() {
        timer?.cancel()
        timer = nil
        timerFiresAt = nil
    }
}
