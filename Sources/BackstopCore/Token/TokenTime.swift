// Time and randomness conventions shared by the token types.
//
// Instants are wall-clock `Double` seconds since the Unix epoch (what `Date().timeIntervalSince1970` returns).
// Wall time rather than a monotonic clock because a token's expiry is persisted in the keychain as `expires_at`
// and shared with other processes; a monotonic reading means nothing outside the process that took it.
// Every function that needs the time takes `now` explicitly, so tests drive the clock.
//
// Randomness comes from an injected `RandomNumberGenerator`. A draw is one `next()` call mapped to [0, 1) with
// 53 bits of precision, so a test generator that returns fixed words gives exact, predictable jitter.

/// Internal helpers for the token types' time arithmetic and jitter.
enum TokenTime {
    /// A `Duration` as fractional seconds.
    static func seconds(_ duration: Duration) -> Double {
        let parts = duration.components
        return Double(parts.seconds) + Double(parts.attoseconds) * 1e-18
    }

    /// One draw in [0, 1): the top 53 bits of one generator word. `0` maps to 0, `1 << 63` to exactly 0.5.
    static func unitFraction(using rng: inout some RandomNumberGenerator) -> Double {
        Double(rng.next() >> 11) * 0x1p-53
    }
}
