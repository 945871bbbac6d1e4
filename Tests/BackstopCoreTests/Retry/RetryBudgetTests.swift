import BackstopCore
import Testing

/// Takes as many retries as the budget gives at `now`, up to `limit`.
private func drain(_ budget: inout RetryBudget, at now: Duration, limit: Int = 10_000) -> Int {
    var taken = 0
    while taken < limit, budget.tryAcquireRetry(now: now) { taken += 1 }
    return taken
}

private func record(_ budget: inout RetryBudget, _ count: Int, at now: Duration) {
    for _ in 0..<count { budget.recordRequest(now: now) }
}

@Suite("Retry budget")
struct RetryBudgetTests {
    @Test func ratioRetriesThenReservePerSecond() {
        var budget = RetryBudget(BudgetConfig(ratio: 0.2, minPerSecond: 10))
        record(&budget, 10, at: .milliseconds(100))
        // 20 % of 10 first attempts = 2, then the 10-per-second reserve.
        expectValue(drain(&budget, at: .milliseconds(500)), 12)
        #expect(budget.retriesInWindow(now: .milliseconds(500)) == 12)
        expectValue(budget.tryAcquireRetry(now: .milliseconds(999)), false)
    }

    @Test func exactlyTwoRatioRetriesForTenRequests() {
        var budget = RetryBudget(BudgetConfig(ratio: 0.2, minPerSecond: 0))
        expectValue(budget.tryAcquireRetry(now: .zero), false)
        record(&budget, 10, at: .zero)
        expectValue(budget.tryAcquireRetry(now: .zero), true)
        expectValue(budget.tryAcquireRetry(now: .milliseconds(10)), true)
        expectValue(budget.tryAcquireRetry(now: .milliseconds(20)), false)
        // Five more first attempts raise the allowance to 3: one more retry.
        record(&budget, 5, at: .milliseconds(30))
        expectValue(drain(&budget, at: .milliseconds(40)), 1)
        #expect(budget.retriesInWindow(now: .milliseconds(40)) == 3)
    }

    @Test func reserveResetsEachSecondWhileTheRatioStaysSpent() {
        var budget = RetryBudget(BudgetConfig(ratio: 0.2, minPerSecond: 10))
        record(&budget, 10, at: .zero)
        expectValue(drain(&budget, at: .zero), 12)
        expectValue(drain(&budget, at: .milliseconds(999)), 0)
        expectValue(drain(&budget, at: .seconds(1)), 10)
        expectValue(drain(&budget, at: .milliseconds(1999)), 0)
        expectValue(drain(&budget, at: .milliseconds(2500)), 10)
        #expect(budget.retriesInWindow(now: .milliseconds(2500)) == 32)
    }

    @Test func requestsOlderThanTheWindowNoLongerCount() {
        var budget = RetryBudget(BudgetConfig(ratio: 0.2, minPerSecond: 0))
        record(&budget, 10, at: .zero)
        // Still inside the 10 s window at 9.999 s …
        var probe = budget
        expectValue(drain(&probe, at: .milliseconds(9999)), 2)
        // … gone at 10 s.
        expectValue(drain(&budget, at: .seconds(10)), 0)
        expectValue(drain(&budget, at: .seconds(15)), 0)
    }

    @Test func theWindowRolls() {
        var budget = RetryBudget(BudgetConfig(ratio: 0.2, minPerSecond: 0))
        record(&budget, 5, at: .zero)
        record(&budget, 5, at: .seconds(5))
        expectValue(drain(&budget, at: .seconds(9)), 2)
        // At 10 s the first five expire: 5 requests allow 1 ratio retry, but the 2 taken at 9 s still count.
        expectValue(drain(&budget, at: .seconds(10)), 0)
        // At 15 s the second five expire as well; the retries taken at 9 s still count until 19 s.
        record(&budget, 10, at: .seconds(15))
        expectValue(drain(&budget, at: .seconds(15)), 0)
        #expect(budget.retriesInWindow(now: .seconds(18)) == 2)
        #expect(budget.retriesInWindow(now: .seconds(19)) == 0)
        expectValue(drain(&budget, at: .seconds(19)), 2)
    }

    @Test func aReusedBucketStartsEmpty() {
        var budget = RetryBudget(BudgetConfig(ratio: 0.2, minPerSecond: 0))
        record(&budget, 10, at: .milliseconds(300))
        // 10.3 s lands in the same ring slot as 0.3 s: the slot must not keep the old requests.
        record(&budget, 1, at: .milliseconds(10_300))
        expectValue(drain(&budget, at: .milliseconds(10_400)), 0)
        record(&budget, 4, at: .milliseconds(10_500))
        expectValue(drain(&budget, at: .milliseconds(10_600)), 1)
    }

    @Test func longIdleGapsForgetEverything() {
        var budget = RetryBudget(BudgetConfig(ratio: 0.5, minPerSecond: 1))
        record(&budget, 100, at: .seconds(3))
        expectValue(drain(&budget, at: .seconds(3)), 51)
        #expect(budget.retriesInWindow(now: .seconds(1_000_000)) == 0)
        expectValue(drain(&budget, at: .seconds(1_000_000)), 1)
        record(&budget, 4, at: .seconds(1_000_001))
        expectValue(drain(&budget, at: .seconds(1_000_001)), 3)
    }

    @Test func zeroRatioAndZeroReserveAllowNothing() {
        var budget = RetryBudget(BudgetConfig(ratio: 0, minPerSecond: 0))
        record(&budget, 1000, at: .zero)
        for second in 0..<20 {
            expectValue(drain(&budget, at: .seconds(second)), 0)
        }
        #expect(budget.retriesInWindow(now: .seconds(5)) == 0)
    }

    @Test func halfARetryPerSecondAllowsOnePerSecond() {
        var budget = RetryBudget(BudgetConfig(ratio: 0, minPerSecond: 0.5))
        for second in 0..<5 {
            expectValue(drain(&budget, at: .seconds(second)), 1)
            expectValue(drain(&budget, at: .seconds(second) + .milliseconds(900)), 0)
        }
    }

    @Test func fractionalReserveRoundsUp() {
        // `taken < minPerSecond`: 1.5 per second allows 2.
        var budget = RetryBudget(BudgetConfig(ratio: 0, minPerSecond: 1.5))
        expectValue(drain(&budget, at: .zero), 2)
        expectValue(drain(&budget, at: .seconds(1)), 2)
    }

    @Test func reserveOnlyWithoutRequests() {
        var budget = RetryBudget(BudgetConfig(ratio: 0.2, minPerSecond: 3))
        expectValue(drain(&budget, at: .zero), 3)
        expectValue(drain(&budget, at: .seconds(1)), 3)
    }

    @Test(arguments: [
        (0.2, 10, 2), (0.2, 5, 1), (0.2, 4, 0), (0.2, 15, 3), (0.1, 30, 3), (0.3, 10, 3), (0.7, 10, 7),
        (0.57, 100, 57), (0.29, 100, 29), (1.0, 7, 7), (2.5, 4, 10), (0.2, 1000, 200),
    ])
    func ratioAllowanceIsExactForDecimalRatios(ratio: Double, requests: Int, expected: Int) {
        var budget = RetryBudget(BudgetConfig(ratio: ratio, minPerSecond: 0))
        record(&budget, requests, at: .seconds(2))
        expectValue(drain(&budget, at: .seconds(2)), expected)
    }

    @Test func requestsAcrossTheWindowAddUp() {
        var budget = RetryBudget(BudgetConfig(ratio: 0.2, minPerSecond: 0))
        for second in 0..<10 { record(&budget, 1, at: .seconds(second) + .milliseconds(500)) }
        expectValue(drain(&budget, at: .milliseconds(9900)), 2)
    }

    @Test func configIsExposed() {
        let budget = RetryBudget(BudgetConfig(ratio: 0.25, minPerSecond: 4))
        #expect(budget.ratio == 0.25)
        #expect(budget.minPerSecond == 4)
        #expect(RetryBudget.windowSeconds == 10)
    }
}
