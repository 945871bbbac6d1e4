/// The result of one call to the token endpoint, as the retry policy sees it.
public enum TokenEndpointOutcome: Sendable, Equatable {
    /// No response: connect failure, reset, timeout.
    case transportFailure
    /// A response with this status.
    case status(Int)
}

/// What to do after one call to the token endpoint.
public enum TokenEndpointDecision: Sendable, Equatable {
    /// 2xx: parse the body.
    case accept
    /// Call again after this delay.
    case retry(after: Duration)
    /// Stop; report `TokenState.refreshFailed(final:now:)` with this flag.
    case giveUp(final: Bool)
}

/// Retries within one refresh (docs/reference/behaviour.md#oauth2): connection failures, 5xx and 429 are retried
/// with exponential backoff and full jitter (`Backoff`: `base · 2^(attempt−1)` capped at `maxDelay`, one draw),
/// up to `maxAttempts` calls in all. 400 and 401 (`invalid_grant`, bad client credentials) are final and never
/// retried. Any other status (3xx, other 4xx) gives up without being final: the endpoint may be misconfigured or
/// temporarily odd, so a later request may try again after the failure cooldown.
public struct TokenEndpointRetryPolicy: Sendable, Equatable {
    /// Calls in all, including the first.
    public var maxAttempts: Int
    public var baseDelay: Duration
    public var maxDelay: Duration

    public init(maxAttempts: Int = 3, baseDelay: Duration = .milliseconds(200), maxDelay: Duration = .seconds(5)) {
        self.maxAttempts = maxAttempts
        self.baseDelay = baseDelay
        self.maxDelay = maxDelay
    }

    private var backoff: Backoff {
        Backoff(BackoffConfig(strategy: .exponential, base: baseDelay, max: maxDelay, multiplier: 2, jitter: .full))
    }

    /// The decision after call number `attempt` (1-based) ended with `outcome`.
    public func decide(
        _ outcome: TokenEndpointOutcome, attempt: Int, using rng: inout some RandomNumberGenerator
    ) -> TokenEndpointDecision {
        switch outcome {
        case .status(let code) where (200..<300).contains(code):
            return .accept
        case .status(400), .status(401):
            return .giveUp(final: true)
        case .transportFailure, .status(429), .status(500..<600):
            guard attempt < maxAttempts else { return .giveUp(final: false) }
            return .retry(after: backoff.delay(retry: attempt, previous: nil, random: &rng))
        case .status:
            return .giveUp(final: false)
        }
    }
}
