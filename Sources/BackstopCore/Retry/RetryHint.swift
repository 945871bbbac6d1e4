/// What a response says about when to retry: `Retry-After` (RFC 9110 §10.2.3: delta-seconds or HTTP-date) or
/// `X-RateLimit-Reset` (epoch seconds or delta seconds).
///
/// Rules, chosen so hostile values never crash or overflow (docs/reference/behaviour.md: absurd, negative or malformed values count
/// as "no hint" or as zero; the policy compares every sane wait with `retry_after.max` and gives up above it):
/// - `Retry-After` wins over `X-RateLimit-Reset`; a header that says nothing usable falls through to the next.
/// - Spaces and tabs around a value are ignored.
/// - `Retry-After` delta-seconds: ASCII digits only. Fractional (`5.5`), signed (`-1`, `+1`), empty or other
///   text → **no hint** (the backoff applies), as urllib3 does.
/// - `Retry-After` HTTP-date: any of the three RFC 9110 formats (see `HTTPDate`); the wait is the date minus
///   `nowWall`, and a date now or in the past → **zero** (retry at once, still subject to the budget).
/// - `X-RateLimit-Reset`: a plain decimal (`30`, `1.5`, `1700000030`); a value ≥ 1,000,000,000 is an epoch
///   timestamp (the smallest such instant is 2001-09-09, so no real server means a 31-year delay with it) and
///   the wait is value − `nowWall`, past → **zero**; a smaller value is delta seconds. Signs, exponents and
///   other text → **no hint**.
/// - Absurd values, a wait longer than `longestWait` (one year: `9999999999` seconds, a year-2100 date, digit
///   strings past Int64 such as `99999999999999999999999`) → **no hint**, so the backoff applies, as the spec
///   asks. Digits are summed saturating, so no value overflows on the way.
public enum RetryHint: Sendable, Equatable {
    case none
    case wait(Duration)

    /// The longest wait a hint may ask for; anything longer is absurd and counts as no hint.
    public static let longestWait: Duration = .seconds(longestWaitSeconds)
    static let longestWaitSeconds: Int64 = 365 * 86400
    /// `X-RateLimit-Reset` values from here up are epoch seconds, below it delta seconds.
    public static let epochThreshold: Double = 1_000_000_000

    /// Both headers, `Retry-After` first. `nowWall`: wall-clock seconds since the Unix epoch.
    public static func parse(retryAfter: String?, rateLimitReset: String?, nowWall: Double) -> RetryHint {
        if let retryAfter, case .wait(let d) = parseRetryAfter(retryAfter, nowWall: nowWall) { return .wait(d) }
        if let rateLimitReset, case .wait(let d) = parseRateLimitReset(rateLimitReset, nowWall: nowWall) {
            return .wait(d)
        }
        return .none
    }

    public static func parseRetryAfter(_ value: String, nowWall: Double) -> RetryHint {
        let text = HTTPSyntax.trimmingOWS(value)
        guard !text.isEmpty else { return .none }
        if let seconds = saturatingInteger(text) {
            return seconds > longestWaitSeconds ? .none : .wait(.seconds(seconds))
        }
        guard nowWall.isFinite, let epoch = HTTPDate.parse(String(text), nowWall: nowWall) else { return .none }
        return wait(seconds: max(0, epoch - nowWall))
    }

    public static func parseRateLimitReset(_ value: String, nowWall: Double) -> RetryHint {
        let text = HTTPSyntax.trimmingOWS(value)
        let dot = text.firstIndex(of: ".") ?? text.endIndex
        guard let whole = saturatingInteger(text[..<dot]) else { return .none }
        var fraction = 0.0
        if dot != text.endIndex {
            // Nanoseconds are all a Duration keeps; further digits are checked, not used.
            let digits = text[text.index(after: dot)...]
            guard !digits.isEmpty, digits.utf8.allSatisfy(isDigit) else { return .none }
            var scale = 0.1
            for byte in digits.utf8.prefix(9) {
                fraction += Double(byte - UInt8(ascii: "0")) * scale
                scale /= 10
            }
        }
        let number = Double(whole) + fraction
        guard number >= epochThreshold else { return wait(seconds: number) }
        guard nowWall.isFinite else { return .none }
        return wait(seconds: max(0, number - nowWall))
    }

    /// A non-negative, finite number of seconds up to `longestWait` as a hint, rounded to the nanosecond.
    private static func wait(seconds: Double) -> RetryHint {
        guard seconds.isFinite, seconds >= 0 else { return .none }
        if seconds > Double(longestWaitSeconds) { return .none }
        return .wait(.nanoseconds(Int64((seconds * 1e9).rounded())))
    }

    /// The value of one or more ASCII digits, saturating at Int64.max instead of overflowing; nil for anything else.
    static func saturatingInteger(_ text: Substring) -> Int64? {
        guard !text.isEmpty else { return nil }
        var value: Int64 = 0
        for byte in text.utf8 {
            guard isDigit(byte) else { return nil }
            let (times10, o1) = value.multipliedReportingOverflow(by: 10)
            let (sum, o2) = times10.addingReportingOverflow(Int64(byte - UInt8(ascii: "0")))
            value = o1 || o2 ? .max : sum
        }
        return value
    }

    private static func isDigit(_ byte: UInt8) -> Bool { byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9") }

}
