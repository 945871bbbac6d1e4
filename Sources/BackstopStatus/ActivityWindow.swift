/// Requests, non-5xx answers and attempts of the last `seconds` seconds, in one-second buckets: the status page's
/// requests per second, success ratio and attempts per request. A pure value fed with monotonic whole seconds;
/// the owner keeps it behind a lock.
public struct ActivityWindow: Sendable, Equatable {
    public static let defaultSeconds = 60

    struct Bucket: Equatable {
        var second: Int64 = .min
        var requests = 0
        var successes = 0
        var attempts = 0
    }

    public let seconds: Int
    var buckets: [Bucket]

    public init(seconds: Int = ActivityWindow.defaultSeconds) {
        self.seconds = max(1, seconds)
        buckets = Array(repeating: Bucket(), count: self.seconds)
    }

    /// One answered request at monotonic second `second`.
    public mutating func record(second: Int64, success: Bool, attempts: Int) {
        let index = Int(((second % Int64(seconds)) + Int64(seconds)) % Int64(seconds))
        if buckets[index].second != second { buckets[index] = Bucket(second: second) }
        buckets[index].requests += 1
        if success { buckets[index].successes += 1 }
        buckets[index].attempts += attempts
    }

    /// Totals over the `seconds` seconds ending with `now` (inclusive).
    public func totals(now: Int64) -> (requests: Int, successes: Int, attempts: Int) {
        var totals = (requests: 0, successes: 0, attempts: 0)
        for bucket in buckets where bucket.second <= now && bucket.second > now - Int64(seconds) {
            totals.requests += bucket.requests
            totals.successes += bucket.successes
            totals.attempts += bucket.attempts
        }
        return totals
    }

    /// Requests per second, success ratio and attempts per request at `now`.
    public func rates(now: Int64) -> (perSecond: Double, successRatio: Double?, attemptsPerRequest: Double?) {
        let t = totals(now: now)
        guard t.requests > 0 else { return (0, nil, nil) }
        return (
            Double(t.requests) / Double(seconds), Double(t.successes) / Double(t.requests),
            Double(t.attempts) / Double(t.requests)
        )
    }
}
