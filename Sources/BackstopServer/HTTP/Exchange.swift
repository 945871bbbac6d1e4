import BackstopCore
import BackstopTransport
import Logging
import NIOCore
import NIOHTTP1

#if canImport(Glibc)
import Glibc
#endif

/// One client request from routing to the last byte of its response: owns the attempt loop, the request body
/// (buffered for replay, or streamed once), the per-try and total timers, and the relay of the response.
///
/// Confined to the connection's event loop. Decisions about retrying come from the pure `AttemptDecider`;
/// this type only performs them.
final class Exchange {
    enum Destination {
        case upstream(UpstreamRuntime, path: String)
        case passthrough(url: String)
    }

    private enum Body {
        case none
        case buffering(ByteBuffer)
        case buffered(ByteBuffer)
        case streaming(RequestBodyStream)
    }

    private enum Phase {
        case waitingForBody
        /// Waiting for the token manager before an attempt.
        case acquiringToken
        case attempting
        /// The upstream rejected the token (`refresh_on`); its response is held while the token is refreshed.
        case awaitingRefresh
        case backingOff
        case relayingResponse
        case done
    }

    private let runtime: ProxyRuntime
    private let snapshot: ConfigSnapshot
    private let head: HTTPRequestHead
    private let framing: RequestFraming
    private let destination: Destination
    private let eventLoop: EventLoop
    private let handler: ProxyHandler
    private let limits: Limits
    private let timeouts: Timeouts

    private var body: Body = .none
    private var receivedBytes = 0
    private var requestComplete = false
    private var phase: Phase = .waitingForBody
    private var attempts = 0
    /// Identifies the current attempt so events of a cancelled one are ignored.
    private var attemptToken = 0
    private var transfer: CurlTransfer?
    /// When the current attempt times out (`per_try`, cut short by what is left of `total`), checked by the
    /// connection's lazy timer (`ProxyHandler.wakeUp(at:)`) rather than a timer of its own per attempt.
    private var attemptDeadline: NIODeadline?
    private var attemptDeadlineIsTotal = false
    private var totalTimer: Scheduled<Void>?
    private var backoffTimer: Scheduled<Void>?
    private let startedAt = NIODeadline.now()
    private var responseStatus = 0
    private var responseBytes = 0
    /// The OAuth2 token the current attempt carries.
    private var token: ManagedToken?
    /// The value injected into the auth header (static or OAuth2), if any.
    private var authValue: String?
    /// A request is replayed after a token refresh at most once.
    private var replayedAfterRefresh = false
    private var heldHead: UpstreamResponseHead?
    /// How the relayed body is framed for the client, and whether a chunk went out yet.
    private var responseFraming = ResponseFraming.bodyless
    private var sentChunk = false
    /// Body bytes the client may still get under the `Content-Length` it was told: never more, whatever the
    /// upstream sends (no upstream can place bytes in the answer to the client's next request).
    private var announcedRemaining = 0
    /// When body bytes last moved (from the upstream, or out to the client): `timeouts.idle` counts from here.
    private var lastBodyProgress = NIODeadline.now()
    /// Body bytes written to the client but not yet reported to the transport (the client socket was full).
    private var unreportedBytes = 0
    private var heldEvents: [TransportEvent] = []
    /// Conditions that caused retries, for the access log.
    private var retryReasons: [String] = []
    private var previousDelay: Duration?
    private var random = SystemRandomNumberGenerator()

    /// The request-target as parsed (for mapping upstream redirects back to the client's view).
    private let target: RequestTarget
    /// Who asked, and for which host, for the access line.
    private let client: String
    private let clientHost: String
    /// Why the last failed attempt failed (curl's error, errno, address), for logs and the access line.
    private var lastFailureCause: String?
    /// Why the last retry decision gave up (logged with the final failure: `budget-exhausted`, …).
    private var lastGiveUp: GiveUpReason?

    init(
        runtime: ProxyRuntime, snapshot: ConfigSnapshot, head: HTTPRequestHead, framing: RequestFraming,
        destination: Destination, eventLoop: EventLoop, handler: ProxyHandler, client: String, clientHost: String,
        target: RequestTarget
    ) {
        self.target = target
        self.client = client
        self.clientHost = clientHost
        self.runtime = runtime
        self.snapshot = snapshot
        self.head = head
        self.framing = framing
        self.destination = destination
        self.eventLoop = eventLoop
        self.handler = handler
        self.limits = snapshot.config.limits
        switch destination {
        case .upstream(let upstream, _): self.timeouts = upstream.config.timeouts
        case .passthrough: self.timeouts = Timeouts()
        }
    }

    private var upstreamName: String {
        switch destination {
        case .upstream(let upstream, _): upstream.config.name
        case .passthrough: "-"
        }
    }

    private var upstream: UpstreamRuntime? {
        if case .upstream(let upstream, _) = destination { return upstream }
        return nil
    }

    /// Whether the request body can be sent again (fully buffered, or none).
    private var bodyReplayable: Bool {
        switch body {
        case .none, .buffered: true
        case .buffering, .streaming: false
        }
    }

    // MARK: input from the handler

    func start() {
        runtime.requestStarted()
        if !framing.hasBody {
            body = .none
        } else if let length = framing.contentLength, length > limits.retryBuffer {
            beginStreamingBody(initial: nil)
        } else {
            body = .buffering(ByteBuffer())
        }
    }

    func receiveBody(_ chunk: ByteBuffer) {
        guard phase != .done else { return }
        receivedBytes += chunk.readableBytes
        if receivedBytes > limits.maxRequestBody {
            failLocally(.bodyTooLarge)
            return
        }
        switch body {
        case .none, .buffered:
            return
        case .buffering(var buffer):
            var chunk = chunk
            buffer.writeBuffer(&chunk)
            if buffer.readableBytes > limits.retryBuffer {
                beginStreamingBody(initial: buffer)
            } else {
                body = .buffering(buffer)
            }
        case .streaming(let stream):
            if !stream.append(chunk) { handler.holdReads() }
        }
    }

    func receiveEnd() {
        guard phase != .done else { return }
        requestComplete = true
        switch body {
        case .none:
            prepareAttempt()
        case .buffering(let buffer):
            body = .buffered(buffer)
            prepareAttempt()
        case .buffered:
            break
        case .streaming(let stream):
            stream.finish()
        }
    }

    /// The client stopped sending its request body for `client_idle_timeout`: 408 if nothing was answered yet,
    /// else the connection is closed.
    func clientStalled() {
        guard phase != .done else { return }
        if phase == .relayingResponse {
            transfer?.cancel()
            if case .streaming(let stream) = body { stream.fail() }
            finish(status: responseStatus, note: "request-body-stalled")
            handler.abortResponse()
            return
        }
        failLocally(.requestTimeout)
    }

    /// The client disconnected: cancel everything, including pending retries.
    func clientGone() {
        guard phase != .done else { return }
        if case .streaming(let stream) = body { stream.fail() }
        finish(status: 499, note: "client-closed")
    }

    // MARK: attempts

    private func beginStreamingBody(initial: ByteBuffer?) {
        let loop = NIOLoopBound(handler, eventLoop: eventLoop)
        let eventLoop = self.eventLoop
        let stream = RequestBodyStream(expectedLength: framing.contentLength) {
            eventLoop.execute { loop.value.releaseReads() }
        }
        if let initial, !stream.append(initial) { handler.holdReads() }
        body = .streaming(stream)
        prepareAttempt()
    }

    /// Gets the credentials the attempt needs (if any), then starts it.
    private func prepareAttempt() {
        guard phase == .waitingForBody || phase == .backingOff else { return }
        guard let upstream else {
            startAttempt()
            return
        }
        switch upstream.auth {
        case .none:
            startAttempt()
        case .staticToken(let source, _):
            guard let value = source.value() else {
                failLocally(.tokenUnavailable)
                return
            }
            authValue = value
            startAttempt()
        case .oauth2(let manager, _):
            if let token = manager.cachedToken() {
                self.token = token
                authValue = token.value
                startAttempt()
                return
            }
            phase = .acquiringToken
            startTotalTimerIfNeeded()
            let bound = NIOLoopBound(self, eventLoop: eventLoop)
            let eventLoop = self.eventLoop
            Task {
                let token = await manager.tokenForRequest()
                eventLoop.execute { bound.value.tokenAcquired(token) }
            }
        }
    }

    /// Bounds the waits outside attempts (token fetch, token refresh) by `timeouts.total`.
    private func startTotalTimerIfNeeded() {
        guard totalTimer == nil else { return }
        let remaining = timeouts.total - Duration.nanoseconds((NIODeadline.now() - startedAt).nanoseconds)
        totalTimer = eventLoop.assumeIsolated().scheduleTask(in: .init(max(remaining, .zero))) { [self] in
            totalTimer = nil
            totalDeadlinePassed()
        }
    }

    private func tokenAcquired(_ token: ManagedToken?) {
        guard phase == .acquiringToken else { return }
        guard let token else {
            failLocally(.tokenUnavailable)
            return
        }
        self.token = token
        authValue = token.value
        phase = .backingOff
        startAttempt()
    }

    private func startAttempt() {
        guard phase == .waitingForBody || phase == .backingOff else { return }
        phase = .attempting
        attempts += 1
        attemptToken += 1
        let token = attemptToken
        if attempts == 1, let upstream {
            let now = Self.monotonicNow()
            upstream.budget.withBudget { $0.recordRequest(now: now) }
        }

        let request = makeTransportRequest()
        let bound = NIOLoopBound(self, eventLoop: eventLoop)
        transfer = runtime.transport.start(request, on: eventLoop) { events in
            bound.value.handle(events, token: token)
        }
        let remaining = timeouts.total - Duration.nanoseconds((NIODeadline.now() - startedAt).nanoseconds)
        attemptDeadlineIsTotal = remaining <= timeouts.perTry
        let deadline = NIODeadline.now() + TimeAmount(min(timeouts.perTry, max(remaining, .zero)))
        attemptDeadline = deadline
        handler.wakeUp(at: deadline)
    }

    /// The connection's timer fired: handles an attempt deadline or a stalled response body (`timeouts.idle`);
    /// returns the next deadline still to come.
    func deadlineCheck(now: NIODeadline) -> NIODeadline? {
        if phase == .relayingResponse {
            let idleDeadline = lastBodyProgress + TimeAmount(timeouts.idle)
            guard now >= idleDeadline else { return idleDeadline }
            transfer?.cancel()
            finish(status: responseStatus, note: "response-body-idle")
            handler.abortResponse()
            return nil
        }
        guard let deadline = attemptDeadline, phase == .attempting else { return nil }
        guard now >= deadline else { return deadline }
        attemptDeadline = nil
        if attemptDeadlineIsTotal { totalDeadlinePassed() } else { perTryDeadlinePassed(token: attemptToken) }
        return nil
    }

    private func makeTransportRequest() -> TransportRequest {
        var pairs: [(name: String, value: String)] = []
        pairs.reserveCapacity(head.headers.count)
        for (name, value) in head.headers { pairs.append((name: name, value: value)) }
        let url: String
        let hostHeader: String
        var tls = TransportTLSOptions()
        var connectTimeout = timeouts.connect
        var passthrough = false
        switch destination {
        case .upstream(let upstream, let path):
            url = upstream.origin + path
            hostHeader = upstream.hostHeader
            tls = upstream.tls
            connectTimeout = upstream.config.timeouts.connect
        case .passthrough(let passthroughURL):
            url = passthroughURL
            hostHeader = Self.authority(of: passthroughURL) ?? head.headers.first(name: "host") ?? ""
            passthrough = true
        }
        var headers = HeaderRewriter.upstreamRequestHeaders(pairs, upstreamHost: hostHeader)
        if let injection = upstream?.auth.injection, let authValue {
            let value = injection.scheme.isEmpty ? authValue : "\(injection.scheme) \(authValue)"
            let clientSent = headers.contains { $0.name.caseInsensitiveEquals(injection.header) }
            if injection.policy == .replace || !clientSent {
                headers.removeAll { $0.name.caseInsensitiveEquals(injection.header) }
                headers.append((name: injection.header, value: value))
            }
        }
        let transportBody: TransportRequestBody
        switch body {
        case .none: transportBody = .empty
        case .buffering(let buffer), .buffered(let buffer):
            transportBody = buffer.readableBytes == 0 && !framing.hasBody ? .empty : .buffered(buffer)
        case .streaming(let stream): transportBody = .streaming(stream)
        }
        let method = head.method.rawValue
        let mayResend: Bool
        if let upstream {
            let keyHeader = upstream.config.retry.retryNonIdempotentWithKey
            mayResend = upstream.retryPolicy.mayRepeat(RetryRequestInfo(
                method: method, hasIdempotencyKey: keyHeader.map { head.headers.contains(name: $0) } ?? false,
                bodyReplayable: bodyReplayable))
        } else {
            mayResend = RetryConfig.defaultMethods.contains(method)
        }
        return TransportRequest(
            url: url, method: method, headers: headers, body: transportBody, connectTimeout: connectTimeout, tls: tls,
            mayResend: mayResend, passthrough: passthrough)
    }

    private static func authority(of url: String) -> String? {
        guard let schemeEnd = url.range(of: "://") else { return nil }
        let rest = url[schemeEnd.upperBound...]
        let end = rest.firstIndex { $0 == "/" || $0 == "?" } ?? rest.endIndex
        return String(rest[..<end])
    }

    private func handle(_ events: [TransportEvent], token: Int) {
        guard token == attemptToken else { return }
        guard phase == .attempting || phase == .relayingResponse || phase == .awaitingRefresh else { return }
        var written = 0
        for (index, event) in events.enumerated() {
            if phase == .awaitingRefresh {
                heldEvents.append(contentsOf: events[index...])
                return
            }
            // A head can end the attempt (retry scheduled, request done): the rest of its events are discarded.
            guard phase == .attempting || phase == .relayingResponse else { return }
            switch event {
            case .head(let responseHead):
                attemptDeadline = nil
                receivedHead(responseHead)
            case .body(let buffer):
                guard phase == .relayingResponse else { continue }
                written += relayBody(buffer)
                if overran {
                    transfer?.cancel()
                    finish(status: responseStatus, note: "upstream-body-longer-than-announced")
                    handler.flush()
                    handler.abortResponse()
                    return
                }
            case .end:
                completeResponse()
            case .failure(let failure):
                attemptFailed(failure)
            }
        }
        // One flush per batch of events; the transport learns what the client socket took, or waits for
        // `clientWritable()` when it is full (backpressure: the upstream read pauses at `CurlTransfer.highWater`).
        guard phase == .relayingResponse else { return }
        handler.flush()
        unreportedBytes += written
        if unreportedBytes > 0, handler.isWritable { clientWritable() }
    }

    /// Writes one chunk of body, framed for the client; returns the body bytes it carried.
    private func relayBody(_ buffer: ByteBuffer) -> Int {
        let count = buffer.readableBytes
        guard count > 0 else { return 0 }
        lastBodyProgress = NIODeadline.now()
        switch responseFraming {
        case .chunked:
            responseBytes += count
            var prefix = handler.allocator.buffer(capacity: 24)
            ResponseHeadWriter.chunkPrefix(&prefix, size: count, first: !sentChunk)
            sentChunk = true
            handler.writeResponse(prefix)
            handler.writeResponse(buffer)
        case .closeDelimited:
            responseBytes += count
            handler.writeResponse(buffer)
        case .contentLength:
            guard count <= announcedRemaining else {
                // The upstream sent more than it announced: the client gets exactly the announced body, then the
                // connection closes, so the excess can never be read as the next response.
                if announcedRemaining > 0 { handler.writeResponse(buffer.getSlice(at: buffer.readerIndex, length: announcedRemaining)!) }
                responseBytes += announcedRemaining
                announcedRemaining = 0
                overran = true
                return 0
            }
            announcedRemaining -= count
            responseBytes += count
            handler.writeResponse(buffer)
        case .bodyless:
            break  // curl delivers none; a stray byte must not corrupt the connection
        }
        return count
    }

    /// The upstream's body ran past its announced length (the exchange ends by closing the client connection).
    private var overran = false

    /// The client socket drained: the body bytes written so far count as consumed.
    func clientWritable() {
        if phase == .relayingResponse { lastBodyProgress = NIODeadline.now() }
        guard unreportedBytes > 0, let transfer else { return }
        let count = unreportedBytes
        unreportedBytes = 0
        transfer.consumed(count)
    }

    /// A response head arrived: refresh the token and replay, retry, or deliver.
    private func receivedHead(_ upstreamHead: UpstreamResponseHead) {
        runtime.metrics.recordAttempt(upstream: upstreamName, outcome: ProxyMetrics.statusClassLabel(upstreamHead.status))
        if case .oauth2(let manager, let oauth)? = upstream?.auth, oauth.refreshOn.contains(upstreamHead.status),
            !replayedAfterRefresh, bodyReplayable, let rejected = token
        {
            phase = .awaitingRefresh
            startTotalTimerIfNeeded()
            heldHead = upstreamHead
            heldEvents = []
            let bound = NIOLoopBound(self, eventLoop: eventLoop)
            let eventLoop = self.eventLoop
            Task {
                let replacement = await manager.tokenRejected(rejected)
                eventLoop.execute { bound.value.refreshFinished(replacement) }
            }
            return
        }
        if let upstream, upstream.config.retry.on.contains(.status(upstreamHead.status)) {
            let outcome = AttemptOutcome.response(
                status: upstreamHead.status, retryAfter: upstreamHead.retryAfter,
                rateLimitReset: upstreamHead.rateLimitReset)
            if case .retry(let delay, let reason) = decide(outcome, upstream: upstream) {
                // A small body is left to finish (and ignored) so curl keeps the connection for the retry;
                // cancelling mid-response would close it.
                let small = upstreamHead.contentLength.map { $0 <= 64 << 10 } ?? false
                scheduleRetry(after: delay, reason: reason, cancelAttempt: !small)
                return
            }
        }
        deliverHead(upstreamHead)
    }

    private func decide(_ outcome: AttemptOutcome, upstream: UpstreamRuntime) -> RetryDecision {
        let keyHeader = upstream.config.retry.retryNonIdempotentWithKey
        let request = RetryRequestInfo(
            method: head.method.rawValue,
            hasIdempotencyKey: keyHeader.map { head.headers.contains(name: $0) } ?? false,
            bodyReplayable: bodyReplayable)
        let elapsed = Duration.nanoseconds((NIODeadline.now() - startedAt).nanoseconds)
        let now = Self.monotonicNow()
        let wall = Self.wallNow()
        let previous = previousDelay
        var random = self.random
        let decision = upstream.budget.withBudget { budget in
            upstream.retryPolicy.decide(
                attempt: attempts, outcome: outcome, request: request, elapsed: elapsed, previousDelay: previous,
                nowWall: wall, now: now, budget: &budget, random: &random)
        }
        if case .giveUp(.budgetExhausted) = decision {
            runtime.metrics.recordBudgetExhausted(upstream: upstream.config.name)
        }
        if case .giveUp(let reason) = decision { lastGiveUp = reason }
        return decision
    }

    /// Discards the current attempt (its body is never sent to the client) and starts another after `delay`.
    private func scheduleRetry(after delay: Duration, reason: RetryCondition, cancelAttempt: Bool = true) {
        if cancelAttempt {
            transfer?.cancel()
        } else {
            // Left to finish so curl keeps the connection, but never for longer than `timeouts.idle`.
            transfer?.abandon(within: timeouts.idle)
        }
        transfer = nil
        attemptDeadline = nil
        attemptToken += 1
        previousDelay = delay
        retryReasons.append(reason.description)
        runtime.metrics.recordRetry(upstream: upstreamName, reason: reason.description)
        phase = .backingOff
        backoffTimer = eventLoop.assumeIsolated().scheduleTask(in: TimeAmount(delay)) { [self] in
            backoffTimer = nil
            prepareAttempt()
        }
    }

    static func monotonicNow() -> Duration { .nanoseconds(Int64(NIODeadline.now().uptimeNanoseconds)) }

    static func wallNow() -> Double {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        return Double(now.tv_sec) + Double(now.tv_nsec) / 1e9
    }

    private func refreshFinished(_ replacement: ManagedToken?) {
        guard phase == .awaitingRefresh, let held = heldHead else { return }
        heldHead = nil
        if let replacement {
            // Replay once with the new token; the rejected response is discarded, never sent.
            transfer?.cancel()
            attemptToken += 1
            heldEvents = []
            replayedAfterRefresh = true
            token = replacement
            authValue = replacement.value
            phase = .backingOff
            startAttempt()
            return
        }
        phase = .attempting
        deliverHead(held, error: .tokenRefreshFailed)
        let events = heldEvents
        heldEvents = []
        handle(events, token: attemptToken)
    }

    private func deliverHead(_ received: UpstreamResponseHead, error: ProxyErrorReason? = nil) {
        var upstreamHead = received
        if !upstreamHead.redirectValueRanges.isEmpty, let upstream {
            upstreamHead.rewriteRedirects(RedirectRewriter(upstream: upstream.config, target: target))
        }
        phase = .relayingResponse
        totalTimer?.cancel()
        totalTimer = nil
        responseStatus = upstreamHead.status
        let http10 = handler.clientIsHTTP10
        responseFraming = ResponseFraming.decide(
            requestIsHEAD: head.method == .HEAD, status: upstreamHead.status,
            contentLength: upstreamHead.contentLength, clientIsHTTP10: http10)
        if case .contentLength(let length) = responseFraming { announcedRemaining = length }
        lastBodyProgress = NIODeadline.now()
        let connection: ResponseHeadWriter.ConnectionField =
            handler.closeAfterResponse || responseFraming.endsConnection ? .close : (http10 ? .keepAlive : .none)
        var buffer = handler.allocator.buffer(capacity: upstreamHead.fields.count + 192)
        ResponseHeadWriter.upstreamHead(
            upstreamHead, into: &buffer, clientIsHTTP10: http10, attempts: attempts, error: error, framing: responseFraming,
            connection: connection)
        handler.writeResponse(buffer)
        handler.wakeUp(at: lastBodyProgress + TimeAmount(timeouts.idle))
    }

    private func completeResponse() {
        if case .contentLength = responseFraming, announcedRemaining > 0 {
            // Shorter than announced: the client would wait for the rest, or read the next response as body.
            finish(status: responseStatus, note: "upstream-body-shorter-than-announced")
            handler.abortResponse()
            return
        }
        let complete = requestComplete
        if case .streaming(let stream) = body, !complete { stream.fail() }
        finish(status: responseStatus, note: nil)
        var tail: ByteBuffer?
        if responseFraming == .chunked {
            var end = handler.allocator.buffer(capacity: 8)
            ResponseHeadWriter.chunkedEnd(&end, afterChunks: sentChunk)
            tail = end
        }
        handler.writeResponseEnd(tail: tail, requestComplete: complete, close: responseFraming.endsConnection)
    }

    private func attemptFailed(_ failure: TransportFailure) {
        if phase == .relayingResponse {
            finish(status: responseStatus, note: "upstream-broke-mid-response")
            handler.abortResponse()
            return
        }
        attemptDeadline = nil
        runtime.metrics.recordAttempt(upstream: upstreamName, outcome: failure.label)
        lastFailureCause = failure.detail
        if let upstream {
            let outcome: AttemptOutcome?
            switch failure {
            case .connectFailure: outcome = .connectFailure
            case .reset, .badResponse: outcome = .reset
            case .timeout: outcome = .timeout
            case .cancelled, .requestBodyFailed, .loopDetected, .destinationDenied: outcome = nil
            }
            if let outcome, case .retry(let delay, let reason) = decide(outcome, upstream: upstream) {
                logAttemptFailure(failure, final: false)
                scheduleRetry(after: delay, reason: reason)
                return
            }
        }
        if failure != .cancelled { logAttemptFailure(failure, final: true) }
        switch failure {
        case .timeout: failLocally(.upstreamTimeout)
        case .cancelled: failLocally(.upstreamUnreachable)
        case .requestBodyFailed: failLocally(.badRequest)
        case .connectFailure, .reset: failLocally(.upstreamUnreachable)
        case .badResponse: failLocally(.badUpstreamResponse)
        case .loopDetected: failLocally(.loopDetected)
        case .destinationDenied: failLocally(.destinationDenied)
        }
    }

    /// The cause of a failed attempt: `debug` when it is retried, `info` for the last one (the access line then
    /// carries it as `reason` too).
    private func logAttemptFailure(_ failure: TransportFailure, final: Bool) {
        let level: Logger.Level = final ? .info : .debug
        guard runtime.logger.logLevel <= level else { return }
        var metadata: Logger.Metadata = [
            "upstream": .string(upstreamName), "attempt": .stringConvertible(attempts), "outcome": .string(failure.label),
            "reason": .string(failure.detail), "method": .string(head.method.rawValue), "host": .string(clientHost),
        ]
        if final, let lastGiveUp { metadata["not_retried"] = .string(lastGiveUp.rawValue) }
        runtime.logger.log(level: level, final ? "attempt failed" : "attempt failed; retrying", metadata: metadata)
    }

    private func perTryDeadlinePassed(token: Int) {
        guard token == attemptToken, phase == .attempting else { return }
        transfer?.cancel()
        attemptToken += 1
        attemptFailed(.timeout(detail: "per_try timeout"))
    }

    private func totalDeadlinePassed() {
        switch phase {
        case .attempting, .backingOff, .waitingForBody:
            transfer?.cancel()
            attemptToken += 1
            failLocally(.upstreamTimeout)
        case .acquiringToken:
            failLocally(.tokenUnavailable)
        case .awaitingRefresh:
            // The refresh outlived the request's budget: answer with what the upstream said.
            refreshFinished(nil)
        case .relayingResponse, .done:
            break
        }
    }

    /// Answers with a Backstop error (only possible before a response head went out).
    private func failLocally(_ reason: ProxyErrorReason) {
        guard phase != .done else { return }
        if phase == .relayingResponse {
            finish(status: responseStatus, note: reason.rawValue)
            handler.abortResponse()
            return
        }
        transfer?.cancel()
        if case .streaming(let stream) = body, !requestComplete { stream.fail() }
        let complete = requestComplete
        finish(status: reason.status, note: reason.rawValue)
        handler.exchangeFailed(reason, requestComplete: complete, attempts: attempts > 0 ? attempts : nil)
    }

    private func finish(status: Int, note: String?) {
        guard phase != .done else { return }
        phase = .done
        attemptDeadline = nil
        totalTimer?.cancel()
        backoffTimer?.cancel()
        if status == 499 { transfer?.cancel() }
        transfer = nil
        runtime.requestFinished()
        let elapsed = NIODeadline.now() - startedAt
        runtime.metrics.recordRequest(upstream: upstreamName, status: status, seconds: Double(elapsed.nanoseconds) / 1e9)
        runtime.logAccess(AccessRecord(
            client: client, method: head.method.rawValue, host: clientHost, path: target.path,
            status: status, error: note, reason: note == nil ? nil : lastFailureCause, upstream: upstreamName,
            attempts: attempts, retries: retryReasons, elapsed: elapsed, bytes: responseBytes),
            enabled: snapshot.config.log.accessLog)
    }
}

extension TimeAmount {
    init(_ duration: Duration) {
        let (seconds, attoseconds) = duration.components
        let nanos = seconds.multipliedReportingOverflow(by: 1_000_000_000)
        self = nanos.overflow ? .nanoseconds(.max) : .nanoseconds(nanos.partialValue + attoseconds / 1_000_000_000)
    }
}
