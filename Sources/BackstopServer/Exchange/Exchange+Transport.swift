import BackstopCore
import BackstopTracing
import BackstopTransport
import NIOCore

/// The upstream side of an exchange: credentials, attempts and their transport events, the relay to the client.
extension Exchange {
    func acquireCredential() {
        let credential: ExchangeStateMachine.Credential?
        switch destination.upstream?.auth {
        case .staticToken(let source, _)?:
            credential = source.value().map { .value($0) }
        case .oauth2(let manager, _)?:
            if let token = manager.cachedToken() {
                credential = .token(token)
            } else {
                let bound = NIOLoopBound(self, eventLoop: eventLoop)
                let loop = eventLoop
                let trace = self.trace
                Task {
                    let (token, refresh) = await manager.tokenForRequest(trace: trace)
                    loop.execute {
                        let exchange = bound.value
                        exchange.traceWaited(on: refresh)
                        exchange.perform(
                            exchange.machine.credentialAcquired(token.map { .token($0) }, now: exchange.now))
                    }
                }
                return
            }
        case .awsSigV4(let source)?:
            credential = source.credentials().map { .aws($0) }
        case .none?, nil:
            credential = ExchangeStateMachine.Credential.none
        }
        perform(machine.credentialAcquired(credential, now: now))
    }

    func startAttempt(generation: Int, credential: ExchangeStateMachine.Credential, mayResend: Bool) {
        transfer?.cancel()
        let transportBody: TransportRequestBody
        switch body {
        case .none: transportBody = machine.configuration.hasBody ? .buffered(ByteBuffer()) : .empty
        case .buffer(let buffer): transportBody = .buffered(buffer)
        case .stream(let stream): transportBody = .streaming(stream)
        }
        // Only a signed attempt needs the time of day (its `X-Amz-Date`).
        let wall: Double = if case .aws = credential { environment.clock.wall() } else { 0 }
        var request = UpstreamRequestBuilder.request(
            head: head, destination: destination, credential: credential, body: transportBody, mayResend: mayResend,
            connectTimeout: machine.configuration.timeouts.connect, wall: wall)
        traceAttemptStarted(&request)
        let bound = NIOLoopBound(self, eventLoop: eventLoop)
        transferGeneration = generation
        transfer = environment.transport.start(request, on: eventLoop) { events in
            bound.value.handle(events, generation: generation)
        }
    }

    func retry(after delay: Duration, reason: RetryCondition, disposal: ExchangeStateMachine.Disposal) {
        switch disposal {
        case .none: break
        case .cancel: transfer?.cancel()
        case .abandon(let limit): transfer?.abandon(within: limit)
        }
        transfer = nil
        transferGeneration = 0
        traceRetry(after: delay, reason: reason)
        metrics.recordRetry(reason: reason.description)
        if let failure = machine.lastFailure, reason.isTransportCondition { logAttemptFailure(failure, final: false) }
    }

    func stopTransferAndBody() {
        transfer?.cancel()
        transfer = nil
        transferGeneration = 0
        if case .stream(let stream) = body, !machine.requestComplete { stream.fail() }
    }

    // MARK: transport events

    func handle(_ events: [TransportEvent], generation: Int) {
        guard generation == transferGeneration else { return }
        var written = 0
        let now = self.now  // one reading for the batch: its events arrived together
        for index in events.indices {
            guard generation == transferGeneration, !machine.isDone else { return }
            switch events[index] {  // switched on in place: binding a loop copy would copy each event's payload
            case .head(let upstreamHead):
                metrics.recordAttempt(status: upstreamHead.status)
                traceAttemptHead(upstreamHead)
                perform(
                    machine.responseHead(
                        upstreamHead, generation: generation, now: now,
                        wall: environment.clock.wall(), random: &random),
                    reportedHead: upstreamHead)
            case .body(let buffer):
                let action = machine.responseBody(buffer, generation: generation, now: now)
                if case .relayBody(let bytes) = action { written += relayBody(bytes) } else { perform(action) }
            case .end:
                perform(machine.responseEnded(generation: generation))
            case .failure(let failure):
                if case .attempting = machine.state { metrics.recordAttempt(outcome: failure.label) }
                perform(
                    machine.transportFailed(
                        failure, generation: generation, now: now, wall: environment.clock.wall(),
                        random: &random))
            }
        }
        // One flush per batch; the transport learns what the client socket took, or waits for `clientWritable`.
        guard case .relaying = machine.state else { return }
        client.flush()
        unreportedBytes += written
        if unreportedBytes > 0, client.isWritable { clientWritable() }
    }

    func deliverHead(_ received: UpstreamResponseHead, error: ProxyErrorReason?) {
        headError = error
        // The head is copied only when a redirect is rewritten (a copy retains every field).
        if !received.redirectValueRanges.isEmpty, let upstream = destination.upstream {
            var rewritten = received
            rewritten.rewriteRedirects(RedirectRewriter(upstream: upstream.config, target: target))
            writeHead(rewritten, error: error)
        } else {
            writeHead(received, error: error)
        }
    }

    private func writeHead(_ upstreamHead: UpstreamResponseHead, error: ProxyErrorReason?) {
        countBudgetExhaustion()
        let http10 = client.clientIsHTTP10
        let framing = ResponseFraming.decide(
            requestIsHEAD: head.method.isHEAD, status: upstreamHead.status, contentLength: upstreamHead.contentLength,
            clientIsHTTP10: http10)
        relay = ResponseRelay(framing: framing)
        let connection: ResponseHeadWriter.ConnectionField =
            client.closeAfterResponse || framing.endsConnection ? .close : (http10 ? .keepAlive : .none)
        // Room for a small body too: the client connection appends one that arrives before its next flush.
        var capacity = upstreamHead.fields.count + 192
        if case .contentLength(let length) = framing, length <= 4096 { capacity += length }
        var buffer = client.allocator.buffer(capacity: capacity)
        ResponseHeadWriter.upstreamHead(
            upstreamHead, into: &buffer, clientIsHTTP10: http10, attempts: machine.attempts, error: error,
            framing: framing, connection: connection)
        client.writeResponse(buffer)
    }

    /// Relays one chunk; returns the body bytes written.
    @discardableResult
    func relayBody(_ buffer: ByteBuffer) -> Int {
        guard var relay else { return 0 }
        let client = self.client
        let outcome = relay.relay(buffer, allocator: client.allocator) { client.writeResponse($0) }
        self.relay = relay
        switch outcome {
        case .written(let count): return count
        case .overran:
            perform(machine.responseOverran())
            return 0
        }
    }
}
