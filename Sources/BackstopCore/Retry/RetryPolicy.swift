/// How one attempt ended, in the terms of `retry.on`.
public enum AttemptOutcome: Sendable, Equatable {
    case response(status: Int, retryAfter: String?, rateLimitReset: String?)
    case connectFailure
    /// The connection broke after the request may have reached the upstream.
    case reset
    case timeout
}

/// What the policy needs to know about the request.
public struct RetryRequestInfo: Sendable, Equatable {
    public var method: String
    /// Whether the request carries the `retry_non_idempotent_with_key` header.
    public var hasIdempotencyKey: Bool
    /// Whether the body was fully buffered (or empty) and can be sent again.
    public var bodyReplayable: Bool
    public init(method: String, hasIdempotencyKey: Bool, bodyReplayable: Bool) {
        self.method = method
        self.hasIdempotencyKey = hasIdempotencyKey
        self.bodyReplayable = bodyReplayable
    }
}

/// Why no retry is made.
public enum GiveUpReason: String, Sendable, Equatable, CaseIterable {
    /// The outcome is not listed in `retry.on`.
    case notRetryableCondition = "not-retryable"
    case attemptsExhausted = "attempts-exhausted"
    case methodNotRetryable = "method-not-retryable"
    case bodyNotReplayable = "body-not-replayable"
    case retryAfterTooLong = "retry-after-too-long"
    case deadlineExceeded = "deadline-exceeded"
    case budgetExhausted = "budget-exhausted"
}

/// The policy's verdict after an attempt.
public enum RetryDecision: Sendable, Equatable {
    /// Try again after `delay`; `reason` is the matched `retry.on` condition.
    case retry(after: Duration, reason: RetryCondition)
    /// Stop: deliver the response, or turn a transport failure into 502/504.
    case giveUp(GiveUpReason)
}

/// The retry rules of SPEC §3 as a pure function of the attempt's outcome, the request, elapsed time, the
/// upstream's budget, a clock and a random source.
///
/// Order of checks: condition listed in `retry.on` → attempts left → method allowed (any method after a
/// connect failure, since nothing reached the upstream; otherwise `retry.methods` or the idempotency-key
/// header) → body replayable → wait (server hint when `honor`, a hint above `retry_after.max` gives up; else
/// backoff) → the wait fits inside `timeouts.total` → budget (taken last, so refused retries cost nothing).
public struct RetryPolicy: Sendable, Equatable {
    public let config: RetryConfig
    public let timeouts: Timeouts
    public let backoff: Backoff

    public init(config: RetryConfig, timeouts: Timeouts) {
        self.config = config
        self.timeouts = timeouts
        self.backoff = Backoff(config.backoff)
    }

    /// - Parameters:
    ///   - attempt: the attempt that just ended (1-based).
    ///   - elapsed: time since the request started.
    ///   - previousDelay: the delay chosen before this attempt (decorrelated backoff).
    ///   - nowWall: wall-clock seconds since the epoch (for HTTP-date hints).
    ///   - now: monotonic clock reading for the budget.
    public func decide(
        attempt: Int, outcome: AttemptOutcome, request: RetryRequestInfo, elapsed: Duration,
        previousDelay: Duration?, nowWall: Double, now: Duration, budget: inout RetryBudget,
        random: inout some RandomNumberGenerator
    ) -> RetryDecision {
        let condition: RetryCondition
        switch outcome {
        case .response(let status, _, _): condition = .status(status)
        case .connectFailure: condition = .connectFailure
        case .reset: condition = .reset
        case .timeout: condition = .timeout
        }
        guard config.on.contains(condition) else { return .giveUp(.notRetryableCondition) }
        guard attempt < config.attempts else { return .giveUp(.attemptsExhausted) }
        if condition != .connectFailure {
            let idempotent = config.methods.contains(request.method.uppercased())
            guard idempotent || (request.hasIdempotencyKey && config.retryNonIdempotentWithKey != nil) else {
                return .giveUp(.methodNotRetryable)
            }
        }
        guard request.bodyReplayable else { return .giveUp(.bodyNotReplayable) }

        var wait = backoff.delay(retry: attempt, previous: previousDelay, random: &random)
        if config.retryAfter.honor, case .response(_, let retryAfter, let reset) = outcome,
            case .wait(let hinted) = RetryHint.parse(retryAfter: retryAfter, rateLimitReset: reset, nowWall: nowWall)
        {
            guard hinted <= config.retryAfter.max else { return .giveUp(.retryAfterTooLong) }
            wait = hinted
        }
        guard elapsed + wait < timeouts.total else { return .giveUp(.deadlineExceeded) }
        guard budget.tryAcquireRetry(now: now) else { return .giveUp(.budgetExhausted) }
        return .retry(after: wait, reason: condition)
    }
}
