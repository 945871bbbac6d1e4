import BackstopCore
import Testing

/// One retry at `now` (a function, since `#expect` cannot call a mutating method).
private func take(_ budget: inout RetryBudget, at now: Duration) -> Bool { budget.tryAcquireRetry(now: now) }

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
    @Test func ratioPlusThisSecondsReserve() {
        // 0.2 × 10 ratio retries + 10 reserve retries in second 0.
        var budget = RetryBudget(BudgetConfig(ratio: 0.2, minPerSecond: 10))
        record(&budget, 10, at: .milliseconds(100))
        #expect(drain(&budget, at: .milliseconds(500)) == 12)
        #expect(budget.retriesInWindow(now: .milliseconds(500)) == 12)
        #expect(budget.requestsInWindow(now: .milliseconds(500)) == 10)
        #expect(!take(&budget, at: .milliseconds(999)))
        // Each new second brings another 10 reserve retries, never more.
        #expect(drain(&budget, at: .seconds(1)) == 10)
        #expect(drain(&budget, at: .milliseconds(9999)) == 10)
    }

    @Test func exactlyTwoRatioRetriesForTenRequests() {
        var budget = RetryBudget(BudgetConfig(ratio: 0.2, minPerSecond: 0))
        #expect(!take(&budget, at: .zero))
        record(&budget, 10, at: .zero)
        #expect(take(&budget, at: .zero))
        #expect(take(&budget, at: .milliseconds(10)))
        #expect(!take(&budget, at: .milliseconds(20)))
        // Five more first attempts raise the allowance to 3: one more retry.
        record(&budget, 5, at: .milliseconds(30))
        #expect(drain(&budget, at: .milliseconds(40)) == 1)
        #expect(budget.retriesInWindow(now: .milliseconds(40)) == 3)
    }

    @Test func theReserveIsPerSecondNotABurst() {
        // min_per_second 1: one reserve retry in each second, however long the upstream was quiet before.
        var budget = RetryBudget(BudgetConfig(ratio: 0.2, minPerSecond: 1))
        #expect(drain(&budget, at: .milliseconds(500)) == 1)
        #expect(drain(&budget, at: .milliseconds(999)) == 0)
        for second in 1...12 {
            #expect(drain(&budget, at: .seconds(second)) == 1, "second \(second)")
        }
    }

    @Test func aSteadyTrickleUsesTheReserveOnePerSecond() {
        var budget = RetryBudget(BudgetConfig(ratio: 0, minPerSecond: 1))
        for second in 0..<10 {
            #expect(take(&budget, at: .seconds(second) + .milliseconds(300)), "second \(second)")
        }
        #expect(!take(&budget, at: .milliseconds(9900)))
        for second in 10..<15 {
            #expect(drain(&budget, at: .seconds(second)) == 1, "second \(second)")
        }
        #expect(budget.retriesInWindow(now: .seconds(14)) == 10)
    }

    @Test func requestsOlderThanTheWindowNoLongerCount() {
        var budget = RetryBudget(BudgetConfig(ratio: 0.2, minPerSecond: 0))
        record(&budget, 10, at: .zero)
        // Still inside the 10 s window at 9.999 s …
        var probe = budget
        #expect(drain(&probe, at: .milliseconds(9999)) == 2)
        // … gone at 10 s (and the probe, a copy, did not spend the original's room).
        #expect(budget.requestsInWindow(now: .milliseconds(9999)) == 10)
        #expect(budget.requestsInWindow(now: .seconds(10)) == 0)
        #expect(drain(&budget, at: .seconds(10)) == 0)
        #expect(drain(&budget, at: .seconds(15)) == 0)
    }

    @Test func theWindowRolls() {
        var budget = RetryBudget(BudgetConfig(ratio: 0.2, minPerSecond: 0))
        record(&budget, 5, at: .zero)
        record(&budget, 5, at: .seconds(5))
        #expect(drain(&budget, at: .seconds(9)) == 2)
        // At 10 s the first five expire: 5 requests allow 1 ratio retry, but the 2 taken at 9 s still count.
        #expect(drain(&budget, at: .seconds(10)) == 0)
        // At 15 s the second five expire as well; the retries taken at 9 s still count until 19 s.
        record(&budget, 10, at: .seconds(15))
        #expect(drain(&budget, at: .seconds(15)) == 0)
        #expect(budget.retriesInWindow(now: .seconds(18)) == 2)
        #expect(budget.retriesInWindow(now: .seconds(19)) == 0)
        #expect(drain(&budget, at: .seconds(19)) == 2)
    }

    @Test func aReusedBucketStartsEmpty() {
        var budget = RetryBudget(BudgetConfig(ratio: 0.2, minPerSecond: 0))
        record(&budget, 10, at: .milliseconds(300))
        // 10.3 s lands in the same ring slot as 0.3 s: the slot must not keep the old requests.
        record(&budget, 1, at: .milliseconds(10_300))
        #expect(budget.requestsInWindow(now: .milliseconds(10_300)) == 1)
        #expect(drain(&budget, at: .milliseconds(10_400)) == 0)
        record(&budget, 4, at: .milliseconds(10_500))
        #expect(drain(&budget, at: .milliseconds(10_600)) == 1)
    }

    @Test func longIdleGapsForgetEverything() {
        var budget = RetryBudget(BudgetConfig(ratio: 0.5, minPerSecond: 1))
        record(&budget, 100, at: .seconds(3))
        #expect(drain(&budget, at: .seconds(3)) == 51)
        #expect(budget.retriesInWindow(now: .seconds(1_000_000)) == 0)
        #expect(drain(&budget, at: .seconds(1_000_000)) == 1)
        // A new second: 0.5 × 4 ratio retries and that second's one reserve retry.
        record(&budget, 4, at: .seconds(1_000_001))
        #expect(drain(&budget, at: .seconds(1_000_001)) == 3)
    }

    @Test func zeroRatioAndZeroReserveAllowNothing() {
        var budget = RetryBudget(BudgetConfig(ratio: 0, minPerSecond: 0))
        record(&budget, 1000, at: .zero)
        for second in 0..<20 {
            #expect(drain(&budget, at: .seconds(second)) == 0)
        }
        #expect(budget.retriesInWindow(now: .seconds(5)) == 0)
    }

    @Test(arguments: [(0.5, 5), (0.15, 1), (0.05, 0), (0.1, 1), (0.3, 3), (2.5, 25), (10, 100)])
    func aFractionalReserveIsSpreadOverTheWindow(minPerSecond: Double, expected: Int) {
        // At most ⌈rate⌉ in one second and ⌊rate × 10⌋ in the window: drained second by second.
        var budget = RetryBudget(BudgetConfig(ratio: 0, minPerSecond: minPerSecond))
        var total = 0
        for second in 0..<10 {
            let taken = drain(&budget, at: .seconds(second))
            #expect(Double(taken) <= minPerSecond.rounded(.up), "second \(second)")
            total += taken
        }
        #expect(total == expected)
        // The window rolls on: second 10 sees second 0's retries leave.
        #expect(drain(&budget, at: .seconds(10)) <= Int(minPerSecond.rounded(.up)))
    }

    @Test(arguments: [
        (0.2, 10, 2), (0.2, 5, 1), (0.2, 4, 0), (0.2, 15, 3), (0.1, 30, 3), (0.3, 10, 3), (0.7, 10, 7),
        (0.57, 100, 57), (0.29, 100, 29), (1.0, 7, 7), (2.5, 4, 10), (0.2, 1000, 200), (0.1, 70, 7),
    ])
    func ratioAllowanceIsExactForDecimalRatios(ratio: Double, requests: Int, expected: Int) {
        var budget = RetryBudget(BudgetConfig(ratio: ratio, minPerSecond: 0))
        record(&budget, requests, at: .seconds(2))
        #expect(drain(&budget, at: .seconds(2)) == expected)
    }

    @Test func requestsAcrossTheWindowAddUp() {
        var budget = RetryBudget(BudgetConfig(ratio: 0.2, minPerSecond: 0))
        for second in 0..<10 { record(&budget, 1, at: .seconds(second) + .milliseconds(500)) }
        #expect(budget.requestsInWindow(now: .milliseconds(9900)) == 10)
        #expect(drain(&budget, at: .milliseconds(9900)) == 2)
    }

    @Test func theSpecDefaultsUnderAFullOutage() {
        // ratio 0.2, min_per_second 10: 1000 first attempts in a window allow 200 ratio retries and 10 more in
        // this second; each later second adds 10, no more.
        var budget = RetryBudget(BudgetConfig())
        for i in 0..<1000 { budget.recordRequest(now: .milliseconds(i * 9)) }
        #expect(drain(&budget, at: .milliseconds(9000)) == 210)
        #expect(drain(&budget, at: .milliseconds(9500)) == 0)
    }

    @Test func extremeConfigsNeitherTrapNorMisbehave() {
        var unlimited = RetryBudget(BudgetConfig(ratio: .infinity, minPerSecond: 0))
        #expect(drain(&unlimited, at: .zero, limit: 50) == 0)  // ∞ × 0 requests is no room, not NaN
        unlimited.recordRequest(now: .zero)
        #expect(drain(&unlimited, at: .zero, limit: 50) == 50)
        var hugeReserve = RetryBudget(BudgetConfig(ratio: 0, minPerSecond: 1e300))
        #expect(drain(&hugeReserve, at: .zero, limit: 50) == 50)
        var nan = RetryBudget(BudgetConfig(ratio: .nan, minPerSecond: .nan))
        nan.recordRequest(now: .zero)
        #expect(drain(&nan, at: .zero) == 0)  // fails closed
    }

    @Test func oddClockReadingsWork() {
        var budget = RetryBudget(BudgetConfig(ratio: 1, minPerSecond: 0))
        // Negative readings (an origin after the event) bucket by floor: −0.5 s is second −1.
        budget.recordRequest(now: .milliseconds(-500))
        #expect(budget.requestsInWindow(now: .milliseconds(-100)) == 1)
        #expect(budget.requestsInWindow(now: .milliseconds(8_999)) == 1)
        #expect(budget.requestsInWindow(now: .seconds(9)) == 0)
        var far = RetryBudget(BudgetConfig(ratio: 1, minPerSecond: 0))
        far.recordRequest(now: .seconds(Int64.max))
        #expect(take(&far, at: .seconds(Int64.max)))
        #expect(!take(&far, at: .seconds(Int64.max)))
    }

    @Test func configIsExposed() {
        let budget = RetryBudget(BudgetConfig(ratio: 0.25, minPerSecond: 4))
        #expect(budget.ratio == 0.25)
        #expect(budget.minPerSecond == 4)
        #expect(RetryBudget.windowSeconds == 10)
    }
}
