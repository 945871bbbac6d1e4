import BackstopCore
import BackstopTracing
import BackstopTransport
import NIOCore
import NIOHTTP1

/// Performing the machine's actions: admission, writing to the client, the request's exchange, and what metrics, the
/// access line and the spans record.
extension ProxyHandler {
    func run(_ action: consuming Action) {
        switch consume action {
        case .read:
            context?.read()
        case .admit(let head):
            admit(head)
        case .writeContinue(let clientIsHTTP10):
            guard let context else { return }
            var interim = allocator.buffer(capacity: 32)
            ResponseHeadWriter.writeStatusLine(&interim, clientIsHTTP10: clientIsHTTP10, status: 100)
            interim.writeStaticString("\r\n")
            writeHeldResponse(context)
            context.writeAndFlush(wrapOutboundOut(interim), promise: nil)
        case .writeHead(let head, let write):
            if let report = write.report { recordAttempt(report) }
            writeHead(head, write)
        case .writeBody(let buffer, let chunk):
            guard let context else { return }
            if let chunk {
                var prefix = allocator.buffer(capacity: 24)
                ResponseHeadWriter.chunkPrefix(&prefix, size: buffer.readableBytes, first: chunk.first)
                write(prefix, context)
            }
            unflushedBytes += buffer.readableBytes
            write(buffer, context)
        case .flushBody(let generation):
            // One flush per transport batch; the transfer learns what the client socket took, or waits for
            // `channelWritabilityChanged`.
            flush()
            unreported = (unreported.bytes + unflushedBytes, generation)
            let batch = unflushedBytes
            unflushedBytes = 0
            guard unreported.bytes > 0, let context else { return }
            if context.channel.isWritable {
                clientWritable()
            } else if batch > 0 {
                reportWhenWritten(batch, of: generation, context)
            }
        case .endResponse(let lastChunk, let close, let finished):
            finish(finished)
            endResponse(lastChunk: lastChunk, close: close)
        case .writeError(let reason, let write):
            if let intake {
                // A queued request refused: its access line and metrics are the intake's, not an exchange's.
                logQueued(intake, status: reason.status, error: reason.rawValue, delivery: nil)
                intake.finish()
                self.intake = nil
            }
            writeError(reason, write)
        case .writeAccepted(let delivery, let write):
            writeAccepted(delivery: delivery, write)
        case .logLocalAnswer(let reason, let detail, let elapsed):
            // An answer to what could not be read (400, 431, a 408 for a head never completed): counted as every
            // answer made before routing is (docs/reference/operations.md#metrics).
            runtime.metrics.recordRequest(upstream: "-", status: reason.status, seconds: elapsed.seconds)
            logLocalAnswer(reason, method: "-", host: "-", path: "-", reason: detail, elapsed: elapsed)
        case .abortResponse:
            // What was written goes out; then the only honest signal left is closing the connection.
            flush()
            context?.close(promise: nil)
        case .closeConnection:
            context?.close(promise: nil)
        case .awaitNextHead:
            headTimer?.awaitNextHead()

        case .storeBody(let buffer):
            store(buffer)
        case .beginStreaming(let part):
            beginStreaming(then: part)
        case .finishBodyStream:
            exchange?.finishBodyStream()
        case .failBodyStream:
            exchange?.failBodyStream()
        case .acquireCredential:
            acquireCredential()
        case .chooseEndpoint(let avoiding, _):
            let now = self.now
            let verdict =
                exchange?.destination.upstream?.health.choose(avoiding: avoiding)
                ?? .attempt(EndpointTicket(endpoint: 0, probe: nil))
            feed { $0.endpointChosen(verdict, now: now, into: &$1) }
        case .refreshCredential(let rejected):
            refreshCredential(rejected)
        case .startAttempt(let start):
            startAttempt(start)
        case .cancelAttempt(let generation):
            exchange?.cancelAttempt(generation)
        case .abandonAttempt(let generation, let within):
            exchange?.abandonAttempt(generation, within: within)
        case .requestRetryPermit:
            let now = self.now
            let upstream = exchange?.destination.upstream
            // The facts a retry needs: an endpoint that may take it (after this attempt's report, which may have
            // ejected the last), then the budget, not charged for a retry that could not go anywhere.
            let endpointOpen = upstream?.health.mayBeTried ?? true
            let granted = endpointOpen && (upstream?.budget.withBudget { $0.tryAcquireRetry(now: now) } ?? false)
            if endpointOpen, !granted { exchange?.metrics.recordBudgetExhausted() }
            feed { $0.retryPermit(granted: granted, endpointOpen: endpointOpen, now: now, into: &$1) }

        case .keepQueuedBody(let part):
            guard let intake else { return }
            if !intake.keep(part) {
                // `limits.buffer_memory` is spent: the request cannot be held to be stored.
                let now = self.now
                feed { $0.intakeEnded(.refused(.spoolFull), now: now, into: &$1) }
            }
        case .storeQueued:
            guard let intake, let deliverer = runtime.queue, let context else { return }
            let bound = NIOLoopBound(self, eventLoop: context.eventLoop)
            let loop = context.eventLoop
            intake.store(in: deliverer) { outcome in
                loop.execute {
                    let handler = bound.value
                    let now = handler.now
                    handler.feed { $0.intakeEnded(outcome, now: now, into: &$1) }
                }
            }
        case .discardQueued:
            // The intake stays until its answer is written (which records it), or the connection closes.
            intake?.finish()
        case .queuedUnanswered(let delivery):
            guard let intake else { return }
            // Counted as every request whose client left before its answer (docs/reference/errors.md#metrics-for-errors).
            logQueued(intake, status: 499, error: "client-closed", delivery: delivery)
            intake.finish()
            self.intake = nil

        case .attemptEnded(let report):
            recordAttempt(report)
        case .attemptLeft(let generation, let report):
            guard let exchange else { return }
            switch report {
            case .response(let status, _): exchange.metrics.recordAttempt(status: status)
            case .failed(let failure): exchange.metrics.recordAttempt(outcome: failure.label)
            }
            exchange.traceAttemptLeft(generation, report)
        case .endpointReport(let report, let reason):
            exchange?.destination.upstream?.health.report(report.outcome, ticket: report.ticket, reason: reason)
        case .retryScheduled(let retry):
            guard let exchange else { return }
            if retry.wakesOnNetworkChange { waitForNetworkChange(exchange) }
            exchange.traceRetry(retry)
            exchange.metrics.recordRetry(reason: retry.reason.description)
            if let failure = retry.failure, retry.reason.isTransportCondition {
                exchange.logAttemptFailure(failure, attempt: retry.attempt, final: false, giveUp: nil)
            }
        case .requestFinished(let finished):
            finish(finished)
        }
    }

    /// An attempt ended as `report` (`.attemptEnded`, or with the head it delivered).
    private func recordAttempt(_ report: ExchangeStateMachine.AttemptReport) {
        guard let exchange else { return }
        switch report {
        case .response(let status, let version):
            exchange.metrics.recordAttempt(status: status)
            exchange.traceAttemptHead(status: status, version: version)
        case .failed(let failure):
            exchange.metrics.recordAttempt(outcome: failure.label)
        }
    }

    /// The exchange ended (`.requestFinished`, or with the response's end).
    private func finish(_ finished: ConnectionStateMachine.Finished) {
        exchange?.finish(finished)
        exchange = nil
        unflushedBytes = 0
        unreported = (0, 0)
    }

    // MARK: the request body

    private func store(_ buffer: ByteBuffer) {
        guard let exchange else { return }
        switch exchange.store(buffer) {
        case .kept:
            break
        case .streamFull:
            machine.holdUploads()
        case .overBudget:
            // A part kept for replay takes its share of `limits.buffer_memory`; one that does not fit turns the
            // body into a stream (spooled, or sent once and not retryable) instead of growing memory past the budget.
            let now = self.now
            feed { $0.bufferDenied(buffer, now: now, into: &$1) }
        case .spoolFailed:
            let now = self.now
            feed { $0.spoolFailed(now: now, into: &$1) }
        }
    }

    private func beginStreaming(then part: ByteBuffer?) {
        guard let exchange, let context else { return }
        // With a spool, a body too large to keep in memory is kept there instead (docs/reference/behaviour.md#spooled-bodies).
        if exchange.beginSpooling(
            then: part, on: context.eventLoop, maxLength: runtime.snapshot.config.limits.maxRequestBody)
        {
            let now = self.now
            feed { $0.streamingBegan(now: now, spooled: true, into: &$1) }
            return
        }
        let bound = NIOLoopBound(self, eventLoop: context.eventLoop)
        let loop = context.eventLoop
        let fits = exchange.beginStreaming(then: part) {
            loop.execute {
                let handler = bound.value
                let now = handler.now
                handler.feed { $0.releaseUploads(now: now, into: &$1) }
            }
        }
        if !fits { machine.holdUploads() }
        let now = self.now
        feed { $0.streamingBegan(now: now, into: &$1) }
    }

    // MARK: credentials and attempts

    private func acquireCredential() {
        guard let exchange, let context else { return }
        let credential: ExchangeStateMachine.Credential?
        switch exchange.destination.upstream?.auth {
        case .staticToken(let source, _)?:
            credential = source.value().map { .value($0) }
        case .oauth2(let manager, _)?:
            if let token = manager.cachedToken() {
                credential = .token(token)
            } else {
                let bound = NIOLoopBound((self, exchange), eventLoop: context.eventLoop)
                let loop = context.eventLoop
                let trace = exchange.trace
                runtime.background.spawn {
                    let (token, refresh) = await manager.tokenForRequest(trace: trace)
                    loop.execute {
                        let (handler, exchange) = bound.value
                        // The request may have ended (its `timeouts.total`) and the connection's next one be waiting
                        // for a token of its own, maybe another upstream's: this one is not its answer.
                        guard handler.exchange === exchange else { return }
                        exchange.traceWaited(on: refresh)
                        let now = handler.now
                        handler.feed { $0.credentialAcquired(token.map { .token($0) }, now: now, into: &$1) }
                    }
                }
                return
            }
        case .awsSigV4(let source)?:
            credential = source.credentials().map { .aws($0) }
        case .none?, nil:
            credential = ExchangeStateMachine.Credential.none
        }
        let now = self.now
        feed { $0.credentialAcquired(credential, now: now, into: &$1) }
    }

    private func refreshCredential(_ rejected: ManagedToken) {
        guard let exchange, let context, case .oauth2(let manager, _)? = exchange.destination.upstream?.auth else {
            return
        }
        exchange.traceAttemptEnded(failure: nil)
        let bound = NIOLoopBound((self, exchange), eventLoop: context.eventLoop)
        let loop = context.eventLoop
        let trace = exchange.trace
        runtime.background.spawn {
            let (replacement, refresh) = await manager.tokenRejected(rejected, trace: trace)
            loop.execute {
                let (handler, exchange) = bound.value
                // As in `acquireCredential`: only the request that asked takes the replacement.
                guard handler.exchange === exchange else { return }
                exchange.traceWaited(on: refresh)
                let now = handler.now
                handler.feed { $0.refreshFinished(replacement, now: now, into: &$1) }
            }
        }
    }

    private func startAttempt(_ start: ExchangeStateMachine.Start) {
        guard let exchange, let context else { return }
        if start.countsAsRequest, let budget = exchange.destination.upstream?.budget {
            let now = self.now
            budget.withBudget { $0.recordRequest(now: now) }
        }
        let bound = NIOLoopBound(self, eventLoop: context.eventLoop)
        let generation = start.generation
        exchange.startAttempt(start, on: context.eventLoop) { events in
            bound.value.transportEvents(events, generation: generation)
        }
    }

    /// The backoff of a retry after a failure for want of a network also ends at the next network change
    /// (docs/reference/behaviour.md#the-network-coming-back).
    private func waitForNetworkChange(_ exchange: Exchange) {
        guard let context else { return }
        let bound = NIOLoopBound((self, exchange), eventLoop: context.eventLoop)
        exchange.stopWaitingForNetwork()
        exchange.networkWait = runtime.networkReturn.wait(after: exchange.networkSeen, on: context.eventLoop) {
            let (handler, exchange) = bound.value
            // The request may have ended, or another begun, since: the machine ignores a change it is not waiting for.
            guard handler.exchange === exchange else { return }
            exchange.networkWait = nil
            let now = handler.now
            handler.feed { $0.networkChanged(now: now, into: &$1) }
        }
    }

    // MARK: writing the response

    private func writeHead(_ received: UpstreamResponseHead, _ write: ConnectionStateMachine.HeadWrite) {
        guard let context else { return }
        // The head is copied only when a redirect is rewritten (changing a shared head copies its fields).
        if !received.redirectValueRanges.isEmpty, let exchange, let upstream = exchange.destination.upstream {
            var rewritten = received
            rewritten.rewriteRedirects(RedirectRewriter(upstream: upstream.config, target: exchange.target))
            writeHead(bytesOf: rewritten, write, context)
        } else {
            writeHead(bytesOf: received, write, context)
        }
    }

    private func writeHead(
        bytesOf head: UpstreamResponseHead, _ write: ConnectionStateMachine.HeadWrite, _ context: ChannelHandlerContext
    ) {
        // Room for a small body too: the connection appends one that arrives before its next flush.
        var capacity = head.fields.count + ResponseHeadWriter.upstreamHeadRoom
        if case .contentLength(let length) = write.framing, length <= 4096 { capacity += length }
        var buffer = allocator.buffer(capacity: capacity)
        ResponseHeadWriter.upstreamHead(
            head, into: &buffer, clientIsHTTP10: write.clientIsHTTP10, attempts: write.attempts, error: write.error,
            framing: write.framing, connection: write.connection)
        self.write(buffer, context)
    }

    private func endResponse(lastChunk: ResponseRelay.LastChunk?, close: Bool) {
        guard let context else { return }
        if let lastChunk {
            var end = allocator.buffer(capacity: 8)
            ResponseHeadWriter.chunkedEnd(&end, afterChunks: lastChunk.afterChunks)
            write(end, context)
        }
        writeHeldResponse(context)
        if close {
            writeAndFlush(allocator.buffer(capacity: 0), thenClose: true, context)
        } else {
            context.flush()
        }
    }

    private func writeError(_ reason: ProxyErrorReason, _ write: ConnectionStateMachine.ErrorWrite) {
        guard let context else { return }
        writeHeldResponse(context)
        var buffer = allocator.buffer(capacity: 256)
        ResponseHeadWriter.localError(
            reason, into: &buffer, clientIsHTTP10: write.clientIsHTTP10, connection: write.connection,
            omitBody: write.omitBody, attempts: write.attempts, message: write.message, retryAfter: write.retryAfter)
        writeAndFlush(buffer, thenClose: write.close, context)
    }

    private func writeAccepted(delivery: String, _ write: ConnectionStateMachine.ErrorWrite) {
        if let intake {
            logQueued(intake, status: 202, error: nil, delivery: delivery)
            intake.finish()
            self.intake = nil
        }
        guard let context else { return }
        writeHeldResponse(context)
        var buffer = allocator.buffer(capacity: 128)
        ResponseHeadWriter.accepted(
            delivery: delivery, into: &buffer, clientIsHTTP10: write.clientIsHTTP10, connection: write.connection)
        writeAndFlush(buffer, thenClose: write.close, context)
    }

    /// A whole answer written at once, then the close when asked (lingering, as
    /// docs/reference/behaviour.md#client-connections says). A future only when the connection closes after it: one
    /// costs a promise's allocation and a generic metadata lookup per answer
    /// (docs/performance.md#the-listener-and-the-upstream-side).
    private func writeAndFlush(_ buffer: ByteBuffer, thenClose close: Bool, _ context: ChannelHandlerContext) {
        guard close else {
            context.writeAndFlush(wrapOutboundOut(buffer), promise: nil)
            return
        }
        let channel = context.channel
        // A client connection lingers (`LingeringCloseHandler`): its client may still be sending a body the answer
        // refused. An intercepted one (TLS inside, which a half-close would cut) and the deliverer's own are closed.
        let lingers = intercepted == nil && !delivery
        let clock = self.clock
        context.writeAndFlush(wrapOutboundOut(buffer)).whenComplete { _ in
            if lingers {
                LingeringCloseHandler.close(channel, clock: clock)
            } else {
                channel.close(promise: nil)
            }
        }
    }

    /// The access line and request metrics of a queued request's answer: `202` with its delivery, or its refusal.
    private func logQueued(_ intake: QueueIntake, status: Int, error: String?, delivery: String?) {
        let elapsed = now - intake.started
        // On the status page too: a 507 `spool-full` among the upstream's failures.
        runtime.recordAnswer(
            upstream: intake.upstream, status: status, seconds: elapsed.seconds, attempts: 0, now: now,
            cause: error ?? "status \(status)")
        intake.answered(status: status, error: error, at: now)
        var request = intake.record
        request.delivery = delivery
        runtime.logAccess(
            AccessRecord(
                request: request, status: status, error: error, reason: nil, upstream: intake.upstream, attempts: 0,
                retries: [], elapsed: elapsed, bytes: 0),
            enabled: runtime.snapshot.config.log.accessLog)
    }

    /// Response bytes up to this many are held until the next flush (`heldResponse`); larger buffers go out as
    /// they are, never copied.
    static let coalescingLimit = 16 * 1024

    /// Appends `buffer` to the held bytes while they stay small, else writes the held bytes and then `buffer` (or
    /// holds it, when it is small itself).
    func write(_ buffer: ByteBuffer, _ context: ChannelHandlerContext) {
        if let held = heldResponse?.readableBytes {
            if held + buffer.readableBytes <= Self.coalescingLimit {
                heldResponse!.writeImmutableBuffer(buffer)  // in place: the handler holds the only reference
                return
            }
            writeHeldResponse(context)
        }
        if buffer.readableBytes < Self.coalescingLimit {
            heldResponse = buffer
        } else {
            context.write(wrapOutboundOut(buffer), promise: nil)
        }
    }

    /// Writes the held bytes, if any: before a flush, and before anything written past `write`.
    func writeHeldResponse(_ context: ChannelHandlerContext) {
        guard let held = heldResponse else { return }
        heldResponse = nil
        context.write(wrapOutboundOut(held), promise: nil)
    }

    func flush() {
        guard let context else { return }
        writeHeldResponse(context)
        context.flush()
    }
}
