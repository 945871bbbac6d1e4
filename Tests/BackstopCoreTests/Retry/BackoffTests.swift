import BackstopCore
import Testing

@Suite("Retry backoff")
struct RetryBackoffTests {
    // MARK: jitter none: exact sequences

    @Test func constantIsAlwaysBaseAndDrawsNothing() {
        var rng = ScriptedRandom(ScriptedRandom.half)
        let delays = retrySequence(retryBackoff(.constant, base: .milliseconds(250)), count: 6, random: &rng)
        #expect(delays == Array(repeating: .milliseconds(250), count: 6))
        #expect(rng.draws == 0)
    }

    @Test func exponentialMultiplierTwoDoublesThenCaps() {
        var rng = ScriptedRandom()
        let delays = retrySequence(retryBackoff(.exponential, multiplier: 2), count: 7, random: &rng)
        #expect(delays == [1, 2, 4, 8, 10, 10, 10].map { Duration.seconds($0) })
        #expect(rng.draws == 0)
    }

    @Test func exponentialMultiplierOneAndAHalf() {
        var rng = ScriptedRandom()
        let delays = retrySequence(retryBackoff(.exponential, multiplier: 1.5), count: 8, random: &rng)
        // 1.5^k is a binary fraction, so these are exact.
        let expected: [Duration] = [
            .seconds(1), .milliseconds(1500), .milliseconds(2250), .microseconds(3_375_000),
            .microseconds(5_062_500), .nanoseconds(7_593_750_000), .seconds(10), .seconds(10),
        ]
        #expect(delays == expected)
    }

    @Test func exponentialWithTheDefaultDecimalBase() {
        var rng = ScriptedRandom()
        let delays = retrySequence(
            retryBackoff(.exponential, base: .milliseconds(100), max: .seconds(10), multiplier: 2), count: 9,
            random: &rng)
        let expectedMs = [100, 200, 400, 800, 1600, 3200, 6400, 10_000, 10_000]
        for (d, ms) in zip(delays, expectedMs) {
            #expect(retryApprox(d, .milliseconds(ms)), "\(d) vs \(ms) ms")
        }
    }

    @Test func fibonacciSequenceThenCap() {
        var rng = ScriptedRandom()
        let delays = retrySequence(retryBackoff(.fibonacci, max: .seconds(20)), count: 10, random: &rng)
        #expect(delays == [1, 1, 2, 3, 5, 8, 13, 20, 20, 20].map { Duration.seconds($0) })
        #expect(rng.draws == 0)
    }

    @Test func fibonacciScalesTheBase() {
        var rng = ScriptedRandom()
        let delays = retrySequence(
            retryBackoff(.fibonacci, base: .milliseconds(500), max: .seconds(60)), count: 7, random: &rng)
        #expect(delays == [500, 500, 1000, 1500, 2500, 4000, 6500].map { Duration.milliseconds($0) })
    }

    @Test func capEqualToBaseMakesEveryStrategyConstant() {
        var rng = ScriptedRandom()
        for strategy in [BackoffStrategy.constant, .exponential, .fibonacci] {
            let b = retryBackoff(strategy, base: .seconds(3), max: .seconds(3))
            #expect(retrySequence(b, count: 6, random: &rng) == Array(repeating: .seconds(3), count: 6))
        }
    }

    @Test func retryNumbersBelowOneAreTreatedAsTheFirst() {
        var rng = ScriptedRandom()
        let b = retryBackoff(.exponential)
        #expect(b.delay(retry: 0, previous: nil, random: &rng) == .seconds(1))
        #expect(b.delay(retry: -5, previous: nil, random: &rng) == .seconds(1))
        #expect(b.delay(retry: .min, previous: nil, random: &rng) == .seconds(1))
        #expect(retryBackoff(.fibonacci).delay(retry: -1, previous: nil, random: &rng) == .seconds(1))
    }

    // MARK: no overflow

    @Test func hugeRetryNumbersSaturateAtMax() {
        var rng = ScriptedRandom()
        let exp10 = retryBackoff(.exponential, base: .milliseconds(100), max: .seconds(30), multiplier: 10)
        #expect(exp10.delay(retry: 10_000, previous: nil, random: &rng) == .seconds(30))
        #expect(exp10.delay(retry: 400, previous: nil, random: &rng) == .seconds(30))
        #expect(exp10.delay(retry: .max, previous: nil, random: &rng) == .seconds(30))
        let exp2 = retryBackoff(.exponential, max: .seconds(30), multiplier: 2)
        #expect(exp2.delay(retry: 1025, previous: nil, random: &rng) == .seconds(30))
        #expect(exp2.delay(retry: .max, previous: nil, random: &rng) == .seconds(30))
        let fib = retryBackoff(.fibonacci, max: .seconds(30))
        for retry in [100, 1476, 1477, 1478, 1500, 1501, 10_000, Int.max] {
            #expect(fib.delay(retry: retry, previous: nil, random: &rng) == .seconds(30), "retry \(retry)")
        }
        #expect(retryBackoff(.constant).delay(retry: .max, previous: nil, random: &rng) == .seconds(1))
    }

    @Test func attemptOneThousandWithMultiplierTenIsMax() {
        var rng = ScriptedRandom()
        let b = retryBackoff(.exponential, base: .milliseconds(100), max: .seconds(10), multiplier: 10)
        #expect(b.delay(retry: 1000, previous: nil, random: &rng) == .seconds(10))
        // Multipliers barely above 1 still grow with large exponents (no clamping of the exponent).
        let slow = retryBackoff(.exponential, base: .seconds(1), max: .seconds(1000), multiplier: 1.001)
        let d = slow.delay(retry: 5001, previous: nil, random: &rng)
        #expect(d > .seconds(140) && d < .seconds(150), "1.001^5000 ≈ 146.3, got \(d)")
        #expect(rng.draws == 0)
    }

    @Test func aZeroBaseStaysZeroEvenWhenTheGrowthOverflows() {
        var rng = ScriptedRandom(ScriptedRandom.half)
        for strategy in [BackoffStrategy.constant, .exponential, .fibonacci, .decorrelated] {
            let b = retryBackoff(strategy, base: .zero, max: .seconds(10), multiplier: 10)
            for retry in [1, 2, 1000, Int.max] {
                #expect(b.delay(retry: retry, previous: nil, random: &rng) == .zero, "\(strategy) \(retry)")
            }
        }
    }

    @Test func hugeRetryNumbersWithJitterStayInsideTheCap() {
        var rng = ScriptedRandom(ScriptedRandom.half)
        let full = retryBackoff(.exponential, max: .seconds(30), multiplier: 10, jitter: .full)
        #expect(full.delay(retry: 10_000, previous: nil, random: &rng) == .seconds(15))
        let equal = retryBackoff(.fibonacci, max: .seconds(30), jitter: .equal)
        #expect(equal.delay(retry: .max, previous: nil, random: &rng) == .milliseconds(22_500))
    }

    // MARK: full and equal jitter

    @Test(arguments: [
        (ScriptedRandom.zero, Duration.zero),
        (ScriptedRandom.quarter, Duration.seconds(2)),
        (ScriptedRandom.half, Duration.seconds(4)),
        (ScriptedRandom.threeQuarters, Duration.seconds(6)),
    ])
    func fullJitterExactValues(word: UInt64, expected: Duration) {
        // retry 4 → 8 s before jitter.
        var rng = ScriptedRandom(word)
        let d = retryBackoff(.exponential, jitter: .full).delay(retry: 4, previous: nil, random: &rng)
        #expect(d == expected)
        #expect(rng.draws == 1)
    }

    @Test func fullJitterWordZeroIsExactlyZeroAndTopIsTheDelayToTheNanosecond() {
        var rng = ScriptedRandom(ScriptedRandom.zero, ScriptedRandom.max)
        let b = retryBackoff(.exponential, jitter: .full)
        #expect(b.delay(retry: 4, previous: nil, random: &rng) == .zero)
        // Delays are whole nanoseconds: 8 s × (1 − 2⁻⁵³) rounds to 8 s; never above it.
        let top = b.delay(retry: 4, previous: nil, random: &rng)
        #expect(top == .seconds(8))
        // The cap applies before the jitter: retry 5 is 16 s → capped to 10 s → half is 5 s.
        var half = ScriptedRandom(ScriptedRandom.half)
        #expect(b.delay(retry: 5, previous: nil, random: &half) == .seconds(5))
    }

    @Test(arguments: [
        (ScriptedRandom.zero, Duration.seconds(4)),
        (ScriptedRandom.quarter, Duration.seconds(5)),
        (ScriptedRandom.half, Duration.seconds(6)),
        (ScriptedRandom.threeQuarters, Duration.seconds(7)),
    ])
    func equalJitterExactValues(word: UInt64, expected: Duration) {
        var rng = ScriptedRandom(word)
        let d = retryBackoff(.exponential, jitter: .equal).delay(retry: 4, previous: nil, random: &rng)
        #expect(d == expected)
        #expect(rng.draws == 1)
    }

    @Test func equalJitterTopWordReachesTheDelay() {
        var rng = ScriptedRandom(ScriptedRandom.max)
        let d = retryBackoff(.constant, base: .seconds(8), jitter: .equal).delay(retry: 1, previous: nil, random: &rng)
        // 4 + 4·(1 − 2⁻⁵³) rounds to exactly 8 in Double: the closed upper bound of [d/2, d] is reachable.
        #expect(d <= .seconds(8))
        #expect(d > .seconds(8) - .nanoseconds(1))
    }

    @Test func jitterAppliesToEveryNonDecorrelatedStrategy() {
        for strategy in [BackoffStrategy.constant, .exponential, .fibonacci] {
            var rng = ScriptedRandom(ScriptedRandom.half)
            let full = retryBackoff(strategy, base: .seconds(2), jitter: .full)
            #expect(full.delay(retry: 1, previous: nil, random: &rng) == .seconds(1), "\(strategy)")
            let equal = retryBackoff(strategy, base: .seconds(2), jitter: .equal)
            #expect(equal.delay(retry: 1, previous: nil, random: &rng) == .milliseconds(1500), "\(strategy)")
        }
    }

    @Test func fullJitterStaysInBoundsAndSpreadsOverManyDraws() {
        var rng = SplitMix64(seed: 42)
        let b = retryBackoff(.exponential, base: .milliseconds(100), max: .seconds(10), jitter: .full)
        for retry in 1...10 {
            let ceiling = min(Duration.seconds(10), .milliseconds(100) * (1 << (retry - 1)))
            var lo = ceiling
            var hi = Duration.zero
            var sum = 0.0
            let n = 2000
            for _ in 0..<n {
                let d = b.delay(retry: retry, previous: nil, random: &rng)
                #expect(d >= .zero && d <= ceiling + .nanoseconds(1))
                lo = min(lo, d)
                hi = max(hi, d)
                sum += d / ceiling
            }
            #expect(lo < ceiling / 50, "retry \(retry)")
            #expect(hi > ceiling * 49 / 50, "retry \(retry)")
            #expect(abs(sum / Double(n) - 0.5) < 0.03, "retry \(retry): mean \(sum / Double(n))")
        }
    }

    @Test func equalJitterStaysInBoundsAndSpreadsOverManyDraws() {
        var rng = SplitMix64(seed: 7)
        let b = retryBackoff(.fibonacci, base: .milliseconds(100), max: .seconds(2), jitter: .equal)
        for retry in 1...12 {
            let fib = [1, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144][retry - 1]
            let ceiling = min(Duration.seconds(2), .milliseconds(100) * fib)
            var lo = ceiling
            var hi = Duration.zero
            for _ in 0..<2000 {
                let d = b.delay(retry: retry, previous: nil, random: &rng)
                #expect(d >= ceiling / 2 - .nanoseconds(1) && d <= ceiling + .nanoseconds(1))
                lo = min(lo, d)
                hi = max(hi, d)
            }
            #expect(lo < ceiling * 51 / 100, "retry \(retry)")
            #expect(hi > ceiling * 99 / 100, "retry \(retry)")
        }
    }

    // MARK: decorrelated

    @Test func decorrelatedFirstDelayIsBetweenBaseAndThreeBase() {
        let b = retryBackoff(.decorrelated, base: .seconds(1), max: .seconds(100))
        var zero = ScriptedRandom(ScriptedRandom.zero)
        #expect(b.delay(retry: 1, previous: nil, random: &zero) == .seconds(1))
        var half = ScriptedRandom(ScriptedRandom.half)
        #expect(b.delay(retry: 1, previous: nil, random: &half) == .seconds(2))
        var quarter = ScriptedRandom(ScriptedRandom.quarter)
        #expect(b.delay(retry: 1, previous: nil, random: &quarter) == .milliseconds(1500))
        var top = ScriptedRandom(ScriptedRandom.max)
        let d = b.delay(retry: 1, previous: nil, random: &top)
        // 1 + 2·(1 − 2⁻⁵³) rounds to exactly 3 in Double: the upper bound is reachable, as documented.
        #expect(d <= .seconds(3) && d > .seconds(3) - .nanoseconds(1))
        #expect(top.draws == 1)
    }

    @Test func decorrelatedUsesThePreviousDelayAndIgnoresRetryNumber() {
        let b = retryBackoff(.decorrelated, base: .seconds(1), max: .seconds(100))
        var rng = ScriptedRandom(ScriptedRandom.half)
        // previous 4 s → uniform [1, 12] → half is 6.5 s, whatever the retry number.
        #expect(b.delay(retry: 1, previous: .seconds(4), random: &rng) == .milliseconds(6500))
        #expect(b.delay(retry: 9, previous: .seconds(4), random: &rng) == .milliseconds(6500))
        // A previous delay below base/3 still keeps the range at base.
        #expect(b.delay(retry: 2, previous: .milliseconds(100), random: &rng) == .seconds(1))
        #expect(b.delay(retry: 2, previous: .zero, random: &rng) == .seconds(1))
    }

    @Test func decorrelatedChainWithFixedWords() {
        let b = retryBackoff(.decorrelated, base: .seconds(1), max: .seconds(20))
        var rng = ScriptedRandom(ScriptedRandom.half)
        // 1 + (3−1)/2 = 2; 1 + (6−1)/2 = 3.5; 1 + (10.5−1)/2 = 5.75; 1 + (17.25−1)/2 = 9.125;
        // 1 + (27.375−1)/2 = 14.1875; then 1 + (42.5625−1)/2 = 21.78125 → capped at 20.
        let delays = retrySequence(b, count: 7, random: &rng)
        let expected: [Duration] = [
            .seconds(2), .milliseconds(3500), .milliseconds(5750), .milliseconds(9125), .microseconds(14_187_500),
            .seconds(20), .seconds(20),
        ]
        #expect(delays == expected)
        #expect(rng.draws == 7)
    }

    @Test func decorrelatedIgnoresTheJitterMode() {
        for jitter in JitterMode.allCases {
            var rng = ScriptedRandom(ScriptedRandom.zero)
            let b = retryBackoff(.decorrelated, base: .seconds(1), jitter: jitter)
            #expect(b.delay(retry: 1, previous: nil, random: &rng) == .seconds(1), "\(jitter)")
            #expect(rng.draws == 1)
        }
    }

    @Test func decorrelatedStaysWithinBaseAndThreeTimesPreviousCapped() {
        var rng = SplitMix64(seed: 0xDEC0)
        let base = Duration.milliseconds(100)
        let cap = Duration.seconds(5)
        let b = retryBackoff(.decorrelated, base: base, max: cap)
        var previous: Duration?
        var reachedCap = false
        for retry in 1...5000 {
            let d = b.delay(retry: retry, previous: previous, random: &rng)
            let upper = min(cap, max(base, (previous ?? base) * 3))
            #expect(d >= base - .nanoseconds(1) && d <= upper + .nanoseconds(1), "retry \(retry): \(d) vs \(upper)")
            if d == cap { reachedCap = true }
            // Restart the chain now and then so short previous values are covered too.
            previous = retry % 50 == 0 ? nil : d
        }
        #expect(reachedCap)
    }

    @Test func decorrelatedWithAHugePreviousIsCapped() {
        var rng = ScriptedRandom(ScriptedRandom.half)
        let b = retryBackoff(.decorrelated, base: .seconds(1), max: .seconds(10))
        #expect(b.delay(retry: 1, previous: .seconds(Int64.max / 2), random: &rng) == .seconds(10))
        var zero = ScriptedRandom(ScriptedRandom.zero)
        #expect(b.delay(retry: 1, previous: .seconds(Int64.max / 2), random: &zero) == .seconds(1))
    }

    // MARK: helpers

    @Test func unitIntervalUsesTheTop53Bits() {
        var rng = ScriptedRandom(0, 1 << 63, 1 << 62, .max, (1 << 11) - 1, 1 << 11)
        #expect(unitInterval(&rng) == 0)
        #expect(unitInterval(&rng) == 0.5)
        #expect(unitInterval(&rng) == 0.25)
        #expect(unitInterval(&rng) == 1 - 0x1p-53)
        #expect(unitInterval(&rng) == 0)
        #expect(unitInterval(&rng) == 0x1p-53)
        #expect(rng.draws == 6)
    }

    @Test func durationSecondsProperty() {
        #expect(Duration.seconds(3).seconds == 3)
        #expect(Duration.milliseconds(1500).seconds == 1.5)
        #expect(Duration.zero.seconds == 0)
        #expect(retryApprox(.seconds(Duration.milliseconds(100).seconds), .milliseconds(100)))
    }
}
