import BackstopCore
import BackstopTracing
import BackstopTransport
import Logging
import NIOCore
import NIOHTTP1

/// An upgrade request (a WebSocket handshake) once the HTTP handler has handed the client's channel over
/// (docs/reference/behaviour.md#upgrades). It makes the handshake over a raw upstream connection
/// (`ConnectionOpening`: curl connects, checks the destination and does TLS), writing the head Backstop builds for
/// any request (`UpstreamRequestBuilder`: credential injected or the request signed, `Via`) plus the
/// `Connection: Upgrade` and `Upgrade` fields; the handshake is retried, and replayed once after a refused token is
/// refreshed, as `UpgradeHandshake` decides. A `101`
/// is relayed to the client and the connection becomes a blind two-way relay with backpressure both ways and an
/// idle timeout (`tunnels.idle_timeout`, as blind tunnels); any other answer is relayed like a response, then the
/// connection closes. Logs the `request` access line when the handshake is answered and an `upgrade` line when a
/// relay ends (docs/reference/operations.md#logs). Traced as any request (`UpgradeRelay+Tracing`): a server span for
/// the handshake, a client span per attempt.
///
/// Event-loop confined: the channel's handlers, the connection's events (delivered on the channel's event loop)
/// and the timer all run on `eventLoop`.
final class UpgradeRelay: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    /// What the HTTP handler knew of the request.
    struct Request {
        var head: ClientRequestHead
        var upstream: UpstreamRuntime
        /// The path (and query) on the upstream.
        var path: String
        var target: RequestTarget
        /// The client's `Upgrade` value, passed on as sent.
        var upgrade: String
        var record: AccessRecord.Request
    }

    /// Stop reading the client while this many bytes sent to the upstream are not yet taken by its connection.
    static let sendHighWater = 1 << 20

    enum Phase: Equatable {
        case handshake
        case relaying
        /// A non-`101` answer being relayed; `remaining` body bytes when the length is known.
        case answering(remaining: Int?)
        case closed
    }

    let runtime: ProxyRuntime
    private let opener: any ConnectionOpening
    let request: Request
    private let eventLoop: EventLoop
    private let relayIdleTimeout: Duration
    private let accessLog: Bool
    private let metrics: ProxyMetrics.Upstream
    private var machine: UpgradeHandshake
    private var context: ChannelHandlerContext?
    private var connection: (any ConnectionHandle)?
    /// The attempt whose connection events count; events of an earlier one are ignored.
    private var generation = 0
    private var reader = UpgradeResponseReader()
    /// The current attempt's answer once its head is read; while its refused token is refreshed it is held, with the
    /// connection's events after it (`held`).
    private var answer: UpgradeResponseReader.Response?
    private var held: [ConnectionEvent] = []
    /// `token-refresh-failed` on a relayed answer whose refresh failed.
    private var answerError: ProxyErrorReason?
    private(set) var phase = Phase.handshake
    /// What the client sent after its head, before the upstream switched protocols.
    private var early: [ByteBuffer] = []
    private var timer: Scheduled<Void>?
    /// Bytes handed to the connection and not yet taken by it.
    private var unsent = 0
    private var readPending = false
    private var receivingPaused = false
    private var bytesUp = 0
    private var bytesDown = 0
    private var status = 0
    private var attempts = 0
    private var answered = false
    private var switchedAt: Duration?
    private var lastActivity: Duration
    private var endReason = RelayEnd.closed
    private var random = SplitMix64()
    private var ended = false
    /// The access line (and the server span) of the handshake was written.
    private var logged = false
    /// The request's trace while `tracing` is on, and the span of the attempt in flight (`UpgradeRelay+Tracing`).
    var trace: RequestTrace?
    var attemptSpan: AttemptSpan?
    var attemptFacts: AttemptFacts?

    init(request: Request, runtime: ProxyRuntime, opener: any ConnectionOpening, eventLoop: EventLoop) {
        let snapshot = runtime.snapshot
        self.request = request
        self.runtime = runtime
        self.opener = opener
        self.eventLoop = eventLoop
        self.relayIdleTimeout = snapshot.connectPolicy.tunnelIdleTimeout
        self.accessLog = snapshot.config.log.accessLog
        self.metrics = runtime.metrics.upstream(request.upstream.config.name)
        let now = runtime.clock.monotonic()
        self.lastActivity = now
        self.machine = UpgradeHandshake(
            policy: request.upstream.retryPolicy, budget: request.upstream.budget,
            timeouts: request.upstream.config.timeouts, credentialKind: request.upstream.auth.credentialKind, now: now)
    }

    var now: Duration { runtime.clock.monotonic() }

    // MARK: channel events

    func handlerAdded(context: ChannelHandlerContext) { self.context = context }
    func handlerRemoved(context: ChannelHandlerContext) { self.context = nil }

    /// The handler is in the pipeline: the handshake begins.
    func start() {
        traceRequestStarted(at: machine.startedAt)
        acquireCredential()
    }

    func read(context: ChannelHandlerContext) {
        if phase == .relaying, unsent < Self.sendHighWater {
            context.read()
        } else {
            readPending = true
        }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let buffer = unwrapInboundIn(data)
        switch phase {
        case .handshake:
            early.append(buffer)
        case .relaying:
            lastActivity = now
            bytesUp += buffer.readableBytes
            unsent += buffer.readableBytes
            runtime.upgradeMetrics.carried(up: buffer.readableBytes)
            connection?.send(buffer)
        case .answering, .closed:
            break
        }
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable, receivingPaused {
            receivingPaused = false
            connection?.setReceiving(true)
        }
        context.fireChannelWritabilityChanged()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if endReason == .closed { endReason = .clientError }
        close()
    }

    func channelInactive(context: ChannelHandlerContext) {
        if phase == .relaying, endReason == .closed { endReason = .clientClosed }
        end()
        context.fireChannelInactive()
    }

    // MARK: the handshake

    private func acquireCredential() {
        let credential: UpgradeHandshake.Credential?
        switch request.upstream.auth {
        case .staticToken(let source, _):
            credential = source.value().map { .value($0) }
        case .oauth2(let manager, _):
            if let token = manager.cachedToken() {
                credential = .token(token)
            } else {
                let bound = NIOLoopBound(self, eventLoop: eventLoop)
                let loop = eventLoop
                let trace = self.trace
                runtime.background.spawn {
                    let (token, refresh) = await manager.tokenForRequest(trace: trace)
                    loop.execute {
                        let relay = bound.value
                        relay.traceWaited(on: refresh)
                        relay.perform(relay.machine.credentialAcquired(token.map { .token($0) }, now: relay.now))
                    }
                }
                // The wait is bounded by `timeouts.total` (the machine's deadline while it awaits the credential).
                armTimer()
                return
            }
        case .awsSigV4(let source):
            credential = source.credentials().map { .aws($0) }
        case .none:
            credential = UpgradeHandshake.Credential.none
        }
        perform(machine.credentialAcquired(credential, now: now))
    }

    /// The upstream refused `rejected`: its answer waits, unread, while the token is refreshed as for any request
    /// (shared, single flight); then the handshake is replayed, or the answer relayed.
    private func refreshCredential(_ rejected: ManagedToken) {
        traceAttemptEnded(failure: nil)
        guard case .oauth2(let manager, _) = request.upstream.auth else {
            perform(machine.refreshFinished(nil, now: now))
            return
        }
        connection?.setReceiving(false)
        let bound = NIOLoopBound(self, eventLoop: eventLoop)
        let loop = eventLoop
        let trace = self.trace
        runtime.background.spawn {
            let (replacement, refresh) = await manager.tokenRejected(rejected, trace: trace)
            loop.execute {
                let relay = bound.value
                relay.traceWaited(on: refresh)
                relay.perform(relay.machine.refreshFinished(replacement, now: relay.now))
            }
        }
    }

    private func perform(_ action: UpgradeHandshake.Action) {
        switch action {
        case .none:
            break
        case .attempt(let number, let credential):
            attempt(number, credential: credential)
        case .retry(let after, let reason, let failed):
            if let failed { metrics.recordAttempt(outcome: failed.label) }
            traceAttemptEnded(failure: failed?.label, retry: (reason, after))
            dropConnection()
            metrics.recordRetry(reason: reason.description)
        case .refreshCredential(let rejected):
            refreshCredential(rejected)
        case .failLocally(let reason, let attempts, let failed):
            if let failed { metrics.recordAttempt(outcome: failed.label) }
            traceAttemptEnded(failure: failed?.label ?? reason.rawValue)
            dropConnection()
            self.attempts = attempts
            answerLocally(reason)
        case .switchProtocols(let attempts):
            self.attempts = attempts
            guard let response = answer else { return }
            answer = nil
            guard let upgrade = response.upgrade, !upgrade.utf8.contains(where: Self.breaksLine) else {
                traceAttemptEnded(failure: "bad-response")
                dropConnection()
                answerLocally(.badUpstreamResponse, detail: "101 Switching Protocols without an Upgrade field")
                return
            }
            guard UpgradeResponseReader.isOffered(upgrade, in: request.upgrade) else {
                // The client would be handed a protocol it did not ask for (RFC 9110 §7.8).
                traceAttemptEnded(failure: "bad-response")
                dropConnection()
                answerLocally(
                    .badUpstreamResponse, detail: "101 Switching Protocols to a protocol the client did not offer")
                return
            }
            switchProtocols(response.head, upgrade: upgrade, rest: response.rest)
        case .relayResponse(let attempts, let error):
            self.attempts = attempts
            relayAnswer(error: error)
        }
        armTimer()
    }

    private func attempt(_ number: Int, credential: UpgradeHandshake.Credential) {
        guard phase == .handshake else { return }
        // A refused token's held answer is let go: the replay has a connection of its own.
        dropConnection()
        answer = nil
        held = []
        attempts = number
        let wall: Double = if case .aws = credential { runtime.clock.wall() } else { 0 }
        let upstream = request.upstream
        var built = UpstreamRequestBuilder.request(
            head: request.head, destination: .upstream(upstream, path: request.path), credential: credential,
            body: .empty, mayResend: true, connectTimeout: upstream.config.timeouts.connect, wall: wall)
        traceAttemptStarted(&built, attempt: number)
        guard let head = Self.handshake(built, target: request.path, upgrade: request.upgrade) else {
            // Only the credential can carry such a byte (the client's fields were parsed): nothing is sent, so the
            // attempt's span is not recorded.
            traceAttemptDropped()
            machine.clientGone()
            answerLocally(.tokenUnavailable, detail: "the credential would split the handshake head")
            return
        }
        generation += 1
        let generation = self.generation
        reader = UpgradeResponseReader()
        let bound = NIOLoopBound(self, eventLoop: eventLoop)
        let connection = opener.connect(
            ConnectionRequest(url: upstream.origin, connectTimeout: upstream.config.timeouts.connect, tls: built.tls),
            on: eventLoop
        ) { events in bound.value.handle(events, generation: generation) }
        connection.send(head)
        self.connection = connection
    }

    /// The handshake's request head: the built request's fields (every one checked for CR, LF and NUL, which
    /// would split the head: a credential from a token endpoint is not ours to trust), then the upgrade's own.
    static func handshake(_ built: TransportRequest, target: String, upgrade: String) -> ByteBuffer? {
        var text = "\(built.method) \(target.isEmpty ? "/" : target) HTTP/1.1\r\n"
        for (name, value) in built.headers {
            guard !name.utf8.contains(where: Self.breaksLine), !value.utf8.contains(where: Self.breaksLine) else {
                return nil
            }
            text += "\(name): \(value)\r\n"
        }
        guard !upgrade.utf8.contains(where: Self.breaksLine) else { return nil }
        text += "Connection: Upgrade\r\nUpgrade: \(upgrade)\r\n\r\n"
        return ByteBuffer(string: text)
    }

    private static func breaksLine(_ byte: UInt8) -> Bool { byte == 0x0D || byte == 0x0A || byte == 0x00 }

    private func dropConnection() {
        connection?.close()
        connection = nil
        generation += 1
    }

    // MARK: connection events

    private func handle(_ events: [ConnectionEvent], generation: Int) {
        defer { context?.flush() }
        for event in events {
            guard generation == self.generation, phase != .closed else { return }
            switch phase {
            case .handshake where answer != nil: held.append(event)
            case .handshake: handshakeEvent(event)
            case .relaying: relayEvent(event)
            case .answering(let remaining): answerEvent(event, remaining: remaining)
            case .closed: return
            }
        }
    }

    private func handshakeEvent(_ event: ConnectionEvent) {
        switch event {
        case .connected, .sent:
            break
        case .received(let buffer):
            switch reader.feed(buffer.readableBytesView) {
            case .needMore: break
            case .invalid(let why): attemptFailed(.badResponse(detail: "upgrade response: \(why)"))
            case .head(let response): responseArrived(response)
            }
        case .closed:
            attemptFailed(.reset(detail: "upstream closed the connection before a response head"))
        case .failure(let failure):
            attemptFailed(failure)
        }
    }

    private func attemptFailed(_ failure: TransportFailure) {
        perform(machine.attemptFailed(failure, now: now, wall: runtime.clock.wall(), random: &random))
    }

    private func responseArrived(_ response: UpgradeResponseReader.Response) {
        let head = response.head
        if let problem = head.framingProblem {
            attemptFailed(.badResponse(detail: "untrustworthy response framing: \(problem)"))
            return
        }
        metrics.recordAttempt(status: head.status)
        traceAttemptHead(status: head.status, version: head.version)
        answer = response
        perform(
            machine.responseHead(
                status: head.status, retryAfter: head.retryAfter, rateLimitReset: head.rateLimitReset, now: now,
                wall: runtime.clock.wall(), random: &random))
    }

    private func switchProtocols(_ head: UpstreamResponseHead, upgrade: String, rest: [UInt8]) {
        guard let context else { return }
        var buffer = context.channel.allocator.buffer(capacity: 256 + head.fields.count)
        ResponseHeadWriter.upstreamHead(
            head, into: &buffer, clientIsHTTP10: false, attempts: attempts, error: nil, framing: .closeDelimited,
            connection: .none)
        // The writer ends the head with its blank line; the upgrade's two fields go before it.
        buffer.moveWriterIndex(to: buffer.writerIndex - 2)
        buffer.writeString("Connection: Upgrade\r\nUpgrade: \(upgrade)\r\n\r\n")
        status = 101
        answered = true
        phase = .relaying
        let now = self.now
        switchedAt = now
        lastActivity = now
        runtime.upgradeMetrics.switched()
        logRequest(error: nil, reason: nil, bytes: 0)
        context.write(wrapOutboundOut(buffer), promise: nil)
        if !rest.isEmpty { deliver(ByteBuffer(bytes: rest)) }
        for buffer in early {
            bytesUp += buffer.readableBytes
            unsent += buffer.readableBytes
            runtime.upgradeMetrics.carried(up: buffer.readableBytes)
            connection?.send(buffer)
        }
        early = []
        context.flush()
        // The HTTP handler held the client's reads back during the handshake: ask for one now.
        readPending = true
        resumeReadingIfPending()
        armTimer()
    }

    /// The answer in hand goes to the client, then what came after it while it was held.
    private func relayAnswer(error: ProxyErrorReason?) {
        guard let response = answer else { return }
        answer = nil
        answerError = error
        connection?.setReceiving(true)
        relayResponse(response.head, chunked: response.chunked, rest: response.rest)
        let events = held
        held = []
        for event in events {
            guard case .answering(let remaining) = phase else { break }
            answerEvent(event, remaining: remaining)
        }
        context?.flush()
    }

    private func relayResponse(_ head: UpstreamResponseHead, chunked: Bool, rest: [UInt8]) {
        guard let context else { return }
        let framing: ResponseFraming
        if head.status == 204 || head.status == 304 || (100..<200).contains(head.status) {
            framing = .bodyless
        } else if let length = head.contentLength {
            framing = .contentLength(length)
        } else {
            framing = chunked ? .chunked : .closeDelimited
        }
        var buffer = context.channel.allocator.buffer(capacity: 256 + head.fields.count)
        ResponseHeadWriter.upstreamHead(
            head, into: &buffer, clientIsHTTP10: false, attempts: attempts, error: answerError, framing: framing,
            connection: .close)
        status = head.status
        answered = true
        runtime.upgradeMetrics.notSwitched()
        context.write(wrapOutboundOut(buffer), promise: nil)
        let remaining: Int?
        switch framing {
        case .bodyless: remaining = 0
        case .contentLength(let length): remaining = length
        // A chunked body is passed on as it comes, chunk framing included, until the upstream closes or the idle
        // timeout ends it: the client has its whole answer by then (docs/reference/behaviour.md#upgrades).
        case .chunked, .closeDelimited: remaining = nil
        }
        phase = .answering(remaining: remaining)
        lastActivity = now
        if !rest.isEmpty {
            answerEvent(.received(ByteBuffer(bytes: rest)), remaining: remaining)
        } else if remaining == 0 {
            finishAnswer()
        }
        context.flush()
        armTimer()
    }

    // MARK: relaying

    private func relayEvent(_ event: ConnectionEvent) {
        switch event {
        case .connected:
            break
        case .received(let buffer):
            deliver(buffer)
        case .sent(let count):
            unsent -= count
            resumeReadingIfPending()
        case .closed:
            endReason = .upstreamClosed
            closeAfterWrites()
        case .failure:
            endReason = .upstreamError
            closeAfterWrites()
        }
    }

    /// Upstream bytes to the client; reading the upstream pauses while the client's socket is full.
    private func deliver(_ buffer: ByteBuffer) {
        guard let context else { return }
        lastActivity = now
        bytesDown += buffer.readableBytes
        runtime.upgradeMetrics.carried(down: buffer.readableBytes)
        context.write(wrapOutboundOut(buffer), promise: nil)
        if !context.channel.isWritable, !receivingPaused {
            receivingPaused = true
            connection?.setReceiving(false)
        }
    }

    private func resumeReadingIfPending() {
        guard readPending, unsent < Self.sendHighWater, let context else { return }
        readPending = false
        context.read()
    }

    private func answerEvent(_ event: ConnectionEvent, remaining: Int?) {
        switch event {
        case .connected, .sent:
            break
        case .received(var buffer):
            if let remaining {
                if buffer.readableBytes > remaining {
                    buffer = buffer.getSlice(at: buffer.readerIndex, length: remaining)!
                }
                phase = .answering(remaining: remaining - buffer.readableBytes)
            }
            lastActivity = now
            bytesDown += buffer.readableBytes
            context?.write(wrapOutboundOut(buffer), promise: nil)
            if case .answering(0?) = phase { finishAnswer() }
        case .closed, .failure:
            finishAnswer()
        }
    }

    private func finishAnswer() {
        logRequest(error: answerError?.rawValue, reason: nil, bytes: bytesDown)
        closeAfterWrites()
    }

    // MARK: ending

    /// A local error (docs/reference/errors.md), then the connection closes.
    private func answerLocally(_ reason: ProxyErrorReason, detail: String? = nil) {
        guard let context, !answered else { return }
        answered = true
        status = reason.status
        runtime.upgradeMetrics.failed()
        var buffer = context.channel.allocator.buffer(capacity: 256)
        ResponseHeadWriter.localError(
            reason, into: &buffer, clientIsHTTP10: false, connection: .close,
            attempts: attempts > 0 ? attempts : nil)
        logRequest(error: reason.rawValue, reason: detail ?? machine.lastFailure?.detail, bytes: 0)
        context.writeAndFlush(wrapOutboundOut(buffer), promise: nil)
        closeAfterWrites()
    }

    private func closeAfterWrites() {
        guard let context, phase != .closed else { return }
        phase = .closed
        let channel = context.channel
        context.writeAndFlush(wrapOutboundOut(channel.allocator.buffer(capacity: 0))).whenComplete { _ in
            channel.close(promise: nil)
        }
    }

    private func close() {
        phase = .closed
        context?.close(promise: nil)
    }

    /// The client's channel closed: everything stops, once.
    private func end() {
        guard !ended else { return }
        ended = true
        phase = .closed
        machine.clientGone()
        timer?.cancel()
        timer = nil
        connection?.close()
        connection = nil
        runtime.clientDisconnected()
        if !answered {
            // The client left during the handshake: its access line says so, as for any request.
            status = 499
            logRequest(error: "client-closed", reason: nil, bytes: 0)
        } else {
            // The client left while an answer was relayed: the line of what it got (none when already written).
            logRequest(error: answerError?.rawValue, reason: nil, bytes: bytesDown)
        }
        guard let switchedAt else { return }
        runtime.upgradeMetrics.relayClosed()
        guard accessLog else { return }
        var metadata: Logger.Metadata = [
            "client": .string(request.record.client),
            "upstream": .string(request.upstream.config.name),
            "path": .string(request.record.path),
            "protocol": .string(request.upgrade),
            "end": .string(endReason.rawValue),
            "bytes_up": .stringConvertible(bytesUp),
            "bytes_down": .stringConvertible(bytesDown),
            "ms": .stringConvertible(Milliseconds(now - switchedAt)),
        ]
        if let entry = request.record.clientEntry { metadata["client_entry"] = .string(entry) }
        runtime.logger.info("upgrade", metadata: metadata)
    }

    /// The handshake's access line and server span, once.
    private func logRequest(error: String?, reason: String?, bytes: Int) {
        guard !logged else { return }
        logged = true
        traceFinished(status: status, error: error, attempts: attempts)
        let elapsed = now - machine.startedAt
        // On the status page as any exchange's end (docs/reference/operations.md#status-page).
        runtime.recordAnswer(
            upstream: request.upstream.config.name, status: status, seconds: elapsed.seconds, attempts: attempts,
            now: now, endpoint: attempts > 0 ? request.upstream.health.key(0) : "-",
            cause: error.map { error in reason.map { "\(error): \($0)" } ?? error } ?? "upstream answered \(status)")
        runtime.logAccess(
            AccessRecord(
                request: request.record, status: status, error: error, reason: reason,
                upstream: request.upstream.config.name, attempts: attempts,
                retries: machine.retryReasons.map(\.description), elapsed: elapsed, bytes: bytes,
                // Upgrades go to the first endpoint (docs/reference/behaviour.md#endpoints-and-ejection).
                endpoint: attempts > 0 ? request.upstream.health.key(0) : nil),
            enabled: accessLog)
    }

    // MARK: the timer

    /// One timer: the handshake's deadlines, then the idle timeout of the relay or of the relayed answer.
    private func armTimer() {
        timer?.cancel()
        timer = nil
        let deadline: Duration
        switch phase {
        case .handshake:
            guard let next = machine.deadline else { return }
            deadline = next
        case .relaying:
            deadline = lastActivity + relayIdleTimeout
        case .answering:
            deadline = lastActivity + request.upstream.config.timeouts.idle
        case .closed:
            return
        }
        let bound = NIOLoopBound(self, eventLoop: eventLoop)
        let delay = max(deadline - now, .zero)
        timer = eventLoop.scheduleTask(in: .nanoseconds(delay.nanosecondsClamped)) { bound.value.timerFired() }
    }

    private func timerFired() {
        timer = nil
        let now = self.now
        switch phase {
        case .handshake:
            perform(machine.timerFired(now: now, wall: runtime.clock.wall(), random: &random))
            return
        case .relaying:
            if now >= lastActivity + relayIdleTimeout {
                endReason = .idleTimeout
                close()
                return
            }
        case .answering:
            if now >= lastActivity + request.upstream.config.timeouts.idle {
                finishAnswer()
                return
            }
        case .closed:
            return
        }
        armTimer()
    }
}
