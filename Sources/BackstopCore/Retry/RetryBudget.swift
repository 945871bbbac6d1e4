/// A per-upstream retry budget (SPEC §2 `retry.budget`, after Linkerd/Envoy): over a rolling 10 s window of
/// 1 s buckets, retries may add at most `ratio` × the first attempts in the window; beyond that, up to
/// `min_per_second` more retries are allowed in each second regardless. Time is injected (`now` is any
/// monotonic clock reading as a `Duration`), so tests are exact.
public struct RetryBudget: Sendable, Equatable {
    public static let windowSeconds = 10

    private struct Bucket: Sendable, Equatable {
        var second: Int64 = .min
        var requests = 0
        var ratioRetries = 0
        var reserveRetries = 0
    }

    public let ratio: Double
    public let minPerSecond: Double
    private var buckets = [Bucket](repeating: Bucket(), count: RetryBudget.windowSeconds)

    public init(_ config: BudgetConfig) {
        self.ratio = config.ratio
        self.minPerSecond = config.minPerSecond
    }

    /// Counts a first attempt.
    public mutating func recordRequest(now: Duration) {
        let index = bucket(for: now)
        buckets[index].requests += 1
    }

    /// Takes room for one retry if there is any.
    public mutating func tryAcquireRetry(now: Duration) -> Bool {
        let current = bucket(for: now)
        let second = Self.second(now)
        var requests = 0
        var ratioRetries = 0
        for b in buckets where b.second > second - Int64(Self.windowSeconds) && b.second <= second {
            requests += b.requests
            ratioRetries += b.ratioRetries
        }
        // ratio × requests can land just below a whole number in floating point (0.57 × 100 = 56.99…), which would
        // refuse a retry the ratio allows; a relative tolerance far below one retry absorbs that.
        let allowance = ratio * Double(requests)
        if Double(ratioRetries + 1) <= allowance + allowance * 1e-9 {
            buckets[current].ratioRetries += 1
            return true
        }
        if Double(buckets[current].reserveRetries) < minPerSecond {
            buckets[current].reserveRetries += 1
            return true
        }
        return false
    }

    /// Retries taken in the window ending at `now` (for tests and metrics).
    public func retriesInWindow(now: Duration) -> Int {
        let second = Self.second(now)
        return buckets.filter { $0.second > second - Int64(Self.windowSeconds) && $0.second <= second }
            .reduce(0) { $0 + $1.ratioRetries + $1.reserveRetries }
    }

    private static func second(_ now: Duration) -> Int64 { now.components.seconds }

    private mutating func bucket(for now: Duration) -> Int {
        let second = Self.second(now)
        let index = Int(((second % Int64(Self.windowSeconds)) + Int64(Self.windowSeconds)) % Int64(Self.windowSeconds))
        if buckets[index].second != second { buckets[index] = Bucket(second: second) }
        return index
    }
}
