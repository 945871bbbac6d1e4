/// One upstream's time to response head over the last minute, for `hedge.after: p95`
/// (docs/reference/behaviour.md#hedging): how long an attempt may go without a head before a copy is sent.
///
/// Bounded memory whatever the traffic: twelve five-second slots, each a histogram of 104 buckets with four per
/// doubling of the latency (a bucket spans at most a quarter of its lower edge), plus their running sum. The window
/// is the current slot and the eleven before it (between 55 and 60 seconds); a slot is dropped as a whole when it
/// leaves the window. The 95th percentile is the nearest rank (the ⌈0.95 n⌉-th smallest sample), reported as the
/// upper edge of the bucket that holds it: at most a quarter above the exact value, never below it, so a copy is
/// sent a little late rather than a little early.
///
/// Pure: `now` is any monotonic clock reading (`Duration` since an arbitrary origin). Shared by an upstream's
/// requests behind one lock; a record costs a few integer operations, a `p95` a walk over 104 counters.
public struct HeadLatencyWindow: Sendable, Equatable {
    public static let slotSeconds: Int64 = 5
    public static let slotCount = 12
    /// Fewer samples than this in the window: the estimate is `defaultDelay`.
    public static let minimumSamples = 20
    public static let defaultDelay: Duration = .milliseconds(250)
    /// The estimate never goes below this: a copy sent within a few milliseconds doubles the load for nothing.
    public static let minimumDelay: Duration = .milliseconds(10)
    /// Latencies are counted in microseconds up to this (about 134 s); longer ones fall in the last bucket.
    static let maxMicroseconds: UInt64 = (1 << 27) - 1
    static let bucketCount = bucket(forMicroseconds: maxMicroseconds) + 1

    /// `slotCount × bucketCount` counters, slot-major.
    private var counts: [UInt32]
    /// The five-second period each slot holds; `.min` for a slot never used.
    private var periods: [Int64]
    private var slotTotals: [Int]
    /// The sum of the live slots, bucket by bucket.
    private var window: [UInt32]
    public private(set) var sampleCount = 0

    public init() {
        counts = Array(repeating: 0, count: Self.slotCount * Self.bucketCount)
        periods = Array(repeating: .min, count: Self.slotCount)
        slotTotals = Array(repeating: 0, count: Self.slotCount)
        window = Array(repeating: 0, count: Self.bucketCount)
    }

    /// Counts one attempt's time from sending its request to receiving its response head.
    public mutating func record(_ latency: Duration, now: Duration) {
        let period = Self.period(now)
        expire(before: period)
        let slot = Self.slot(period)
        if periods[slot] != period { clear(slot) }
        periods[slot] = period
        let bucket = Self.bucket(forMicroseconds: Self.microseconds(latency))
        counts[slot * Self.bucketCount + bucket] &+= 1
        window[bucket] &+= 1
        slotTotals[slot] += 1
        sampleCount += 1
    }

    /// The 95th percentile of the window ending at `now`, or nil with fewer than `minimumSamples` samples in it.
    public mutating func p95(now: Duration) -> Duration? {
        expire(before: Self.period(now))
        guard sampleCount >= Self.minimumSamples else { return nil }
        let rank = (95 * sampleCount + 99) / 100
        var seen = 0
        for bucket in 0..<Self.bucketCount {
            seen += Int(window[bucket])
            if seen >= rank { return .microseconds(Self.upperEdge(ofBucket: bucket)) }
        }
        return .microseconds(Self.upperEdge(ofBucket: Self.bucketCount - 1))
    }

    /// How long an attempt waits for a head before a copy is sent: the fixed `hedge.after`, or for `p95` the
    /// window's 95th percentile (at least `minimumDelay`; `defaultDelay` until `minimumSamples` exist).
    public mutating func hedgeDelay(_ after: HedgeAfter, now: Duration) -> Duration {
        switch after {
        case .fixed(let delay): return delay
        case .p95:
            guard let p95 = p95(now: now) else { return Self.defaultDelay }
            return Swift.max(p95, Self.minimumDelay)
        }
    }

    // MARK: slots

    /// Drops every slot that has left the window ending in `period`.
    private mutating func expire(before period: Int64) {
        let (oldestLive, overflow) = period.subtractingReportingOverflow(Int64(Self.slotCount) - 1)
        guard !overflow else { return }
        for slot in 0..<Self.slotCount where slotTotals[slot] > 0 && periods[slot] < oldestLive {
            clear(slot)
        }
    }

    private mutating func clear(_ slot: Int) {
        guard slotTotals[slot] > 0 else { return }
        let base = slot * Self.bucketCount
        for bucket in 0..<Self.bucketCount where counts[base + bucket] > 0 {
            window[bucket] &-= counts[base + bucket]
            counts[base + bucket] = 0
        }
        sampleCount -= slotTotals[slot]
        slotTotals[slot] = 0
    }

    /// Five-second periods, rounded down (also for negative readings).
    static func period(_ now: Duration) -> Int64 {
        let (seconds, attoseconds) = now.secondsAndAttoseconds
        let whole = attoseconds < 0 && seconds > .min ? seconds - 1 : seconds
        let q = whole / slotSeconds
        return whole % slotSeconds < 0 ? q - 1 : q
    }

    private static func slot(_ period: Int64) -> Int {
        let n = Int64(slotCount)
        return Int(((period % n) + n) % n)
    }

    // MARK: buckets

    /// Whole microseconds, negatives as 0, at most `maxMicroseconds`.
    static func microseconds(_ latency: Duration) -> UInt64 {
        let (seconds, attoseconds) = latency.secondsAndAttoseconds
        guard seconds >= 0, attoseconds >= 0 else { return 0 }
        guard seconds < 134 else { return maxMicroseconds }
        return Swift.min(UInt64(seconds) * 1_000_000 + UInt64(attoseconds / 1_000_000_000_000), maxMicroseconds)
    }

    /// 0–3 µs one bucket each; above, four buckets per power of two: the top bit and the two below it.
    static func bucket(forMicroseconds value: UInt64) -> Int {
        guard value >= 4 else { return Int(value) }
        let top = 63 - value.leadingZeroBitCount
        let sub = Int((value >> (top - 2)) & 3)
        return 4 + (top - 2) * 4 + sub
    }

    /// The smallest value (µs) above every value of `bucket`.
    static func upperEdge(ofBucket bucket: Int) -> Int64 {
        guard bucket >= 4 else { return Int64(bucket) + 1 }
        let shift = (bucket - 4) / 4
        let sub = Int64((bucket - 4) % 4)
        return (4 + sub + 1) << shift
    }
}
