/// Times in UTC as ISO 8601, the one way Backstop writes them (log lines, `keychain list`, `tokens status`, the
/// status page, log metadata): `2026-11-25T18:59:55Z`, and `2026-11-25T18:59:55.123Z` with milliseconds.
/// Arithmetic only: no Foundation formatter, no time zone database.
public enum ISO8601Time {
    /// `epochSeconds` (seconds since the Unix epoch) to whole seconds, rounded down.
    public static func format(epochSeconds: Double) -> String {
        format(seconds: Int64(epochSeconds.rounded(.down)))
    }

    /// `seconds` since the Unix epoch, with `milliseconds` (0…999) when given.
    public static func format(seconds: Int64, milliseconds: Int? = nil) -> String {
        let remainder = Int(seconds % 86_400)
        let secondOfDay = remainder < 0 ? remainder + 86_400 : remainder
        let date = CivilDate.date(days: Int((seconds - Int64(secondOfDay)) / 86_400))
        var out = pad(date.year, 4) + "-" + pad(date.month, 2) + "-" + pad(date.day, 2) + "T"
        out += pad(secondOfDay / 3600, 2) + ":" + pad(secondOfDay / 60 % 60, 2) + ":" + pad(secondOfDay % 60, 2)
        if let milliseconds { out += "." + pad(milliseconds, 3) }
        return out + "Z"
    }

    private static func pad(_ value: Int, _ width: Int) -> String {
        let digits = String(value)
        return digits.count >= width ? digits : String(repeating: "0", count: width - digits.count) + digits
    }
}
