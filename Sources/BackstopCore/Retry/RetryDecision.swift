/// Why no retry is made. Raw values are stable label values for logs and metrics.
public enum GiveUpReason: String, Sendable, Equatable, CaseIterable {
    /// The outcome is not listed in `retry.on` (including every success).
    case notRetryableCondition = "not-retryable"
    /// `retry.attempts` attempts have been made.
    case attemptsExhausted = "attempts-exhausted"
    /// Not in `retry.methods` and no idempotency-key header, after the request may have reached the upstream.
    case methodNotRetryable = "method-not-retryable"
    /// The request body was streamed (larger than `retry_buffer`) and cannot be sent again.
    case bodyNotReplayable = "body-not-replayable"
    /// The server's `Retry-After` / `X-RateLimit-Reset` asks for longer than `retry_after.max`.
    case retryAfterTooLong = "retry-after-too-long"
    /// Waiting would reach `timeouts.total`.
    case deadlineExceeded = "deadline-exceeded"
    /// The upstream's retry budget has no room.
    case budgetExhausted = "budget-exhausted"
    /// Every endpoint of the upstream is ejected (the failures of this request's attempts may have ejected the last):
    /// no endpoint may take the retry.
    case circuitOpen = "circuit-open"
}

/// The policy's verdict after an attempt.
public enum RetryDecision: Sendable, Equatable {
    /// Try again after `after`; `reason` is the matched `retry.on` condition.
    case retry(after: Duration, reason: RetryCondition)
    /// Stop: a response is delivered to the client as it is; a transport failure becomes 502
    /// (`upstream-unreachable`) or, for a timeout, 504 (`upstream-timeout`).
    case giveUp(GiveUpReason)
}
