/// A per-upstream retry budget (SPEC §2 `retry.budget`, Linkerd's semantics), so retries cannot multiply load on
/// an upstream that is already failing.
///
/// Arithmetic: the window is the current whole second of `now` and the 9 before it (10 one-second buckets, so
/// a count leaves the window between 9 and 10 s after it was made). With `R` first attempts recorded and `T`
/// retries taken in the window, one more retry is allowed when
///
///     T + 1 ≤ ratio × R + min_per_second × 10
///
/// i.e. the window holds ⌊ratio × R + min_per_second × 10⌋ retries: `min_per_second` is a reserve of that many
/// retries per second of window, pooled over the window (a burst after a quiet spell may use all of it), and a
/// fractional remainder does not round up (ratio 0.2 needs 5 first attempts for one ratio retry). Floating-point
/// error in the product (0.57 × 100 = 56.99…) is absorbed by a relative tolerance far below one retry.
///
/// `now` is any monotonic clock reading as a `Duration` since an arbitrary origin (injected, so tests are exact);
/// it must not go backwards by a second or more (a reused bucket is reset).
public struct RetryBudget: Sendable, Equatable {
    public static let windowSeconds = 10

    private struct Bucket: Sendable, Equatable {
        var second: Int64 = .min
        var requests = 0
        var retries = 0
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

    /// Takes room for one retry if the window has any; false leaves the budget unchanged.
    public mutating func tryAcquireRetry(now: Duration) -> Bool {
        let (requests, retries) = totals(now: now)
        // `requests == 0` is spelled out so an infinite ratio means "unlimited", not ∞ × 0 = NaN ("nothing").
        let ratioPart = requests == 0 ? 0 : ratio * Double(requests)
        let allowance = ratioPart + minPerSecond * Double(Self.windowSeconds)
        guard Double(retries) + 1 <= allowance + allowance * 1e-9 else { return false }
        buckets[bucket(for: now)].retries += 1
        return true
    }

    /// Retries taken in the window ending at `now` (for tests and metrics).
    public func retriesInWindow(now: Duration) -> Int { totals(now: now).retries }

    /// First attempts recorded in the window ending at `now`.
    public func requestsInWindow(now: Duration) -> Int { totals(now: now).requests }

    private func totals(now: Duration) -> (requests: Int, retries: Int) {
        let second = Self.second(now)
        let (start, overflow) = second.subtractingReportingOverflow(Int64(Self.windowSeconds))
        let oldestExcluded = overflow ? Int64.min : start
        var requests = 0
        var retries = 0
        for b in buckets where b.second > oldestExcluded && b.second <= second {
            requests += b.requests
            retries += b.retries
        }
        return (requests, retries)
    }

    /// Whole seconds, rounded down (also for negative readings) so every bucket spans exactly one second.
    private static func second(_ now: Duration) -> Int64 {
        let (seconds, attoseconds) = now.components
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
