import BackstopCore
import Testing

/// 2023-11-14T22:13:20Z.
private let wallNow = 1_700_000_000.0

/// A policy with predictable waits: constant 1 s backoff without jitter, 30 s total, a generous budget.
private func policy(
    attempts: Int = 4, on: Set<RetryCondition> = RetryConfig.defaultOn,
    methods: Set<String> = RetryConfig.defaultMethods, key: String? = "Idempotency-Key",
    backoff: BackoffConfig = BackoffConfig(strategy: .constant, base: .seconds(1), max: .seconds(10), jitter: .none),
    honor: Bool = true, retryAfterMax: Duration = .seconds(60), total: Duration = .seconds(30)
) -> RetryPolicy {
    RetryPolicy(
        config: RetryConfig(
            attempts: attempts, on: on, methods: methods, retryNonIdempotentWithKey: key, backoff: backoff,
            retryAfter: RetryAfterConfig(honor: honor, max: retryAfterMax), budget: BudgetConfig()),
        timeouts: Timeouts(connect: .seconds(2), perTry: .seconds(10), total: total))
}

private func generousBudget() -> RetryBudget { RetryBudget(BudgetConfig(ratio: 0, minPerSecond: 1000)) }

private func status(_ code: Int, retryAfter: String? = nil, reset: String? = nil) -> AttemptOutcome {
    .response(status: code, retryAfter: retryAfter, rateLimitReset: reset)
}

private func request(_ method: String = "GET", key: Bool = false, replayable: Bool = true) -> RetryRequestInfo {
    RetryRequestInfo(method: method, hasIdempotencyKey: key, bodyReplayable: replayable)
}

/// One decision with its own budget and RNG.
private func decide(
    _ policy: RetryPolicy, attempt: Int = 1, _ outcome: AttemptOutcome, _ request: RetryRequestInfo = request(),
    elapsed: Duration = .zero, previousDelay: Duration? = nil, nowWall: Double = wallNow
) -> RetryDecision {
    var budget = generousBudget()
    var rng = ScriptedRandom(ScriptedRandom.half)
    return policy.decide(
        attempt: attempt, outcome: outcome, request: request, elapsed: elapsed, previousDelay: previousDelay,
        nowWall: nowWall, now: .seconds(100), budget: &budget, random: &rng)
}

/// One decision against a shared budget.
private func decide(
    _ policy: RetryPolicy, attempt: Int = 1, _ outcome: AttemptOutcome, _ request: RetryRequestInfo = request(),
    elapsed: Duration = .zero, now: Duration = .seconds(100), budget: inout RetryBudget
) -> RetryDecision {
    var rng = ScriptedRandom(ScriptedRandom.half)
    return policy.decide(
        attempt: attempt, outcome: outcome, request: request, elapsed: elapsed, previousDelay: nil,
        nowWall: wallNow, now: now, budget: &budget, random: &rng)
}

@Suite("Retry policy")
struct RetryPolicyTests {
    // MARK: condition

    @Test(arguments: [200, 201, 301, 400, 401, 403, 404, 409, 500, 501, 505])
    func statusNotListedIsNotRetryable(code: Int) {
        #expect(decide(policy(), status(code)) == .giveUp(.notRetryableCondition))
    }

    @Test func transportConditionsNotListedAreNotRetryable() {
        let p = policy(on: [.status(503)])
        #expect(decide(p, .connectFailure) == .giveUp(.notRetryableCondition))
        #expect(decide(p, .reset) == .giveUp(.notRetryableCondition))
        #expect(decide(p, .timeout) == .giveUp(.notRetryableCondition))
        #expect(decide(p, status(502)) == .giveUp(.notRetryableCondition))
        #expect(decide(p, status(503)) == .retry(after: .seconds(1), reason: .status(503)))
    }

    @Test func anEmptyOnListRetriesNothing() {
        let p = policy(on: [])
        for outcome in [AttemptOutcome.connectFailure, .reset, .timeout, status(503)] {
            #expect(decide(p, outcome) == .giveUp(.notRetryableCondition))
        }
    }

    @Test(arguments: [
        (AttemptOutcome.connectFailure, RetryCondition.connectFailure),
        (.reset, .reset),
        (.timeout, .timeout),
        (.response(status: 429, retryAfter: nil, rateLimitReset: nil), .status(429)),
        (.response(status: 502, retryAfter: nil, rateLimitReset: nil), .status(502)),
        (.response(status: 503, retryAfter: nil, rateLimitReset: nil), .status(503)),
        (.response(status: 504, retryAfter: nil, rateLimitReset: nil), .status(504)),
    ])
    func theReasonIsTheMatchedCondition(outcome: AttemptOutcome, condition: RetryCondition) {
        #expect(decide(policy(), outcome) == .retry(after: .seconds(1), reason: condition))
    }

    @Test func theConditionCheckComesFirst() {
        // Attempts exhausted, POST, unreplayable body: still "not retryable" for a 500.
        let p = policy(attempts: 1)
        #expect(
            decide(p, attempt: 5, status(500), request("POST", replayable: false))
                == .giveUp(.notRetryableCondition))
    }

    // MARK: attempts

    @Test func attemptsCountTheFirstAttempt() {
        let p = policy(attempts: 3)
        #expect(decide(p, attempt: 1, status(503)) == .retry(after: .seconds(1), reason: .status(503)))
        #expect(decide(p, attempt: 2, status(503)) == .retry(after: .seconds(1), reason: .status(503)))
        #expect(decide(p, attempt: 3, status(503)) == .giveUp(.attemptsExhausted))
        #expect(decide(p, attempt: 4, status(503)) == .giveUp(.attemptsExhausted))
    }

    @Test func oneAttemptDisablesRetries() {
        let p = policy(attempts: 1)
        for outcome in [AttemptOutcome.connectFailure, .reset, .timeout, status(503)] {
            #expect(decide(p, attempt: 1, outcome) == .giveUp(.attemptsExhausted))
        }
    }

    // MARK: methods

    @Test(arguments: ["GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"])
    func idempotentMethodsAreRetriedOnEveryCondition(method: String) {
        for outcome in [AttemptOutcome.connectFailure, .reset, .timeout, status(503)] {
            #expect(decide(policy(), outcome, request(method)) != .giveUp(.methodNotRetryable), "\(method)")
            if case .retry = decide(policy(), outcome, request(method)) {
            } else {
                Issue.record("\(method) \(outcome) not retried")
            }
        }
    }

    @Test(arguments: ["POST", "PATCH", "CONNECT", "PROPFIND"])
    func nonIdempotentMethodsWithoutKeyAreNotRetried(method: String) {
        for outcome in [AttemptOutcome.reset, .timeout, status(502), status(503), status(429)] {
            #expect(decide(policy(), outcome, request(method)) == .giveUp(.methodNotRetryable), "\(method) \(outcome)")
        }
    }

    @Test(arguments: ["POST", "PATCH"])
    func nonIdempotentMethodsWithTheKeyHeaderAreRetried(method: String) {
        for outcome in [AttemptOutcome.reset, .timeout, status(503)] {
            if case .retry = decide(policy(), outcome, request(method, key: true)) {
            } else {
                Issue.record("\(method) with key, \(outcome) not retried")
            }
        }
    }

    @Test(arguments: ["POST", "PATCH"])
    func theKeyHeaderCountsOnlyWhenConfigured(method: String) {
        let p = policy(key: nil)
        #expect(decide(p, .reset, request(method, key: true)) == .giveUp(.methodNotRetryable))
        #expect(decide(p, status(503), request(method, key: true)) == .giveUp(.methodNotRetryable))
    }

    @Test(arguments: ["POST", "PATCH"])
    func aConnectFailureIsRetriedForEveryMethod(method: String) {
        #expect(
            decide(policy(), .connectFailure, request(method))
                == .retry(after: .seconds(1), reason: .connectFailure))
        #expect(
            decide(policy(key: nil), .connectFailure, request(method))
                == .retry(after: .seconds(1), reason: .connectFailure))
        #expect(
            decide(policy(methods: []), .connectFailure, request(method))
                == .retry(after: .seconds(1), reason: .connectFailure))
    }

    @Test func theMethodsListIsConfigurable() {
        let p = policy(methods: ["GET"])
        #expect(decide(p, status(503), request("GET")) == .retry(after: .seconds(1), reason: .status(503)))
        #expect(decide(p, status(503), request("DELETE")) == .giveUp(.methodNotRetryable))
        #expect(decide(p, .reset, request("PUT")) == .giveUp(.methodNotRetryable))
        let withPost = policy(methods: ["GET", "POST"])
        #expect(decide(withPost, .timeout, request("POST")) == .retry(after: .seconds(1), reason: .timeout))
    }

    @Test func theMethodCheckComesBeforeTheBodyCheck() {
        #expect(decide(policy(), .reset, request("POST", replayable: false)) == .giveUp(.methodNotRetryable))
    }

    // MARK: body

    @Test func anUnreplayableBodyIsNeverRetried() {
        for outcome in [AttemptOutcome.connectFailure, .reset, .timeout, status(503)] {
            #expect(decide(policy(), outcome, request("PUT", replayable: false)) == .giveUp(.bodyNotReplayable))
            #expect(
                decide(policy(), outcome, request("POST", key: true, replayable: false))
                    == .giveUp(.bodyNotReplayable))
        }
        #expect(decide(policy(), .connectFailure, request("POST", replayable: false)) == .giveUp(.bodyNotReplayable))
    }

    // MARK: waits

    @Test func theBackoffUsesTheAttemptNumberAsTheRetryNumber() {
        let p = policy(
            attempts: 10,
            backoff: BackoffConfig(
                strategy: .exponential, base: .seconds(1), max: .seconds(10), multiplier: 2,
                jitter: .none),
            total: .seconds(100))
        let waits = (1...6).map { decide(p, attempt: $0, status(503)) }
        #expect(waits == [1, 2, 4, 8, 10, 10].map { RetryDecision.retry(after: .seconds($0), reason: .status(503)) })
    }

    @Test func theJitterUsesTheInjectedRandomSource() {
        let p = policy(backoff: BackoffConfig(strategy: .constant, base: .seconds(4), max: .seconds(10), jitter: .full))
        // The helper's RNG always draws 0.5.
        #expect(decide(p, status(503)) == .retry(after: .seconds(2), reason: .status(503)))
    }

    @Test func decorrelatedBackoffGetsThePreviousDelay() {
        let p = policy(backoff: BackoffConfig(strategy: .decorrelated, base: .seconds(1), max: .seconds(20)))
        #expect(decide(p, status(503)) == .retry(after: .seconds(2), reason: .status(503)))
        // previous 4 s → uniform [1, 12], half → 6.5 s.
        #expect(
            decide(p, attempt: 2, status(503), previousDelay: .seconds(4))
                == .retry(after: .milliseconds(6500), reason: .status(503)))
    }

    @Test func retryAfterReplacesTheBackoff() {
        let p = policy()
        #expect(decide(p, status(503, retryAfter: "5")) == .retry(after: .seconds(5), reason: .status(503)))
        #expect(decide(p, status(429, retryAfter: "0")) == .retry(after: .zero, reason: .status(429)))
        #expect(decide(p, status(429, reset: "7")) == .retry(after: .seconds(7), reason: .status(429)))
        #expect(decide(p, status(429, reset: "1700000012")) == .retry(after: .seconds(12), reason: .status(429)))
        #expect(decide(p, status(503, retryAfter: "3", reset: "7")) == .retry(after: .seconds(3), reason: .status(503)))
    }

    @Test func anHTTPDateHintUsesTheWallClock() {
        let p = policy()
        let date = "Sun, 06 Nov 1994 08:49:37 GMT"
        #expect(
            decide(p, status(503, retryAfter: date), nowWall: 784_111_777 - 20)
                == .retry(after: .seconds(20), reason: .status(503)))
        #expect(
            decide(p, status(503, retryAfter: date), nowWall: wallNow)
                == .retry(after: .zero, reason: .status(503)))
    }

    @Test(arguments: ["abc", "-1", "+1", "1.5", "5.5", "", "  ", "\u{B2}", "Sun, 06 Nov 1994 25:00:00 GMT"])
    func anUnusableRetryAfterFallsBackToTheRateLimitResetOrTheBackoff(value: String) {
        let p = policy()
        #expect(decide(p, status(503, retryAfter: value)) == .retry(after: .seconds(1), reason: .status(503)))
        #expect(
            decide(p, status(503, retryAfter: value, reset: "4"))
                == .retry(after: .seconds(4), reason: .status(503)))
    }

    @Test(arguments: ["abc", "-1", "", "1e3", ".5", "-1700000030"])
    func anUnusableRateLimitResetFallsBackToTheBackoff(value: String) {
        #expect(decide(policy(), status(429, reset: value)) == .retry(after: .seconds(1), reason: .status(429)))
    }

    @Test func aHintAboveTheMaximumGivesUp() {
        let p = policy(retryAfterMax: .seconds(60), total: .seconds(120))
        #expect(decide(p, status(503, retryAfter: "60")) == .retry(after: .seconds(60), reason: .status(503)))
        #expect(decide(p, status(503, retryAfter: "61")) == .giveUp(.retryAfterTooLong))
        #expect(decide(p, status(429, reset: "60.5")) == .giveUp(.retryAfterTooLong))
        #expect(decide(p, status(429, reset: "1700003600")) == .giveUp(.retryAfterTooLong))
        #expect(
            decide(p, status(503, retryAfter: "Sun, 06 Nov 1994 08:49:37 GMT"), nowWall: 784_111_777 - 3600)
                == .giveUp(.retryAfterTooLong))
    }

    @Test(arguments: [
        status(503, retryAfter: "9999999999"),
        status(503, retryAfter: "99999999999999999999999"),
        status(503, retryAfter: "Mon, 1 Jan 2100 00:00:00 GMT"),
        status(503, retryAfter: "Fri, 31 Dec 9999 23:59:59 GMT"),
        status(429, reset: "9999999999"),
        status(429, reset: "999999999"),
        status(429, reset: "99999999999999999999999.5"),
        status(503, retryAfter: "junk", reset: "9999999999"),
    ])
    func absurdHintsCountAsNoHintAndTheBackoffApplies(outcome: AttemptOutcome) {
        // docs/reference/behaviour.md: `9999999999` and friends count as "no hint": the constant 1 s backoff, never an overflow.
        #expect(decide(policy(), outcome) == .retry(after: .seconds(1), reason: outcome.condition))
        #expect(
            decide(policy(retryAfterMax: .seconds(86400 * 365), total: .seconds(86400 * 365)), outcome)
                == .retry(after: .seconds(1), reason: outcome.condition))
    }

    @Test(arguments: [
        status(503, retryAfter: "Fri, 31 Dec 1999 23:59:59 GMT"),
        status(503, retryAfter: "Sunday, 06-Nov-94 08:49:37 GMT"),
        status(503, retryAfter: "Sun Nov  6 08:49:37 1994"),
        status(429, reset: "1000000000"),
        status(429, reset: "1699999999.5"),
    ])
    func pastHintsMeanRetryNow(outcome: AttemptOutcome) {
        #expect(decide(policy(), outcome) == .retry(after: .zero, reason: outcome.condition))
    }

    @Test func honorFalseIgnoresHints() {
        let p = policy(honor: false, retryAfterMax: .seconds(60))
        #expect(decide(p, status(503, retryAfter: "5")) == .retry(after: .seconds(1), reason: .status(503)))
        #expect(decide(p, status(503, retryAfter: "3600")) == .retry(after: .seconds(1), reason: .status(503)))
        #expect(decide(p, status(429, reset: "1700003600")) == .retry(after: .seconds(1), reason: .status(429)))
        #expect(decide(p, status(429, retryAfter: "0")) == .retry(after: .seconds(1), reason: .status(429)))
    }

    // MARK: deadline

    @Test func theWaitMustEndBeforeTheTotalTimeout() {
        let p = policy(total: .seconds(30))
        #expect(decide(p, status(503), elapsed: .seconds(28)) == .retry(after: .seconds(1), reason: .status(503)))
        #expect(
            decide(p, status(503), elapsed: .milliseconds(28_999))
                == .retry(after: .seconds(1), reason: .status(503)))
        #expect(decide(p, status(503), elapsed: .seconds(29)) == .giveUp(.deadlineExceeded))
        #expect(decide(p, .connectFailure, elapsed: .seconds(45)) == .giveUp(.deadlineExceeded))
        #expect(decide(p, status(503, retryAfter: "30")) == .giveUp(.deadlineExceeded))
        #expect(
            decide(p, status(503, retryAfter: "29"), elapsed: .milliseconds(999))
                == .retry(after: .seconds(29), reason: .status(503)))
        #expect(decide(p, status(503, retryAfter: "29"), elapsed: .seconds(1)) == .giveUp(.deadlineExceeded))
    }

    @Test func tooLongComesBeforeTheDeadline() {
        let p = policy(retryAfterMax: .seconds(10), total: .seconds(30))
        #expect(decide(p, status(503, retryAfter: "40")) == .giveUp(.retryAfterTooLong))
    }

    // MARK: budget

    @Test func anExhaustedBudgetGivesUp() {
        // 0.1 per second → one retry per 10 s window.
        var budget = RetryBudget(BudgetConfig(ratio: 0, minPerSecond: 0.1))
        let p = policy()
        #expect(
            decide(p, status(503), now: .seconds(50), budget: &budget)
                == .retry(after: .seconds(1), reason: .status(503)))
        #expect(decide(p, status(503), now: .seconds(50), budget: &budget) == .giveUp(.budgetExhausted))
        #expect(decide(p, .connectFailure, now: .milliseconds(59_999), budget: &budget) == .giveUp(.budgetExhausted))
        // Ten seconds on, the retry taken at 50 s has left the window.
        #expect(
            decide(p, .connectFailure, now: .seconds(60), budget: &budget)
                == .retry(after: .seconds(1), reason: .connectFailure))
    }

    @Test func aBudgetWithNoRoomRefusesEveryOtherwiseValidRetry() {
        var budget = RetryBudget(BudgetConfig(ratio: 0, minPerSecond: 0))
        for outcome in [AttemptOutcome.connectFailure, .reset, .timeout, status(503, retryAfter: "2")] {
            #expect(decide(policy(), outcome, budget: &budget) == .giveUp(.budgetExhausted))
        }
    }

    @Test func earlierGiveUpsDoNotSpendTheBudget() {
        var budget = RetryBudget(BudgetConfig(ratio: 0, minPerSecond: 0.1))
        let p = policy(attempts: 3, retryAfterMax: .seconds(10), total: .seconds(30))
        let now = Duration.seconds(7)
        #expect(decide(p, status(500), now: now, budget: &budget) == .giveUp(.notRetryableCondition))
        #expect(decide(p, attempt: 3, status(503), now: now, budget: &budget) == .giveUp(.attemptsExhausted))
        #expect(decide(p, .reset, request("POST"), now: now, budget: &budget) == .giveUp(.methodNotRetryable))
        #expect(
            decide(p, .reset, request("PUT", replayable: false), now: now, budget: &budget)
                == .giveUp(.bodyNotReplayable))
        #expect(decide(p, status(429, retryAfter: "11"), now: now, budget: &budget) == .giveUp(.retryAfterTooLong))
        #expect(decide(p, status(503), elapsed: .seconds(29), now: now, budget: &budget) == .giveUp(.deadlineExceeded))
        #expect(budget.retriesInWindow(now: now) == 0)
        // The one reserve retry of this window is still there.
        #expect(decide(p, status(503), now: now, budget: &budget) == .retry(after: .seconds(1), reason: .status(503)))
        #expect(budget.retriesInWindow(now: now) == 1)
        #expect(decide(p, status(503), now: now, budget: &budget) == .giveUp(.budgetExhausted))
    }

    @Test func theRatioBudgetFollowsRecordedRequests() {
        var budget = RetryBudget(BudgetConfig(ratio: 0.2, minPerSecond: 0))
        let p = policy()
        for _ in 0..<10 { budget.recordRequest(now: .seconds(3)) }
        #expect(
            decide(p, status(503), now: .seconds(3), budget: &budget)
                == .retry(after: .seconds(1), reason: .status(503)))
        #expect(decide(p, .timeout, now: .seconds(4), budget: &budget) == .retry(after: .seconds(1), reason: .timeout))
        #expect(decide(p, .timeout, now: .seconds(5), budget: &budget) == .giveUp(.budgetExhausted))
    }

    // MARK: method rules table

    /// (method, carries the key header, key configured, outcome) → retried?
    @Test(arguments: [
        ("GET", false, true, AttemptOutcome.reset, true),
        ("GET", false, true, .timeout, true),
        ("GET", false, true, .response(status: 503, retryAfter: nil, rateLimitReset: nil), true),
        ("DELETE", false, true, .timeout, true),
        ("PUT", false, false, .reset, true),
        ("POST", false, true, .connectFailure, true),
        ("POST", false, true, .reset, false),
        ("POST", false, true, .timeout, false),
        ("POST", false, true, .response(status: 503, retryAfter: nil, rateLimitReset: nil), false),
        ("POST", true, true, .reset, true),
        ("POST", true, true, .timeout, true),
        ("POST", true, true, .response(status: 429, retryAfter: "1", rateLimitReset: nil), true),
        ("POST", true, false, .timeout, false),
        ("POST", true, false, .connectFailure, true),
        ("PATCH", false, true, .connectFailure, true),
        ("PATCH", false, true, .timeout, false),
        ("PATCH", true, true, .timeout, true),
        ("CONNECT", false, true, .reset, false),
        ("get", false, true, .reset, false),  // methods are case-sensitive: "get" is not GET
        ("get", false, true, .connectFailure, true),
        ("Post", true, true, .reset, true),
    ])
    func methodRules(method: String, key: Bool, keyConfigured: Bool, outcome: AttemptOutcome, retried: Bool) {
        let p = policy(key: keyConfigured ? "Idempotency-Key" : nil)
        let decision = decide(p, outcome, request(method, key: key))
        if retried {
            // 1 s either way: the constant backoff, or the 429's Retry-After: 1.
            #expect(decision == .retry(after: .seconds(1), reason: outcome.condition), "\(method) \(outcome)")
        } else {
            #expect(decision == .giveUp(.methodNotRetryable), "\(method) \(outcome)")
        }
    }

    @Test func theKeyHeaderIsFoundCaseInsensitively() {
        for name in ["Idempotency-Key", "idempotency-key", "IDEMPOTENCY-KEY", "iDeMpOtEnCy-KeY"] {
            let info = RetryRequestInfo(
                method: "POST", headerNames: ["Content-Type", name], idempotencyKeyHeader: "Idempotency-Key",
                bodyReplayable: true)
            #expect(info.hasIdempotencyKey, "\(name)")
            #expect(decide(policy(), .reset, info) == .retry(after: .seconds(1), reason: .reset))
        }
        let other = RetryRequestInfo(
            method: "POST", headerNames: ["Idempotency-Keys", "X-Idempotency-Key"],
            idempotencyKeyHeader: "idempotency-key", bodyReplayable: true)
        #expect(!other.hasIdempotencyKey)
        let off = RetryRequestInfo(
            method: "POST", headerNames: ["Idempotency-Key"], idempotencyKeyHeader: nil, bodyReplayable: false)
        #expect(off == RetryRequestInfo(method: "POST", hasIdempotencyKey: false, bodyReplayable: false))
    }

    @Test func outcomesKnowTheirConditionAndWhetherTheyReachedTheUpstream() {
        #expect(AttemptOutcome.connectFailure.condition == .connectFailure)
        #expect(AttemptOutcome.reset.condition == .reset)
        #expect(AttemptOutcome.timeout.condition == .timeout)
        #expect(status(418, retryAfter: "1").condition == .status(418))
        #expect(!AttemptOutcome.connectFailure.mayHaveReachedUpstream)
        #expect(AttemptOutcome.reset.mayHaveReachedUpstream)
        #expect(AttemptOutcome.timeout.mayHaveReachedUpstream)
        #expect(status(503).mayHaveReachedUpstream)
    }

    // MARK: random source

    @Test func aHintDrawsNothingFromTheRandomSource() {
        let p = policy(
            backoff: BackoffConfig(strategy: .exponential, base: .seconds(1), max: .seconds(10), jitter: .full))
        var budget = generousBudget()
        var rng = ScriptedRandom(ScriptedRandom.half)
        let hinted = p.decide(
            attempt: 1, outcome: status(503, retryAfter: "3"), request: request(), elapsed: .zero, previousDelay: nil,
            nowWall: wallNow, now: .zero, budget: &budget, random: &rng)
        #expect(hinted == .retry(after: .seconds(3), reason: .status(503)))
        #expect(rng.draws == 0)
        let backedOff = p.decide(
            attempt: 2, outcome: status(503), request: request(), elapsed: .zero, previousDelay: nil,
            nowWall: wallNow, now: .zero, budget: &budget, random: &rng)
        #expect(backedOff == .retry(after: .seconds(1), reason: .status(503)))  // 2 s × 0.5
        #expect(rng.draws == 1)
        // Refusals before the wait draw nothing either.
        _ = p.decide(
            attempt: 1, outcome: .reset, request: request("POST"), elapsed: .zero, previousDelay: nil,
            nowWall: wallNow, now: .zero, budget: &budget, random: &rng)
        #expect(rng.draws == 1)
    }

    @Test func aSeededGeneratorGivesAReproducibleJitteredSchedule() {
        let p = policy(
            attempts: 6,
            backoff: BackoffConfig(strategy: .exponential, base: .milliseconds(100), max: .seconds(10), jitter: .full),
            total: .seconds(60))
        func schedule(seed: UInt64) -> [RetryDecision] {
            var budget = generousBudget()
            var rng = SplitMix64(seed: seed)
            return (1...6).map { attempt in
                p.decide(
                    attempt: attempt, outcome: .timeout, request: request(), elapsed: .zero, previousDelay: nil,
                    nowWall: wallNow, now: .zero, budget: &budget, random: &rng)
            }
        }
        let first = schedule(seed: 1)
        #expect(first == schedule(seed: 1))
        #expect(first != schedule(seed: 2))
        #expect(first.last == .giveUp(.attemptsExhausted))
        for (i, decision) in first.dropLast().enumerated() {
            guard case .retry(let wait, .timeout) = decision else {
                Issue.record("attempt \(i + 1): \(decision)")
                continue
            }
            #expect(wait >= .zero && wait <= .milliseconds(100 << i), "attempt \(i + 1): \(wait)")
        }
    }

    // MARK: a whole exchange

    @Test func aRequestThatKeepsFailingWalksThroughItsAttempts() {
        // attempts 4, exponential 1 s·2^(n−1), no jitter, total 30 s: waits 1, 2, 4 then attempts are exhausted.
        let p = policy(
            attempts: 4,
            backoff: BackoffConfig(strategy: .exponential, base: .seconds(1), max: .seconds(10), jitter: .none))
        var budget = RetryBudget(BudgetConfig(ratio: 0, minPerSecond: 10))
        var rng = ScriptedRandom()
        var elapsed = Duration.zero
        var previous: Duration?
        var waits: [Duration] = []
        var attempt = 1
        var lastRetryAt = Duration.zero
        while true {
            elapsed += .seconds(2)  // each attempt times out after 2 s
            let d = p.decide(
                attempt: attempt, outcome: .timeout, request: request(), elapsed: elapsed, previousDelay: previous,
                nowWall: wallNow, now: elapsed, budget: &budget, random: &rng)
            guard case .retry(let wait, _) = d else {
                #expect(d == .giveUp(.attemptsExhausted))
                break
            }
            waits.append(wait)
            lastRetryAt = elapsed
            previous = wait
            elapsed += wait
            attempt += 1
        }
        #expect(waits == [.seconds(1), .seconds(2), .seconds(4)])
        #expect(attempt == 4)
        // Retries were taken at 2, 5 and 9 s: all three are in the window ending at the last one.
        #expect(lastRetryAt == .seconds(9))
        #expect(budget.retriesInWindow(now: lastRetryAt) == 3)
    }

    @Test func theTotalTimeoutCutsTheScheduleShort() {
        // Same schedule, total 12 s: after attempt 3 (elapsed 2+1+2+2+2 = 9 s) a 4 s wait would pass 12 s.
        let p = policy(
            attempts: 10,
            backoff: BackoffConfig(strategy: .exponential, base: .seconds(1), max: .seconds(10), jitter: .none),
            total: .seconds(12))
        #expect(decide(p, attempt: 1, .timeout, elapsed: .seconds(2)) == .retry(after: .seconds(1), reason: .timeout))
        #expect(decide(p, attempt: 2, .timeout, elapsed: .seconds(5)) == .retry(after: .seconds(2), reason: .timeout))
        #expect(decide(p, attempt: 3, .timeout, elapsed: .seconds(9)) == .giveUp(.deadlineExceeded))
        #expect(
            decide(p, attempt: 3, .timeout, elapsed: .milliseconds(7_999))
                == .retry(after: .seconds(4), reason: .timeout))
        #expect(decide(p, attempt: 3, .timeout, elapsed: .seconds(8)) == .giveUp(.deadlineExceeded))
    }

    // MARK: misc

    @Test func giveUpReasonsHaveStableNames() {
        #expect(
            GiveUpReason.allCases.map(\.rawValue) == [
                "not-retryable", "attempts-exhausted", "method-not-retryable", "body-not-replayable",
                "retry-after-too-long", "deadline-exceeded", "budget-exhausted", "circuit-open",
            ])
    }

    @Test func thePolicyBuildsItsBackoffFromTheConfig() {
        let p = policy()
        #expect(p.backoff == Backoff(p.config.backoff))
        #expect(p.timeouts.total == .seconds(30))
    }
}
