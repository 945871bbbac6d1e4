/// A small seeded random number generator (SplitMix64): the daemon's jitter (seeded from the system, `init()`),
/// and chaos scripts, load mixes and randomized tests that replay exactly from a seed. The project's one seeded
/// generator.
public struct SplitMix64: RandomNumberGenerator, Sendable {
    private var state: UInt64

    public init(seed: UInt64) { state = seed }

    /// Seeded once from the system's generator: the daemon's jitter draws (backoff, token refresh, probes).
    /// Their owners keep this rather than a `SystemRandomNumberGenerator`, which has no stored property: an empty
    /// value handed `inout` through a generic has no meaningful address, and ThreadSanitizer's check of that
    /// access crashes the process (swiftlang/swift#35579 skips only types known empty where the access is
    /// compiled). Jitter needs spread, not secrecy: identifiers and assertion IDs (`jti`) draw from the system.
    public init() {
        var system = SystemRandomNumberGenerator()
        state = system.next()
    }

    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// A uniform value in [0, 1) (`unitInterval`).
    public mutating func unit() -> Double { unitInterval(&self) }
}

/// A generator that returns the given words in turn (cycling), so a test knows every draw exactly: with
/// `unitInterval`, `0` draws 0, `half` draws exactly 0.5. The one scripted generator of the project's tests.
public struct ScriptedRandom: RandomNumberGenerator, Sendable {
    public var words: [UInt64]
    /// Draws made so far.
    public private(set) var draws = 0

    public init(_ words: UInt64...) { self.words = words.isEmpty ? [0] : words }
    public init(words: [UInt64]) { self.words = words.isEmpty ? [0] : words }

    public mutating func next() -> UInt64 {
        defer { draws += 1 }
        return words[draws % words.count]
    }

    public static let zero: UInt64 = 0
    public static let quarter: UInt64 = 1 << 62
    public static let half: UInt64 = 1 << 63
    public static let threeQuarters: UInt64 = (1 << 63) | (1 << 62)
    /// The largest word: draws just below 1.
    public static let max: UInt64 = .max
}
