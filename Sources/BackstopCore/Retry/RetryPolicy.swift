/// The retry rules of docs/reference/behaviour.md as a pure function of the attempt's outcome, the request, elapsed time, the
/// upstream's budget, two clocks and a random source (all injected: no I/O, no global state).
///
/// Order of checks, each ending in `giveUp` with its reason:
/// 1. the outcome's condition is listed in `retry.on` (`notRetryableCondition`);
/// 2. attempts remain: `attempt < retry.attempts` (`attemptsExhausted`);
/// 3. the method may be repeated: after a connect failure any method (nothing reached the upstream); otherwise
///    a method in `retry.methods` (exact, case-sensitive match) or one carrying the
///    `retry_non_idempotent_with_key` header when that is configured (`methodNotRetryable`);
/// 4. the body was fully buffered or empty (`bodyNotReplayable`);
/// 5. the wait: with `retry_after.honor`, a server hint (`RetryHint`) replaces the backoff, and a hint above
///    `retry_after.max` ends the retries (`retryAfterTooLong`); otherwise the backoff delay (the only step that
///    draws from `random`);
/// 6. `elapsed + wait < timeouts.total`: a retry that would start with no time left is not made
///    (`deadlineExceeded`);
/// 7. the budget, taken last so that retries refused for any other reason cost nothing (`budgetExhausted`).
///
/// A class (immutable, so `Sendable`): every request's exchange holds its upstream's policy, and a reference is one
/// retain where a copy of the struct retained each of its sets and strings.
public final class RetryPolicy: Sendable, Equatable {
    public let config: RetryConfig
    public let timeouts: Timeouts
    public let backoff: Backoff
    /// `config.methods` as a list, the commonest methods first: a request's method is compared with a few short
    /// strings instead of being hashed, in the same order in every process (a `Set`'s order changes with its seed,
    /// and with it the cost of a GET: 36 to 158 instructions).
    private let repeatableMethods: [String]

    public static func == (lhs: RetryPolicy, rhs: RetryPolicy) -> Bool {
        lhs.config == rhs.config && lhs.timeouts == rhs.timeouts && lhs.backoff == rhs.backoff
    }

    public init(config: RetryConfig, timeouts: Timeouts) {
        self.config = config
        self.timeouts = timeouts
        self.backoff = Backoff(config.backoff)
        let common = ["GET", "HEAD", "PUT", "DELETE", "OPTIONS"]
        self.repeatableMethods =
            common.filter(config.methods.contains) + config.methods.subtracting(common).sorted()
    }

    /// Whether the request may reach the upstream twice: its method is in `retry.methods`, or it carries the
    /// `retry_non_idempotent_with_key` header. The transport uses it too, to keep libcurl from silently resending
    /// a request it sent on a connection that then died.
    public func mayRepeat(_ request: RetryRequestInfo) -> Bool {
        repeatableMethods.contains(request.method)
            || (request.hasIdempotencyKey && config.retryNonIdempotentWithKey != nil)
    }

    /// Whether and when to try again after `outcome`.
    /// - Parameters:
    ///   - attempt: the attempt that just ended (1-based); it is also the number of the retry being considered.
    ///   - elapsed: time since the request started (monotonic).
    ///   - previousDelay: the wait chosen before this attempt, nil before the first retry (decorrelated backoff).
    ///   - nowWall: wall-clock seconds since the Unix epoch, for HTTP-date and epoch hints.
    ///   - now: monotonic clock reading for the budget buckets.
    public func decide(
        attempt: Int, outcome: AttemptOutcome, request: RetryRequestInfo, elapsed: Duration,
        previousDelay: Duration?, nowWall: Double, now: Duration, budget: inout RetryBudget,
        random: inout some RandomNumberGenerator
    ) -> RetryDecision {
        let decision = decideBeforeBudget(
            attempt: attempt, outcome: outcome, request: request, elapsed: elapsed, previousDelay: previousDelay,
            nowWall: nowWall, random: &random)
        guard case .retry = decision else { return decision }
        guard budget.tryAcquireRetry(now: now) else { return .giveUp(.budgetExhausted) }
        return decision
    }

    /// Steps 1–6 of `decide`: the retry the policy would make, before the budget (step 7) is asked. A caller that
    /// holds no budget itself (the request's state machine, which is pure) asks the budget with the answer's
    /// `.retry` and treats a refusal as `.giveUp(.budgetExhausted)`.
    public func decideBeforeBudget(
        attempt: Int, outcome: AttemptOutcome, request: RetryRequestInfo, elapsed: Duration,
        previousDelay: Duration?, nowWall: Double, random: inout some RandomNumberGenerator
    ) -> RetryDecision {
        let condition = outcome.condition
        guard config.on.contains(condition) else { return .giveUp(.notRetryableCondition) }
        guard attempt < config.attempts else { return .giveUp(.attemptsExhausted) }
        if outcome.mayHaveReachedUpstream {
            guard mayRepeat(request) else { return .giveUp(.methodNotRetryable) }
        }
        guard request.bodyReplayable else { return .giveUp(.bodyNotReplayable) }

        let wait: Duration
        if case .wait(let hinted) = hint(outcome, nowWall: nowWall) {
            guard hinted <= config.retryAfter.max else { return .giveUp(.retryAfterTooLong) }
            wait = hinted
        } else {
            wait = backoff.delay(retry: attempt, previous: previousDelay, random: &random)
        }
        guard elapsed + wait < timeouts.total else { return .giveUp(.deadlineExceeded) }
        return .retry(after: wait, reason: condition)
    }

    private func hint(_ outcome: AttemptOutcome, nowWall: Double) -> RetryHint {
        guard config.retryAfter.honor, case .response(_, let retryAfter, let reset) = outcome else { return .none }
        return RetryHint.parse(retryAfter: retryAfter, rateLimitReset: reset, nowWall: nowWall)
    }
}
