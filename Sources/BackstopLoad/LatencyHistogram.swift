/// Latencies in microseconds in fixed log-linear buckets (like HdrHistogram with 7 bits of precision): exact below
/// 256 µs, then 128 buckets per power of two, so a reported percentile is within 0.8% of the true value. Values past
/// about a minute land in the last bucket.
struct LatencyHistogram: Sendable {
    private static let subBucketBits = 7
    private static let subBuckets = 1 << subBucketBits
    private static let bucketCount = 2 * subBuckets + 18 * subBuckets

    private(set) var counts: [UInt64]
    private(set) var total: UInt64 = 0

    init() { counts = Array(repeating: 0, count: Self.bucketCount) }

    mutating func record(microseconds: UInt64) {
        counts[min(Self.index(of: microseconds), Self.bucketCount - 1)] += 1
        total += 1
    }

    mutating func merge(_ other: LatencyHistogram) {
        for index in counts.indices { counts[index] += other.counts[index] }
        total += other.total
    }

    /// The upper bound, in microseconds, of the bucket holding the `quantile` (0...1) of the recorded values; 0 when
    /// nothing was recorded.
    func percentile(_ quantile: Double) -> UInt64 {
        guard total > 0 else { return 0 }
        let rank = max(1, UInt64((quantile * Double(total)).rounded(.up)))
        var seen: UInt64 = 0
        for (index, count) in counts.enumerated() {
            seen += count
            if seen >= rank { return Self.upperBound(of: index) }
        }
        return Self.upperBound(of: counts.count - 1)
    }

    static func index(of value: UInt64) -> Int {
        if value < UInt64(2 * subBuckets) { return Int(value) }
        let highestBit = 63 - value.leadingZeroBitCount
        let shift = highestBit - subBucketBits
        let mantissa = Int(value >> UInt64(shift))  // in subBuckets..<2*subBuckets
        return 2 * subBuckets + (shift - 1) * subBuckets + (mantissa - subBuckets)
    }

    static func upperBound(of index: Int) -> UInt64 {
        if index < 2 * subBuckets { return UInt64(index) }
        let shift = (index - 2 * subBuckets) / subBuckets + 1
        let mantissa = UInt64((index - 2 * subBuckets) % subBuckets + subBuckets)
        return ((mantissa + 1) << UInt64(shift)) - 1
    }
}
