/// Parses config durations: a non-negative decimal number with a unit (`250ms`, `2s`, `1.5s`, `5m`, `1h`, `100us`,
/// `0s`). A bare number is rejected: `5` could mean seconds or milliseconds, and guessing wrong is an outage.
public enum DurationParser {
    /// Units longest-suffix first, so `ms` is not read as `m` + garbage.
    private static let units: [(suffix: String, seconds: Double)] = [
        ("ms", 1e-3), ("us", 1e-6), ("µs", 1e-6), ("ns", 1e-9), ("s", 1), ("m", 60), ("h", 3600),
    ]

    /// The longest duration read, in seconds (about 31 years): bounded so the nanosecond conversion cannot overflow
    /// `Int64`.
    public static let maxSeconds = 1e9

    /// The duration, or nil for a missing unit, a negative or malformed number, or `maxSeconds` or more.
    public static func parse(_ text: String) -> Duration? {
        guard let seconds = seconds(text), seconds < maxSeconds else { return nil }
        return .nanoseconds(Int64((seconds * 1e9).rounded()))
    }

    /// Whether `text` is a well-formed duration of `maxSeconds` or more (said as such, not as malformed).
    public static func isTooLong(_ text: String) -> Bool {
        guard let seconds = seconds(text) else { return false }
        return seconds >= maxSeconds
    }

    /// The seconds a well-formed duration says, however many.
    private static func seconds(_ text: String) -> Double? {
        let trimmed = text.trimmingCharacters(in: " \t")
        for unit in units where trimmed.hasSuffix(unit.suffix) {
            let number = String(trimmed.dropLast(unit.suffix.count))
            guard isPlainDecimal(number), let value = Double(number), value.isFinite else { return nil }
            return value * unit.seconds
        }
        return nil
    }

    /// Digits with at most one `.` (`1`, `1.5`, `.5`, `5.`): no sign, exponent, hex or spaces, which `Double(_:)`
    /// would otherwise accept.
    static func isPlainDecimal(_ text: String) -> Bool {
        guard !text.isEmpty, text != "." else { return false }
        var dots = 0
        for ch in text {
            if ch == "." { dots += 1 } else if !ch.isASCIIDigit { return false }
        }
        return dots <= 1
    }
}
