import BackstopCore
import BackstopTransport

/// The decisions of an upgrade request's handshake (docs/reference/behaviour.md#upgrades), without I/O: when to
/// make an attempt and with which credential, when to retry it under the upstream's `retry` policy and budget
/// (`RetryPolicy`, as for any `GET`), when a refused token is refreshed and the handshake replayed once (a status in
/// `auth.refresh_on`, as for any request), and how the handshake ends: a `101` (the relay starts, nothing is retried
/// after it), another answer (relayed to the client), or a local error. `UpgradeRelay` performs the actions.
///
///     awaitingCredential  credential → attempting;  (nil) or total deadline → ended (token-unavailable)
///     attempting          101 → ended (switch);  refresh_on status, first time → awaitingRefresh;  retry.on status
///                         or failure with a retry left → backingOff;  else → ended;  deadline → as a timeout
///     awaitingRefresh     refreshFinished(token) → attempting (the replay);  (nil) or total deadline → ended
///                         (the held answer, with token-refresh-failed)
///     backingOff          deadline → attempting
///     ended               terminal; `clientGone` leads here from anywhere
struct UpgradeHandshake {
    enum State: Equatable {
        case awaitingCredential
        case attempting(number: Int, deadline: Duration)
        /// Attempt `number`'s token was refused; its answer is held until the refresh ends or `deadline` (the end of
        /// `timeouts.total`) passes.
        case awaitingRefresh(number: Int, deadline: Duration)
        case backingOff(nextAttempt: Int, until: Duration)
        case ended
    }

    typealias Credential = ExchangeStateMachine.Credential

    enum Action: Equatable {
        case none
        /// Open a connection and send the handshake (attempt `number`, 1-based) carrying `credential`.
        case attempt(number: Int, credential: Credential)
        /// Close the attempt's connection; the next one starts when the timer reaches `until`. `failed`: the failure
        /// that ended the attempt (its deadline included), nil when a response did; the owner records it.
        case retry(after: Duration, reason: RetryCondition, failed: TransportFailure? = nil)
        /// The upstream refused `rejected`: hold its answer (the connection stays, unread), refresh the token the way
        /// every request does (`TokenManager.tokenRejected`: shared, single flight) and report `refreshFinished`.
        case refreshCredential(rejected: ManagedToken)
        /// Answer the client with this error (after `attempts` attempts) and close. `failed`: the failure that ended
        /// the last attempt (its deadline included), nil when no attempt was made; the owner records it.
        case failLocally(ProxyErrorReason, attempts: Int, failed: TransportFailure? = nil)
        /// The upstream switched protocols: answer `101` and relay.
        case switchProtocols(attempts: Int)
        /// The upstream answered something else (or its refusal is what is left after a failed refresh, `error`
        /// `token-refresh-failed`): relay it to the client, then close.
        case relayResponse(attempts: Int, error: ProxyErrorReason? = nil)
    }

    private(set) var state = State.awaitingCredential
    let policy: RetryPolicy?
    let budget: SharedRetryBudget?
    let timeouts: Timeouts
    /// How the upstream authenticates: with `oauth2`, which statuses mean the token was refused.
    let credentialKind: ExchangeStateMachine.CredentialKind
    let startedAt: Duration
    private var previousDelay: Duration?
    /// What the attempts carry; replaced by a refresh.
    private(set) var credential: Credential?
    /// The one replay after a refresh was made: a refused token now is the answer.
    private var replayedAfterRefresh = false
    /// The `retry.on` conditions that caused retries, in order (for the access line).
    private(set) var retryReasons: [RetryCondition] = []
    /// The last transport failure (for the access line's `reason`).
    private(set) var lastFailure: TransportFailure?

    init(
        policy: RetryPolicy?, budget: SharedRetryBudget?, timeouts: Timeouts,
        credentialKind: ExchangeStateMachine.CredentialKind = .none, now: Duration
    ) {
        self.policy = policy
        self.budget = budget
        self.timeouts = timeouts
        self.credentialKind = credentialKind
        self.startedAt = now
        budget?.withBudget { $0.recordRequest(now: now) }
    }

    /// When `timerFired` must run next, if anything waits on time.
    var deadline: Duration? {
        switch state {
        case .attempting(_, let deadline), .awaitingRefresh(_, let deadline): deadline
        case .backingOff(_, let until): until
        // A token being fetched is waited for within `timeouts.total`, as for any request.
        case .awaitingCredential: startedAt + timeouts.total
        case .ended: nil
        }
    }

    /// The credential for the attempts, or nil when none can be had.
    mutating func credentialAcquired(_ credential: Credential?, now: Duration) -> Action {
        guard state == .awaitingCredential else { return .none }
        guard let credential else {
            state = .ended
            return .failLocally(.tokenUnavailable, attempts: 0)
        }
        self.credential = credential
        return begin(1, now: now)
    }

    /// The response head of the current attempt arrived.
    mutating func responseHead(
        status: Int, retryAfter: String?, rateLimitReset: String?, now: Duration, wall: Double,
        random: inout some RandomNumberGenerator
    ) -> Action {
        guard case .attempting(let number, _) = state else { return .none }
        if status == 101 {
            state = .ended
            return .switchProtocols(attempts: number)
        }
        // The same rule as any request's (docs/reference/behaviour.md#token-refresh): one refresh, one replay.
        if case .oauth2(let refreshOn) = credentialKind, refreshOn.contains(status), !replayedAfterRefresh,
            case .token(let rejected)? = credential
        {
            state = .awaitingRefresh(number: number, deadline: startedAt + timeouts.total)
            return .refreshCredential(rejected: rejected)
        }
        if policy?.config.on.contains(.status(status)) == true {
            let outcome = AttemptOutcome.response(
                status: status, retryAfter: retryAfter, rateLimitReset: rateLimitReset)
            if let retry = retry(after: outcome, attempt: number, failed: nil, now: now, wall: wall, random: &random) {
                return retry
            }
        }
        state = .ended
        return .relayResponse(attempts: number)
    }

    /// The current attempt failed before its head arrived.
    mutating func attemptFailed(
        _ failure: TransportFailure, now: Duration, wall: Double, random: inout some RandomNumberGenerator
    ) -> Action {
        guard case .attempting(let number, _) = state else { return .none }
        lastFailure = failure
        let outcome: AttemptOutcome? =
            switch failure {
            case .connectFailure: .connectFailure
            case .reset, .badResponse: .reset
            case .timeout: .timeout
            case .cancelled, .shutDown, .requestBodyFailed, .loopDetected, .destinationDenied,
                .tlsVerificationFailed:
                nil
            }
        if let outcome,
            let retry = retry(
                after: outcome, attempt: number, failed: failure, now: now, wall: wall, random: &random)
        {
            return retry
        }
        state = .ended
        return .failLocally(Self.reason(for: failure), attempts: number, failed: failure)
    }

    /// The refresh asked for by `.refreshCredential` ended: replay the handshake once with `replacement`, or relay
    /// the held answer with `token-refresh-failed`.
    mutating func refreshFinished(_ replacement: ManagedToken?, now: Duration) -> Action {
        guard case .awaitingRefresh(let number, _) = state else { return .none }
        guard let replacement else {
            state = .ended
            return .relayResponse(attempts: number, error: .tokenRefreshFailed)
        }
        replayedAfterRefresh = true
        credential = .token(replacement)
        return begin(number + 1, now: now)
    }

    /// Time passed: the attempt's deadline (`timeouts.per_try`, or what is left of `timeouts.total`) or the end
    /// of a backoff.
    mutating func timerFired(now: Duration, wall: Double, random: inout some RandomNumberGenerator) -> Action {
        switch state {
        case .awaitingCredential where now >= startedAt + timeouts.total:
            state = .ended
            return .failLocally(.tokenUnavailable, attempts: 0)
        case .attempting(_, let deadline) where now >= deadline:
            return attemptFailed(
                .timeout(detail: "no response head within the attempt's deadline"), now: now, wall: wall,
                random: &random)
        case .awaitingRefresh(let number, let deadline) where now >= deadline:
            // The refresh outlived the request's budget: the client gets what the upstream said.
            state = .ended
            return .relayResponse(attempts: number, error: .tokenRefreshFailed)
        case .backingOff(let next, let until) where now >= until:
            return begin(next, now: now)
        default:
            return .none
        }
    }

    /// The client went away: nothing more happens.
    mutating func clientGone() { state = .ended }

    private mutating func begin(_ number: Int, now: Duration) -> Action {
        guard let credential else { return .none }
        let total = startedAt + timeouts.total
        state = .attempting(number: number, deadline: min(now + timeouts.perTry, total))
        return .attempt(number: number, credential: credential)
    }

    private mutating func retry(
        after outcome: AttemptOutcome, attempt: Int, failed: TransportFailure?, now: Duration, wall: Double,
        random: inout some RandomNumberGenerator
    ) -> Action? {
        guard let policy, let budget else { return nil }
        // A handshake is a GET without a body: repeatable and replayable (docs/reference/behaviour.md#upgrades).
        let request = RetryRequestInfo(method: "GET", hasIdempotencyKey: false, bodyReplayable: true)
        let previous = previousDelay
        let decision = budget.withBudget { budget in
            policy.decide(
                attempt: attempt, outcome: outcome, request: request, elapsed: now - startedAt,
                previousDelay: previous, nowWall: wall, now: now, budget: &budget, random: &random)
        }
        guard case .retry(let delay, let reason) = decision else { return nil }
        previousDelay = delay
        retryReasons.append(reason)
        state = .backingOff(nextAttempt: attempt + 1, until: now + delay)
        return .retry(after: delay, reason: reason, failed: failed)
    }

    /// The local error for an attempt failure that is not retried (as for any request: docs/reference/errors.md).
    static func reason(for failure: TransportFailure) -> ProxyErrorReason {
        switch failure {
        case .timeout: .upstreamTimeout
        case .requestBodyFailed: .badRequest
        case .connectFailure, .tlsVerificationFailed, .reset, .cancelled: .upstreamUnreachable
        case .badResponse: .badUpstreamResponse
        case .loopDetected: .loopDetected
        case .destinationDenied: .destinationDenied
        case .shutDown: .shuttingDown
        }
    }
}
