/// Bytes from the system's cryptographic generator (`getrandom`), for what must be unpredictable: delivery
/// identifiers (sent as `Idempotency-Key`) and client assertion IDs (`jti`). Jitter draws from `SplitMix64`.
///
/// Non-generic on purpose: an empty `SystemRandomNumberGenerator` handed `inout` through a generic has no
/// meaningful address, and ThreadSanitizer's check of that access crashes the process (swiftlang/swift#35579);
/// here the generator is only ever used as its concrete type.
public enum SystemRandom {
    /// `count` bytes, each uniform.
    public static func bytes(_ count: Int) -> [UInt8] {
        var generator = SystemRandomNumberGenerator()
        var out: [UInt8] = []
        out.reserveCapacity(count + 7)
        while out.count < count { withUnsafeBytes(of: generator.next()) { out += $0 } }
        out.removeLast(out.count - count)
        return out
    }
}
