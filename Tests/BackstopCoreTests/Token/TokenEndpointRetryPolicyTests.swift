import BackstopCore
import Testing

@Suite("TokenEndpointRetryPolicy")
struct TokenEndpointRetryPolicyTests {
    static let policy = TokenEndpointRetryPolicy()

    static func decide(
        _ outcome: TokenEndpointOutcome, attempt: Int, word: UInt64 = ScriptedRandom.half,
        policy: TokenEndpointRetryPolicy = policy
    ) -> TokenEndpointDecision {
        var rng = ScriptedRandom(word)
        return policy.decide(outcome, attempt: attempt, using: &rng)
    }

    @Test func defaults() {
        #expect(Self.policy.maxAttempts == 3)
        #expect(Self.policy.baseDelay == .milliseconds(200))
        #expect(Self.policy.maxDelay == .seconds(5))
    }

    @Test(arguments: [
        // (outcome, attempt, decision) with a draw of exactly 0.5
        (TokenEndpointOutcome.status(200), 1, TokenEndpointDecision.accept),
        (.status(201), 3, .accept),
        (.status(299), 1, .accept),
        (.status(400), 1, .giveUp(final: true)),
        (.status(401), 1, .giveUp(final: true)),
        (.status(401), 3, .giveUp(final: true)),
        (.status(403), 1, .giveUp(final: false)),
        (.status(404), 1, .giveUp(final: false)),
        (.status(408), 1, .giveUp(final: false)),
        (.status(302), 1, .giveUp(final: false)),
        (.status(100), 1, .giveUp(final: false)),
        (.status(600), 1, .giveUp(final: false)),
        (.transportFailure, 1, .retry(after: .milliseconds(100))),
        (.transportFailure, 2, .retry(after: .milliseconds(200))),
        (.transportFailure, 3, .giveUp(final: false)),
        (.status(429), 1, .retry(after: .milliseconds(100))),
        (.status(429), 3, .giveUp(final: false)),
        (.status(500), 1, .retry(after: .milliseconds(100))),
        (.status(502), 2, .retry(after: .milliseconds(200))),
        (.status(503), 3, .giveUp(final: false)),
        (.status(599), 1, .retry(after: .milliseconds(100))),
    ])
    func decisionTable(outcome: TokenEndpointOutcome, attempt: Int, expected: TokenEndpointDecision) {
        #expect(Self.decide(outcome, attempt: attempt) == expected)
    }

    @Test func finalStatusesAreNeverRetriedEvenWithAttemptsLeft() {
        let generous = TokenEndpointRetryPolicy(maxAttempts: 100)
        for status in [400, 401] {
            #expect(Self.decide(.status(status), attempt: 1, policy: generous) == .giveUp(final: true))
        }
    }

    @Test func exponentialWindowIsCappedAt5s() {
        let long = TokenEndpointRetryPolicy(maxAttempts: .max)
        let halves = (1...8).map { Self.decide(.transportFailure, attempt: $0, policy: long) }
        let expected: [Duration] = [
            .milliseconds(100), .milliseconds(200), .milliseconds(400), .milliseconds(800), .milliseconds(1600),
            .milliseconds(2500), .milliseconds(2500), .milliseconds(2500),
        ]
        #expect(halves == expected.map { .retry(after: $0) })
        // No overflow for absurd attempt numbers.
        #expect(Self.decide(.transportFailure, attempt: 1_000_000, policy: long) == .retry(after: .milliseconds(2500)))
        #expect(Self.decide(.transportFailure, attempt: .max - 1, policy: long) == .retry(after: .milliseconds(2500)))
        #expect(Self.decide(.transportFailure, attempt: 0, policy: long) == .retry(after: .milliseconds(100)))
    }

    @Test func fullJitterSpansZeroToWindow() {
        #expect(Self.decide(.status(503), attempt: 1, word: 0) == .retry(after: .zero))
        #expect(Self.decide(.status(503), attempt: 2, word: 1 << 62) == .retry(after: .milliseconds(100)))
        var sweep = SplitMix64(seed: 7)
        for attempt in 1...2 {
            let window: Duration = attempt == 1 ? .milliseconds(200) : .milliseconds(400)
            for _ in 0..<500 {
                guard case .retry(let delay) = Self.decide(.transportFailure, attempt: attempt, word: sweep.next())
                else {
                    Issue.record("expected a retry")
                    continue
                }
                #expect(delay >= .zero && delay < window)
            }
        }
    }

    @Test func oneDrawPerRetryDecisionAndNoneOtherwise() {
        var rng = ScriptedRandom(0)
        _ = Self.policy.decide(.transportFailure, attempt: 1, using: &rng)
        #expect(rng.draws == 1)
        _ = Self.policy.decide(.status(401), attempt: 1, using: &rng)
        _ = Self.policy.decide(.status(200), attempt: 1, using: &rng)
        _ = Self.policy.decide(.transportFailure, attempt: 3, using: &rng)
        #expect(rng.draws == 1)
    }
}
