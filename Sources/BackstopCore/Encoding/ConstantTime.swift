/// Comparison of secrets whose duration does not depend on where they differ, so a client timing its answers
/// cannot find a password byte by byte.
public enum ConstantTime {
    /// Whether `a` and `b` are equal. Takes time proportional to `expected.count` whatever `given` is; only the
    /// fact that the lengths differ (not where the bytes do) can be learnt from timing.
    public static func equals(_ given: [UInt8], _ expected: [UInt8]) -> Bool {
        var difference = UInt8(given.count == expected.count ? 0 : 1)
        for i in 0..<expected.count {
            // Past the end of `given`, compare against a byte of `expected` itself, keeping the loop uniform.
            let g = i < given.count ? given[i] : ~expected[i]
            difference |= g ^ expected[i]
        }
        return difference == 0
    }
}
