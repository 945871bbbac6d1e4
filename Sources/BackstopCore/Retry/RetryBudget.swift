/// A per-upstream retry budget (`retry.budget`, docs/reference/config.md#retry), so retries cannot multiply load on an upstream that is
/// already failing.
///
/// Two allowances, tried in this order:
/// - **ratio**: over a rolling window of ten one-second buckets (the current whole second of `now` and the nine
///   before it), retries taken on the ratio stay at or below `ratio × first attempts` in the window. A fractional
///   remainder does not round up (ratio 0.2 needs 5 first attempts for one ratio retry); floating-point error in
///   the product (0.57 × 100 = 56.99…) is absorbed by a relative tolerance far below one retry.
/// - **reserve**: beyond the ratio, up to `min_per_second` more retries in each second regardless of traffic, so
///   a quiet upstream can still retry. A fractional rate is spread over the window: at most ⌈rate⌉ in any second
///   and ⌊rate × 10⌋ in the window (0.5 → one retry every two seconds on average).
///
/// Under a full outage an upstream therefore sees at most `ratio` extra attempts per request plus `min_per_second`
/// retries each second, never a burst of the window's whole reserve.
///
/// `now` is any monotonic clock reading as a `Duration` since an arbitrary origin (injected, so tests are exact);
/// it must not go backwards by a second or more (a reused bucket is reset).
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

    /// Counts a first attempt (not a retry).
    public mutating func recordRequest(now: Duration) {
        buckets[bucket(for: now)].requests += 1
    }

    /// Takes room for one retry if either allowance has any; false leaves the budget unchanged.
    public mutating func tryAcquireRetry(now: Duration) -> Bool {
        let totals = totals(now: now)
        // `requests == 0` is spelled out so an infinite ratio means "unlimited", not ∞ × 0 = NaN ("nothing").
        let ratioAllowance = totals.requests == 0 ? 0 : ratio * Double(totals.requests)
        if Self.fits(totals.ratioRetries + 1, ratioAllowance) {
            buckets[bucket(for: now)].ratioRetries += 1
            return true
        }
        let current = bucket(for: now)
        if Self.fits(buckets[current].reserveRetries + 1, minPerSecond.rounded(.up)),
            Self.fits(totals.reserveRetries + 1, minPerSecond * Double(Self.windowSeconds))
        {
            buckets[current].reserveRetries += 1
            return true
        }
        return false
    }

    /// `count ≤ allowance`, with a relative tolerance for floating-point error; NaN fails closed.
    private static func fits(_ count: Int, _ allowance: Double) -> Bool {
        Double(count) <= allowance + allowance * 1e-9
    }

    /// Retries taken in the window ending at `now` (for tests and metrics).
    public func retriesInWindow(now: Duration) -> Int {
        let t = totals(now: now)
        return t.ratioRetries + t.reserveRetries
    }

    /// How many retries `tryAcquireRetry` would grant one after another at `now`, counted up to `cap` (the status
    /// page's "retry budget left"; an unlimited ratio shows as `cap`).
    public func retriesLeft(now: Duration, cap: Int = 1000) -> Int {
        var trial = self
        var granted = 0
        while granted < cap, trial.tryAcquireRetry(now: now) { granted += 1 }
        return granted
    }

    /// First attempts recorded in the window ending at `now`.
    public func requestsInWindow(now: Duration) -> Int { totals(now: now).requests }

    private func totals(now: Duration) -> (requests: Int, ratioRetries: Int, reserveRetries: Int) {
        let second = Self.second(now)
        let (start, overflow) = second.subtractingReportingOverflow(Int64(Self.windowSeconds))
        let oldestExcluded = overflow ? Int64.min : start
        var requests = 0
        var ratioRetries = 0
        var reserveRetries = 0
        for b in buckets where b.second > oldestExcluded && b.second <= second {
            requests += b.requests
            ratioRetries += b.ratioRetries
            reserveRetries += b.reserveRetries
        }
        return (requests, ratioRetries, reserveRetries)
    }

    /// Whole seconds, rounded down (also for negative readings) so every bucket spans exactly one second.
    private static func second(_ now: Duration) -> Int64 {
        let (seconds, attoseconds) = now.secondsAndAttoseconds
        return attoseconds < 0 && seconds > .min ? seconds - 1 : seconds
    }

    private mutating func bucket(for now: Duration) -> Int {
        let second = Self.second(now)
        let window = Int64(Self.windowSeconds)
        let index = Int(((second % window) + window) % window)
        if buckets[index].second != second { buckets[index] = Bucket(second: second) }
        return index
    }
}
