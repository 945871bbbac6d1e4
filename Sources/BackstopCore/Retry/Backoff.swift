/// Backoff delays (`retry.backoff`, docs/reference/config.md#retry): pure, with the random source injected.
///
/// For retry number `n` (1 for the first retry): `constant` → base; `exponential` → base·multiplier^(n−1);
/// `fibonacci` → base·F(n) with F = 1, 1, 2, 3, 5, 8, …; all capped at `max`, then jittered: `none` → d,
/// `full` → uniform [0, d], `equal` → d/2 + uniform [0, d/2]. `decorrelated` is AWS's "decorrelated jitter":
/// min(max, uniform [base, 3·previous]) with previous = base at first; it is random by construction, so the
/// jitter mode does not apply to it.
public struct Backoff: Sendable, Equatable {
    public let config: BackoffConfig

    public init(_ config: BackoffConfig) { self.config = config }

    /// The delay before retry `retry` (1-based). `previous` is the delay chosen before it (decorrelated only).
    public func delay(retry: Int, previous: Duration?, random: inout some RandomNumberGenerator) -> Duration {
        let base = config.base.seconds
        let cap = config.max.seconds
        let n = max(1, retry)
        let raw: Double
        switch config.strategy {
        case .constant:
            raw = base
        case .exponential:
            // Capped before it can overflow: multiplier^(n-1) in floating point saturates to +inf, not a trap.
            raw = base * saturatingPower(config.multiplier, n - 1)
        case .fibonacci:
            raw = base * Self.fibonacci(n)
        case .decorrelated:
            let prev = previous?.seconds ?? base
            let upper = max(base, prev * 3)
            let value = base + (upper - base) * unitInterval(&random)
            return Self.duration(min(cap, value))
        }
        // A zero base stays zero (0 × ∞ would be NaN, not "capped"); an infinite product saturates at the cap.
        let capped = base <= 0 ? 0 : raw.isFinite ? min(cap, raw) : cap
        switch config.jitter {
        case .none: return Self.duration(capped)
        case .full: return Self.duration(capped * unitInterval(&random))
        case .equal: return Self.duration(capped / 2 + capped / 2 * unitInterval(&random))
        }
    }

    /// Seconds as a whole number of nanoseconds (so 0.1 s is exactly 100 ms), within `Int64`'s range.
    static func duration(_ seconds: Double) -> Duration {
        let nanos = (seconds * 1e9).rounded()
        guard nanos.isFinite else { return nanos > 0 ? .nanoseconds(Int64.max) : .zero }
        return .nanoseconds(nanos >= 9.2e18 ? Int64.max : nanos <= 0 ? 0 : Int64(nanos))
    }

    static func fibonacci(_ n: Int) -> Double {
        var (a, b) = (1.0, 1.0)
        if n <= 2 { return 1 }
        for _ in 3...min(n, 1500) { (a, b) = (b, a + b) }
        return b
    }
}

/// A uniform value in [0, 1) from one draw of `random` (53 bits), so tests can predict it exactly.
public func unitInterval(_ random: inout some RandomNumberGenerator) -> Double {
    Double(random.next() >> 11) * 0x1p-53
}

/// `base^exponent` by squaring (at most 63 steps), stopping at +∞ instead of trapping.
func saturatingPower(_ base: Double, _ exponent: Int) -> Double {
    if exponent <= 0 { return 1 }
    var result = 1.0
    var b = base
    var e = exponent
    while e > 0 {
        if e & 1 == 1 { result *= b }
        b *= b
        e >>= 1
        if result.isInfinite { return .infinity }
    }
    return result
}

extension Duration {
    /// Seconds as a Double.
    public var seconds: Double {
        let (s, atto) = secondsAndAttoseconds
        return Double(s) + Double(atto) * 1e-18
    }
}
