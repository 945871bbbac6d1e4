import BackstopCore
import Testing

/// A generator that returns fixed words in a cycle and counts its draws. Token jitter maps one word `w` to
/// `(w >> 11) / 2^53`, so `0` draws 0, `1 << 63` draws exactly 0.5 and `UInt64.max` draws just under 1.
struct TokenTestRNG: RandomNumberGenerator {
    var words: [UInt64]
    private(set) var draws = 0

    init(_ words: UInt64...) { self.words = words.isEmpty ? [0] : words }

    mutating func next() -> UInt64 {
        defer { draws += 1 }
        return words[draws % words.count]
    }

    static let half: UInt64 = 1 << 63
}

/// SplitMix64, for sweeping many pseudo-random words deterministically.
struct TokenSplitMix: RandomNumberGenerator {
    var state: UInt64
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

func tokenBytes(_ text: String) -> [UInt8] { Array(text.utf8) }

/// `#expect(a == b)` for values produced by `mutating` calls, which `#expect` cannot take directly (the macro
/// captures the receiver immutably).
func expectValue<T: Equatable>(
    _ actual: T, _ expected: T, sourceLocation: Testing.SourceLocation = #_sourceLocation
) {
    #expect(actual == expected, sourceLocation: sourceLocation)
}
