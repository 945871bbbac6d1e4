import Testing

@testable import BackstopCore

/// `HeadLatencyWindow` with exact times: the buckets, the nearest-rank 95th percentile, the one-minute window and
/// the hedge delay derived from it.
@Suite("HeadLatencyWindow")
struct HeadLatencyWindowTests {
    static func ms(_ value: Double) -> Duration { .microseconds(Int64((value * 1000).rounded())) }

    static func window(_ samples: [(Duration, count: Int)], at now: Duration = .seconds(1000)) -> HeadLatencyWindow {
        var window = HeadLatencyWindow()
        for (latency, count) in samples {
            for _ in 0..<count { window.record(latency, now: now) }
        }
        return window
    }

    @Test("buckets: exact to 8 µs, then four per doubling")
    func buckets() {
        let table: [(UInt64, Int, Int64)] = [
            (0, 0, 1), (3, 3, 4), (4, 4, 5), (7, 7, 8), (8, 8, 10), (9, 8, 10), (10, 9, 12), (15, 11, 16),
            (16, 12, 20), (1000, 35, 1024), (10_000, 48, 10_240), (20_000, 52, 20_480), (100_000, 62, 114_688),
            (250_000, 67, 262_144), (1_000_000, 75, 1_048_576), (HeadLatencyWindow.maxMicroseconds, 103, 1 << 27),
        ]
        for (value, bucket, upper) in table {
            #expect(HeadLatencyWindow.bucket(forMicroseconds: value) == bucket, "\(value) µs")
            #expect(HeadLatencyWindow.upperEdge(ofBucket: bucket) == upper, "bucket \(bucket)")
        }
        #expect(HeadLatencyWindow.bucketCount == 104)
    }

    @Test("every value lies in its bucket, and a bucket spans at most a quarter of its lower edge")
    func bucketBounds() {
        var values: [UInt64] = Array(0...5000)
        for shift in 0..<27 { values += [(1 << shift) - 1, 1 << shift, (1 << shift) + 1, 3 << max(shift - 1, 0)] }
        for value in values where value <= HeadLatencyWindow.maxMicroseconds {
            let bucket = HeadLatencyWindow.bucket(forMicroseconds: value)
            let upper = HeadLatencyWindow.upperEdge(ofBucket: bucket)
            let lower = bucket == 0 ? 0 : HeadLatencyWindow.upperEdge(ofBucket: bucket - 1)
            #expect(Int64(value) < upper && Int64(value) >= lower, "\(value) µs in [\(lower), \(upper))")
            #expect(lower < 4 || (upper - lower) * 4 <= lower, "bucket \(bucket) is [\(lower), \(upper))")
        }
    }

    @Test("latencies are whole microseconds, negatives 0, the longest in the last bucket")
    func microseconds() {
        #expect(HeadLatencyWindow.microseconds(.nanoseconds(1999)) == 1)
        #expect(HeadLatencyWindow.microseconds(.seconds(-1)) == 0)
        #expect(HeadLatencyWindow.microseconds(.seconds(3600)) == HeadLatencyWindow.maxMicroseconds)
        #expect(HeadLatencyWindow.microseconds(.seconds(134)) == HeadLatencyWindow.maxMicroseconds)
        #expect(HeadLatencyWindow.microseconds(.milliseconds(1500)) == 1_500_000)
    }

    @Test("no estimate below 20 samples: hedge after 250 ms")
    func tooFewSamples() {
        var window = Self.window([(.milliseconds(100), 19)])
        #expect(window.sampleCount == 19)
        #expect(window.p95(now: .seconds(1000)) == nil)
        #expect(window.hedgeDelay(.p95, now: .seconds(1000)) == .milliseconds(250))
        window.record(.milliseconds(100), now: .seconds(1000))
        #expect(window.p95(now: .seconds(1000)) == .microseconds(114_688))
        #expect(window.hedgeDelay(.p95, now: .seconds(1000)) == .microseconds(114_688))
    }

    @Test(
        "nearest rank: the 95th of 100 samples decides",
        arguments: [
            (95, 5, Duration.microseconds(10_240)), (94, 6, Duration.microseconds(1_048_576)),
            (19, 1, Duration.microseconds(10_240)), (18, 2, Duration.microseconds(1_048_576)),
        ])
    func nearestRank(fast: Int, slow: Int, expected: Duration) {
        var window = Self.window([(.milliseconds(10), fast), (.seconds(1), slow)])
        #expect(window.p95(now: .seconds(1000)) == expected)
    }

    @Test("the estimate is never below 10 ms")
    func floor() {
        var window = Self.window([(.milliseconds(1), 50)])
        #expect(window.p95(now: .seconds(1000)) == .microseconds(1024))
        #expect(window.hedgeDelay(.p95, now: .seconds(1000)) == .milliseconds(10))
    }

    @Test("a fixed hedge.after is used as it is")
    func fixed() {
        var window = Self.window([(.seconds(2), 40)])
        #expect(window.hedgeDelay(.fixed(.milliseconds(75)), now: .seconds(1000)) == .milliseconds(75))
    }

    @Test("samples leave the window after the twelfth five-second slot")
    func expiry() {
        // Period 200 is [1000 s, 1005 s); the window ending in period 211 ([1055 s, 1060 s)) still holds it.
        var window = Self.window([(.milliseconds(100), 20)], at: Self.ms(1_004_999))
        #expect(window.p95(now: Self.ms(1_059_999)) == .microseconds(114_688))
        #expect(window.sampleCount == 20)
        #expect(window.p95(now: .seconds(1060)) == nil)
        #expect(window.sampleCount == 0)
    }

    @Test("the window rolls: old slow samples go, newer fast ones stay")
    func rolling() {
        var window = Self.window([(.milliseconds(250), 20)], at: .seconds(1000))
        for _ in 0..<20 { window.record(.milliseconds(20), now: .seconds(1030)) }
        #expect(window.p95(now: .seconds(1030)) == .microseconds(262_144))
        #expect(window.sampleCount == 40)
        #expect(window.p95(now: .seconds(1060)) == .microseconds(20_480))
        #expect(window.sampleCount == 20)
        #expect(window.hedgeDelay(.p95, now: .seconds(1090)) == .milliseconds(250))
    }

    @Test("a slot reused a minute later starts empty")
    func slotReuse() {
        var window = Self.window([(.seconds(1), 30)], at: .seconds(1000))
        // Same slot (period 212 ≡ 200 mod 12), recorded without a query in between.
        for _ in 0..<20 { window.record(.milliseconds(10), now: .seconds(1060)) }
        #expect(window.sampleCount == 20)
        #expect(window.p95(now: .seconds(1060)) == .microseconds(10_240))
    }

    @Test("negative clock readings and very long latencies")
    func edges() {
        var window = Self.window([(.seconds(3600), 20)], at: .seconds(-3))
        #expect(HeadLatencyWindow.period(.seconds(-3)) == -1)
        #expect(HeadLatencyWindow.period(.milliseconds(-1)) == -1)
        #expect(HeadLatencyWindow.period(.seconds(-5)) == -1)
        #expect(HeadLatencyWindow.period(.milliseconds(-5001)) == -2)
        #expect(HeadLatencyWindow.period(.milliseconds(4999)) == 0)
        #expect(window.p95(now: .seconds(50)) == .microseconds(1 << 27))
        #expect(window.p95(now: .seconds(55)) == nil)
    }

    @Test("a busy minute keeps exact counts")
    func busy() {
        var window = HeadLatencyWindow()
        var rng = SplitMix64(seed: 7)
        var samples: [Duration] = []
        for i in 0..<60_000 {
            let latency = Duration.microseconds(Int64(rng.next() % 200_000))
            let now = Duration.milliseconds(Int64(i))  // 60 s of one sample per millisecond
            window.record(latency, now: now)
            if i >= 5_000 { samples.append(latency) }  // period 0 ([0, 5 s)) has left the window at 60 s
        }
        #expect(window.p95(now: .seconds(60)) != nil)
        #expect(window.sampleCount == 55_000)
        // The exact nearest-rank value lies in the reported bucket: at most a quarter below the reported edge.
        let exact = samples.sorted()[(95 * samples.count + 99) / 100 - 1]
        let reported = window.p95(now: .seconds(60))!
        #expect(reported > exact && reported <= exact * 1.25 + .microseconds(1))
    }
}
