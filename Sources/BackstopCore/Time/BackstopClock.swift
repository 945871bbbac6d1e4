#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// The one clock abstraction of the project: the exchange, the connection, the token manager and the static token
/// source read time only through it, so tests drive time exactly (`ManualClock` in the test support) and the
/// daemon reads the kernel's clocks (`SystemClock`).
///
/// Class-bound: the hot path reads it several times per request through `any BackstopClock`, and a class existential
/// is one reference (no boxed value to copy, project and destroy on each read).
public protocol BackstopClock: AnyObject, Sendable {
    /// A monotonic reading since an arbitrary origin: deadlines, timeouts, budget buckets.
    func monotonic() -> Duration
    /// Wall-clock seconds since the Unix epoch: token expiries (shared with other processes through the
    /// keychain) and HTTP-date hints.
    func wall() -> Double
}

/// `CLOCK_MONOTONIC` and `CLOCK_REALTIME`.
public final class SystemClock: BackstopClock {
    public init() {}

    public func monotonic() -> Duration {
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        // One conversion (Duration arithmetic is 128-bit): this is read on every step of every request.
        return .nanoseconds(Int64(now.tv_sec) &* 1_000_000_000 &+ Int64(now.tv_nsec))
    }

    public func wall() -> Double {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        return Double(now.tv_sec) + Double(now.tv_nsec) / 1e9
    }
}

extension Duration {
    /// `components` (whole seconds toward zero, and the attoseconds left, of the same sign), from one native
    /// 128-bit division: the standard library's own splits it ~2.5× slower through its software 128-bit arithmetic,
    /// and a request reads it several times (metrics, the retry budget; docs/performance.md#smaller-per-request-costs).
    /// Traps where `components` does, for more seconds than an `Int64` holds.
    public var secondsAndAttoseconds: (seconds: Int64, attoseconds: Int64) {
        let (seconds, attoseconds) = self.attoseconds.quotientAndRemainder(dividingBy: 1_000_000_000_000_000_000)
        return (Int64(seconds), Int64(attoseconds))
    }

    /// Whole nanoseconds, saturating at `Int64.min`/`Int64.max` instead of trapping (a configured `1000000h`
    /// still converts): the one conversion from `Duration` to an integer clock unit.
    public var nanosecondsClamped: Int64 {
        let (seconds, attoseconds) = secondsAndAttoseconds
        let (whole, overflow) = seconds.multipliedReportingOverflow(by: 1_000_000_000)
        if overflow { return seconds < 0 ? .min : .max }
        let (sum, overflow2) = whole.addingReportingOverflow(attoseconds / 1_000_000_000)
        if overflow2 { return seconds < 0 ? .min : .max }
        return sum
    }

    /// Whole milliseconds, rounded up so that a 1 µs timeout is not 0 ("no timeout" to curl).
    public var millisecondsRoundedUp: Int64 {
        let nanos = nanosecondsClamped
        return nanos >= Int64.max - 999_999 ? Int64.max / 1_000_000 : (nanos + 999_999) / 1_000_000
    }
}
