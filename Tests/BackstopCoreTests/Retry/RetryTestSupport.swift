import BackstopCore
import Testing

/// Returns fixed words in a cycle and counts its draws. `unitInterval` maps a word `w` to `(w >> 11) / 2^53`, so
/// `0` draws exactly 0, `1 << 62` exactly 0.25, `1 << 63` exactly 0.5 and `UInt64.max` just under 1.
struct RetryWordsRNG: RandomNumberGenerator {
    var words: [UInt64]
    private(set) var draws = 0

    init(_ words: UInt64...) { self.words = words.isEmpty ? [0] : words }

    mutating func next() -> UInt64 {
        defer { draws += 1 }
        return words[draws % words.count]
    }

    static let zero: UInt64 = 0
    static let quarter: UInt64 = 1 << 62
    static let half: UInt64 = 1 << 63
    static let threeQuarters: UInt64 = (1 << 63) | (1 << 62)
    static let top: UInt64 = .max
}

/// SplitMix64 (Steele et al.), for sweeping many pseudo-random words deterministically.
struct RetrySplitMix64: RandomNumberGenerator {
    var state: UInt64
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// Durations built from binary fractions are exact; others (100 ms · 1.5^k) may be off by a few attoseconds.
func retryApprox(_ actual: Duration, _ expected: Duration, within: Duration = .nanoseconds(1)) -> Bool {
    let diff = actual - expected
    return diff <= within && diff >= .zero - within
}

/// A `Backoff` with the given strategy; jitter none unless asked.
func retryBackoff(
    _ strategy: BackoffStrategy, base: Duration = .seconds(1), max: Duration = .seconds(10), multiplier: Double = 2,
    jitter: JitterMode = .none
) -> Backoff {
    Backoff(BackoffConfig(strategy: strategy, base: base, max: max, multiplier: multiplier, jitter: jitter))
}

/// Delays for retries 1...count, feeding each back as `previous`.
func retrySequence(_ backoff: Backoff, count: Int, random: inout some RandomNumberGenerator) -> [Duration] {
    var previous: Duration?
    var out: [Duration] = []
    for retry in 1...count {
        let d = backoff.delay(retry: retry, previous: previous, random: &random)
        out.append(d)
        previous = d
    }
    return out
}
