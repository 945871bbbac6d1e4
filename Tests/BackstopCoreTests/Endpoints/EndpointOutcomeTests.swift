import BackstopCore
import Testing

/// Which attempt outcomes count against an endpoint, and which requests may be hedged.
@Suite("Endpoint outcomes")
struct EndpointOutcomeTests {
    static let retryOn: Set<RetryCondition> = [.connectFailure, .reset, .timeout, .status(503)]

    @Test(
        "retry.on conditions fail, other heads succeed, the rest tells nothing",
        arguments: [
            (
                AttemptOutcome?.some(.response(status: 503, retryAfter: nil, rateLimitReset: nil)),
                EndpointOutcome.failure
            ),
            (.response(status: 500, retryAfter: nil, rateLimitReset: nil), .success),
            (.response(status: 200, retryAfter: "5", rateLimitReset: nil), .success),
            (.connectFailure, .failure),
            (.reset, .failure),
            (.timeout, .failure),
            (nil, .abandoned),
        ] as [(AttemptOutcome?, EndpointOutcome)])
    func classify(outcome: AttemptOutcome?, expected: EndpointOutcome) {
        #expect(EndpointOutcome(outcome, retryOn: Self.retryOn) == expected)
    }

    @Test("a failure below HTTP that retry.on leaves out is not held against the endpoint")
    func unlisted() {
        #expect(EndpointOutcome(.reset, retryOn: [.status(503)]) == .abandoned)
        #expect(EndpointOutcome(.response(status: 503, retryAfter: nil, rateLimitReset: nil), retryOn: []) == .success)
    }

    @Test("hedging applies to listed methods with an empty or kept body, and only when max > 0")
    func hedgeApplies() {
        let on = HedgeConfig(after: .p95, max: 1)
        #expect(on.applies(method: "GET", bodyReplayable: true))
        #expect(!on.applies(method: "GET", bodyReplayable: false))
        #expect(!on.applies(method: "POST", bodyReplayable: true))
        #expect(!on.applies(method: "get", bodyReplayable: true))
        #expect(!HedgeConfig().applies(method: "GET", bodyReplayable: true))
    }
}
