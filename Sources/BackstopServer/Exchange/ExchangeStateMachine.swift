import BackstopCore
import BackstopIdentity
import BackstopTransport
import NIOCore

/// The decisions of one client request, from its head to the last byte of its response: when to attempt, what to
/// do with each attempt's outcome (deliver, retry after a delay, hold it while the token refreshes, fail), and
/// which deadline comes next. Pure: time comes in as `now` readings of a `BackstopClock`, randomness from an
/// injected generator, and every effect goes out as an `Action` that `Exchange` performs. The retry rules
/// themselves are `RetryPolicy`'s; this type sequences them (docs/reference/behaviour.md#retries).
///
/// States and their transitions (an event not listed for a state changes nothing and returns `.none`):
///
///     waitingForBody       bodyReceived (buffer full) → beginStreaming, then streamingBegan → acquiring/attempting
///                          bodyEnded → acquiringCredential | attempting;  too large, stalled → done
///                          bufferDenied (over `limits.buffer_memory`) → beginStreaming;  total deadline → done (408)
///     acquiringCredential  credentialAcquired(token) → attempting; (nil) → done (token-unavailable)
///                          total deadline → done (token-unavailable)
///     attempting           head → relaying | backingOff | awaitingRefresh;  failure → backingOff | done
///                          per-try deadline → backingOff | done (upstream-timeout); total deadline → done
///     awaitingRefresh      refreshFinished(token) → attempting (replay once); (nil) or total deadline → relaying
///                          (the held response, with token-refresh-failed); transport events are held meanwhile
///     backingOff           deadline → acquiringCredential | attempting
///     relaying             body → relaying; end → done; failure, overrun, idle deadline → done (connection closed)
///     done                 terminal
///
/// In every state but `done`, `clientGone` ends the exchange (its transfer cancelled) and `clientStalled` ends it
/// with 408 `request-timeout` before a response head, or by closing the connection after one.
struct ExchangeStateMachine {
    /// What one exchange is about; fixed when it starts.
    struct Configuration {
        var method: String
        /// The request has a body (a non-zero `Content-Length`, or chunked).
        var hasBody: Bool
        var declaredLength: Int?
        var retryBuffer: Int
        var maxRequestBody: Int
        var timeouts: Timeouts
        var hasIdempotencyKey: Bool
        var credential: CredentialKind
        /// nil for passthrough: one attempt, nothing retried.
        var retry: RetryPolicy?
        var budget: SharedRetryBudget?
        /// The body must be complete before the first attempt (`aws_sigv4` with `payload: signed` hashes it): one
        /// that would stream (above `retry_buffer`, or no room in `limits.buffer_memory`) gets 413 `body-too-large`.
        var bodyMustBeKept = false
        /// Bodies up to this size of a response that will be retried are left to finish, so curl keeps the
        /// connection for the retry; larger or unframed ones are cut.
        static let smallResponseLimit = 64 << 10
    }

    /// How the upstream is authenticated, as far as decisions go.
    enum CredentialKind: Equatable {
        case none
        /// Keychain entries read for each attempt, never refreshed: sent as is (`auth.type: static`), or the keys
        /// that sign the attempt (`aws_sigv4`, where a 403 is an answer, not a reason to refresh).
        case staticValue
        /// An OAuth2 token; a response status in `refreshOn` triggers one refresh and one replay.
        case oauth2(refreshOn: Set<Int>)
    }

    /// What an attempt carries in its auth header.
    enum Credential: Equatable {
        case none
        case value(String)
        case token(ManagedToken)
        /// The keys an `aws_sigv4` attempt is signed with (at its own time, when it starts). Boxed (`indirect`): three
        /// strings would make every `Credential` and `Action` of the plain path larger to copy.
        indirect case aws(SigV4Credentials)
    }

    /// Where the request body is, as far as decisions go (the bytes are the owner's).
    enum BodyMode: Equatable {
        case none
        /// Being kept for replay, this many bytes so far.
        case buffering(Int)
        /// Complete and kept: replayable.
        case buffered
        /// Sent as it arrives (too large for `retry_buffer`): an attempt can send it once only.
        case streaming(complete: Bool)
    }

    /// One attempt in flight: its generation (events of older attempts are ignored) and its deadline.
    struct Attempt: Equatable {
        var generation: Int
        var deadline: Duration
        /// The deadline is what is left of `timeouts.total` rather than `per_try`.
        var deadlineIsTotal: Bool
    }

    enum State {
        case waitingForBody
        case acquiringCredential
        case attempting(Attempt)
        /// The upstream rejected the token; its response head (and any events after it) wait for the refresh.
        /// Boxed (`indirect`): rare, and large enough to make every other state copy cost more.
        indirect case awaitingRefresh(Attempt, held: UpstreamResponseHead, events: [TransportEvent])
        case backingOff(until: Duration)
        /// The response head went to the client; `lastProgress` is when body bytes last moved (`timeouts.idle`).
        case relaying(generation: Int, lastProgress: Duration)
        case done
    }

    /// What to do with the transfer of an attempt that will be retried.
    enum Disposal: Equatable {
        /// It already ended.
        case none
        case cancel
        /// Let a small response finish (connection reuse), cancelled if it takes longer than this.
        case abandon(within: Duration)
    }

    /// An effect for the owner to perform.
    enum Action {
        case none
        /// Keep this body part: in the buffer, or in the stream once streaming.
        case storeBody
        /// Store this part, then turn the buffered body into a stream and report `streamingBegan`.
        case storeBodyAndBeginStreaming
        /// Turn the (still empty) body into a stream now and report `streamingBegan`: it will not fit the buffer.
        case beginStreaming
        /// The streamed body is complete.
        case finishBodyStream
        /// Get the credential for the next attempt and report `credentialAcquired`.
        case acquireCredential
        /// Start attempt `generation` (cancelling any earlier transfer); `mayResend` tells the transport whether
        /// the request may reach the upstream twice.
        case startAttempt(generation: Int, credential: Credential, mayResend: Bool)
        /// Refresh the rejected token (shared, single flight) and report `refreshFinished`.
        case refreshCredential(rejected: ManagedToken)
        /// The attempt failed in a retryable way: dispose of its transfer; `timerFired` comes at the deadline.
        case retry(after: Duration, reason: RetryCondition, disposal: Disposal)
        /// Write the head just reported to `responseHead` (the owner has it: it is not copied through here).
        case deliverHead(error: ProxyErrorReason?)
        /// Write this held head (after a refresh ended), then feed `replay` (events held meanwhile) back in.
        indirect case deliverHeldHead(UpstreamResponseHead, error: ProxyErrorReason?, replay: [TransportEvent])
        case relayBody(ByteBuffer)
        /// The response is complete; `requestComplete` says whether the client's body was read to its end.
        case completeResponse(requestComplete: Bool)
        /// End a response whose head went out by closing the connection (cancel the transfer, fail the stream).
        case abortResponse(note: String)
        /// Answer with a Backstop error (cancel the transfer, fail an incomplete stream).
        case failLocally(ProxyErrorReason, requestComplete: Bool)
        /// The client is gone: cancel the transfer and fail the stream.
        case cancel
    }

    let configuration: Configuration
    let startedAt: Duration
    private(set) var state: State = .waitingForBody
    private(set) var body: BodyMode = .none
    private(set) var requestComplete = false
    private var receivedBytes = 0
    /// Attempts started (`X-Backstop-Attempts`).
    private(set) var attempts = 0
    private var generation = 0
    /// The OAuth2 token the current attempt carries.
    private var token: ManagedToken?
    private var replayedAfterRefresh = false
    private var previousDelay: Duration?
    /// For the access line and logs.
    private(set) var retryReasons: [RetryCondition] = []
    private(set) var lastGiveUp: GiveUpReason?
    /// The `retry.on` condition (`503`, `connect-failure`, …) whose retry `lastGiveUp` refused.
    private(set) var lastGiveUpCondition: RetryCondition?
    private(set) var lastFailure: TransportFailure?
    /// The status the client got (set when the exchange ends).
    private(set) var finalStatus = 0

    init(configuration: Configuration, now: Duration) {
        self.configuration = configuration
        self.startedAt = now
    }

    /// Whether the request body can be sent again (fully buffered, or none).
    var bodyReplayable: Bool {
        switch body {
        case .none, .buffered: true
        case .buffering, .streaming: false
        }
    }

    var isDone: Bool { if case .done = state { true } else { false } }

    /// When `timerFired` must be called next, or nil when no deadline is pending.
    var nextDeadline: Duration? {
        switch state {
        case .done: nil
        // `timeouts.total` runs from the head: a body trickled in slower than that is answered 408.
        case .waitingForBody, .acquiringCredential, .awaitingRefresh: totalDeadline
        case .attempting(let attempt): attempt.deadline
        case .backingOff(let until): until
        case .relaying(_, let lastProgress): lastProgress + configuration.timeouts.idle
        }
    }

    private var totalDeadline: Duration { startedAt + configuration.timeouts.total }

    // MARK: the request

    /// The head arrived and was routed.
    mutating func start(now: Duration) -> Action {
        guard configuration.hasBody else {
            body = .none
            requestComplete = true
            return prepareAttempt(now: now)
        }
        if let length = configuration.declaredLength, length > configuration.retryBuffer {
            if configuration.bodyMustBeKept { return failLocally(.bodyTooLarge) }
            body = .streaming(complete: false)
            return .beginStreaming
        }
        body = .buffering(0)
        return .none
    }

    /// A body part of `count` bytes arrived.
    mutating func bodyReceived(count: Int, now: Duration) -> Action {
        guard !isDone else { return .none }
        receivedBytes += count
        if receivedBytes > configuration.maxRequestBody { return failLocally(.bodyTooLarge) }
        switch body {
        case .none, .buffered:
            return .none
        case .buffering(let buffered):
            let total = buffered + count
            guard total > configuration.retryBuffer else {
                body = .buffering(total)
                return .storeBody
            }
            if configuration.bodyMustBeKept { return failLocally(.bodyTooLarge) }
            body = .streaming(complete: false)
            return .storeBodyAndBeginStreaming
        case .streaming:
            return .storeBody
        }
    }

    /// The body part just reported does not fit `limits.buffer_memory`: the body is sent as it arrives instead of
    /// being kept (not retryable), as a body above `retry_buffer` is.
    mutating func bufferDenied(now: Duration) -> Action {
        guard case .buffering = body else { return .none }
        if configuration.bodyMustBeKept { return failLocally(.bodyTooLarge) }
        body = .streaming(complete: false)
        return .beginStreaming
    }

    /// The owner turned the body into a stream: the attempt starts now, while the body keeps arriving.
    mutating func streamingBegan(now: Duration) -> Action {
        guard case .waitingForBody = state else { return .none }
        return prepareAttempt(now: now)
    }

    /// The request's last body byte (or its head, without a body) arrived.
    mutating func bodyEnded(now: Duration) -> Action {
        guard !isDone else { return .none }
        requestComplete = true
        switch body {
        case .none:
            return .none
        case .buffering:
            body = .buffered
            return prepareAttempt(now: now)
        case .buffered:
            return .none
        case .streaming:
            body = .streaming(complete: true)
            return .finishBodyStream
        }
    }

    // MARK: credentials and attempts

    /// Gets a credential when the upstream needs one, then starts the attempt.
    private mutating func prepareAttempt(now: Duration) -> Action {
        if configuration.credential == .none { return startAttempt(credential: .none, now: now) }
        state = .acquiringCredential
        return .acquireCredential
    }

    /// The credential for the next attempt, or nil when none can be had.
    mutating func credentialAcquired(_ credential: Credential?, now: Duration) -> Action {
        guard case .acquiringCredential = state else { return .none }
        guard let credential else { return failLocally(.tokenUnavailable) }
        return startAttempt(credential: credential, now: now)
    }

    private mutating func startAttempt(credential: Credential, now: Duration) -> Action {
        attempts += 1
        generation += 1
        if case .token(let managed) = credential { token = managed }
        if attempts == 1, let budget = configuration.budget {
            budget.withBudget { $0.recordRequest(now: now) }
        }
        let remaining = totalDeadline - now
        let isTotal = remaining <= configuration.timeouts.perTry
        let deadline = now + (isTotal ? max(remaining, .zero) : configuration.timeouts.perTry)
        state = .attempting(Attempt(generation: generation, deadline: deadline, deadlineIsTotal: isTotal))
        return .startAttempt(generation: generation, credential: credential, mayResend: mayResend)
    }

    /// Whether libcurl may resend the request by itself on a fresh connection (never for a request that may not
    /// reach the upstream twice).
    private var mayResend: Bool {
        let request = retryRequest
        if let retry = configuration.retry { return retry.mayRepeat(request) }
        return RetryConfig.defaultMethods.contains(configuration.method)
    }

    private var retryRequest: RetryRequestInfo {
        RetryRequestInfo(
            method: configuration.method, hasIdempotencyKey: configuration.hasIdempotencyKey,
            bodyReplayable: bodyReplayable)
    }

    // MARK: transport events

    /// A response head of attempt `generation` arrived.
    mutating func responseHead(
        _ head: UpstreamResponseHead, generation: Int, now: Duration, wall: Double,
        random: inout some RandomNumberGenerator
    ) -> Action {
        guard case .attempting(let attempt) = state, attempt.generation == generation else { return .none }
        // Backstop forwards no `Upgrade` (a hop-by-hop field), so a 101 answers a question nobody asked: what
        // follows it is not HTTP, and relaying it would hand the client a foreign protocol.
        if head.status == 101 {
            return attemptFailed(
                .badResponse(detail: "101 Switching Protocols to a request that asked for no upgrade"),
                disposal: .cancel, now: now, wall: wall, random: &random)
        }
        if case .oauth2(let refreshOn) = configuration.credential, refreshOn.contains(head.status),
            !replayedAfterRefresh, bodyReplayable, let rejected = token
        {
            state = .awaitingRefresh(attempt, held: head, events: [])
            return .refreshCredential(rejected: rejected)
        }
        if configuration.retry?.config.on.contains(.status(head.status)) == true {
            let outcome = AttemptOutcome.response(
                status: head.status, retryAfter: head.retryAfter, rateLimitReset: head.rateLimitReset)
            if case .retry(let delay, let reason) = decide(outcome, now: now, wall: wall, random: &random) {
                let small = head.contentLength.map { $0 <= Configuration.smallResponseLimit } ?? false
                return scheduleRetry(
                    after: delay, reason: reason,
                    disposal: small ? .abandon(within: configuration.timeouts.idle) : .cancel,
                    now: now)
            }
        }
        finalStatus = head.status
        state = .relaying(generation: generation, lastProgress: now)
        return .deliverHead(error: nil)
    }

    private mutating func deliverHeld(_ head: UpstreamResponseHead, replay: [TransportEvent], now: Duration) -> Action {
        finalStatus = head.status
        state = .relaying(generation: generation, lastProgress: now)
        return .deliverHeldHead(head, error: .tokenRefreshFailed, replay: replay)
    }

    /// Body bytes of attempt `generation`.
    mutating func responseBody(_ buffer: ByteBuffer, generation: Int, now: Duration) -> Action {
        switch state {
        case .relaying(let current, _) where current == generation:
            state = .relaying(generation: current, lastProgress: now)
            return .relayBody(buffer)
        case .awaitingRefresh(let attempt, let held, var events) where attempt.generation == generation:
            events.append(.body(buffer))
            state = .awaitingRefresh(attempt, held: held, events: events)
            return .none
        default:
            return .none
        }
    }

    /// Attempt `generation` ended normally.
    mutating func responseEnded(generation: Int) -> Action {
        switch state {
        case .relaying(let current, _) where current == generation:
            state = .done
            return .completeResponse(requestComplete: requestComplete)
        case .awaitingRefresh(let attempt, let held, var events) where attempt.generation == generation:
            events.append(.end)
            state = .awaitingRefresh(attempt, held: held, events: events)
            return .none
        default:
            return .none
        }
    }

    /// Attempt `generation` failed below HTTP.
    mutating func transportFailed(
        _ failure: TransportFailure, generation: Int, now: Duration, wall: Double,
        random: inout some RandomNumberGenerator
    ) -> Action {
        switch state {
        case .relaying(let current, _) where current == generation:
            lastFailure = failure
            state = .done
            return .abortResponse(note: "upstream-broke-mid-response")
        case .awaitingRefresh(let attempt, let held, var events) where attempt.generation == generation:
            events.append(.failure(failure))
            state = .awaitingRefresh(attempt, held: held, events: events)
            return .none
        case .attempting(let attempt) where attempt.generation == generation:
            return attemptFailed(failure, disposal: .none, now: now, wall: wall, random: &random)
        default:
            return .none
        }
    }

    private mutating func attemptFailed(
        _ failure: TransportFailure, disposal: Disposal, now: Duration, wall: Double,
        random: inout some RandomNumberGenerator
    ) -> Action {
        lastFailure = failure
        let outcome: AttemptOutcome?
        switch failure {
        case .connectFailure: outcome = .connectFailure
        case .reset, .badResponse: outcome = .reset
        case .timeout: outcome = .timeout
        case .cancelled, .requestBodyFailed, .loopDetected, .destinationDenied, .tlsVerificationFailed: outcome = nil
        }
        if let outcome, case .retry(let delay, let reason) = decide(outcome, now: now, wall: wall, random: &random) {
            return scheduleRetry(after: delay, reason: reason, disposal: disposal, now: now)
        }
        switch failure {
        case .timeout: return failLocally(.upstreamTimeout)
        case .requestBodyFailed: return failLocally(.badRequest)
        case .connectFailure, .tlsVerificationFailed, .reset, .cancelled: return failLocally(.upstreamUnreachable)
        case .badResponse: return failLocally(.badUpstreamResponse)
        case .loopDetected: return failLocally(.loopDetected)
        case .destinationDenied: return failLocally(.destinationDenied)
        }
    }

    private mutating func decide(
        _ outcome: AttemptOutcome, now: Duration, wall: Double,
        random: inout some RandomNumberGenerator
    ) -> RetryDecision {
        guard let policy = configuration.retry, let budget = configuration.budget else {
            lastGiveUp = .notRetryableCondition
            lastGiveUpCondition = outcome.condition
            return .giveUp(.notRetryableCondition)
        }
        let (attempt, request, previous) = (attempts, retryRequest, previousDelay)
        let decision = budget.withBudget { budget in
            policy.decide(
                attempt: attempt, outcome: outcome, request: request, elapsed: now - startedAt, previousDelay: previous,
                nowWall: wall, now: now, budget: &budget, random: &random)
        }
        if case .giveUp(let reason) = decision {
            lastGiveUp = reason
            lastGiveUpCondition = outcome.condition
        }
        return decision
    }

    private mutating func scheduleRetry(
        after delay: Duration, reason: RetryCondition, disposal: Disposal,
        now: Duration
    ) -> Action {
        previousDelay = delay
        retryReasons.append(reason)
        state = .backingOff(until: now + delay)
        return .retry(after: delay, reason: reason, disposal: disposal)
    }

    // MARK: token refresh

    /// The refresh asked for by `.refreshCredential` ended: replay once with `replacement`, or deliver the held
    /// response with `token-refresh-failed`.
    mutating func refreshFinished(_ replacement: ManagedToken?, now: Duration) -> Action {
        guard case .awaitingRefresh(_, let held, let events) = state else { return .none }
        guard let replacement else { return deliverHeld(held, replay: events, now: now) }
        replayedAfterRefresh = true
        return startAttempt(credential: .token(replacement), now: now)
    }

    // MARK: time

    /// The connection's timer fired: handle whichever deadline passed.
    mutating func timerFired(now: Duration, wall: Double, random: inout some RandomNumberGenerator) -> Action {
        guard let deadline = nextDeadline, now >= deadline else { return .none }
        switch state {
        case .done:
            return .none
        case .waitingForBody:
            return failLocally(.requestTimeout)
        case .acquiringCredential:
            return failLocally(.tokenUnavailable)
        case .attempting(let attempt):
            if attempt.deadlineIsTotal { return failLocally(.upstreamTimeout) }
            return attemptFailed(
                .timeout(detail: "per_try timeout"), disposal: .cancel, now: now, wall: wall,
                random: &random)
        case .awaitingRefresh(_, let held, let events):
            // The refresh outlived the request's budget: answer with what the upstream said.
            return deliverHeld(held, replay: events, now: now)
        case .backingOff:
            return prepareAttempt(now: now)
        case .relaying:
            state = .done
            return .abortResponse(note: "response-body-idle")
        }
    }

    // MARK: the client

    /// The client socket drained: the response is making progress.
    mutating func clientWritable(now: Duration) {
        if case .relaying(let current, _) = state { state = .relaying(generation: current, lastProgress: now) }
    }

    /// The client sent more than it announced: the response ends by closing the connection.
    mutating func responseOverran() -> Action {
        guard case .relaying = state else { return .none }
        state = .done
        return .abortResponse(note: "upstream-body-longer-than-announced")
    }

    /// The upstream's body ended before its announced length.
    mutating func responseFellShort() -> Action {
        state = .done
        return .abortResponse(note: "upstream-body-shorter-than-announced")
    }

    /// The client stopped sending its body for `client_idle_timeout`.
    mutating func clientStalled() -> Action {
        switch state {
        case .done: return .none
        case .relaying:
            state = .done
            return .abortResponse(note: "request-body-stalled")
        default:
            return failLocally(.requestTimeout)
        }
    }

    /// The client disconnected: everything stops, pending retries included.
    mutating func clientGone() -> Action {
        guard !isDone else { return .none }
        state = .done
        finalStatus = 499
        return .cancel
    }

    private mutating func failLocally(_ reason: ProxyErrorReason) -> Action {
        if case .relaying = state {
            state = .done
            return .abortResponse(note: reason.rawValue)
        }
        state = .done
        finalStatus = reason.status
        return .failLocally(reason, requestComplete: requestComplete)
    }
}
