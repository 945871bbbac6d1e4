/// What a response says about when to retry: `Retry-After` (RFC 9110 §10.2.3: delta-seconds or HTTP-date) or
/// `X-RateLimit-Reset` (epoch seconds or delta seconds).
///
/// Rules, chosen so hostile values never crash or overflow:
/// - `Retry-After` wins over `X-RateLimit-Reset`; a header that says nothing usable falls through to the next.
/// - delta-seconds: digits only (surrounding spaces allowed); fractional, negative, signed or empty → no hint.
/// - HTTP-date in any of the three RFC 9110 formats; a date in the past → wait zero.
/// - `X-RateLimit-Reset`: a number ≥ 1,000,000,000 is an epoch timestamp (the earliest plausible one is
///   2001-09-09; no server means a 31-year delay), smaller numbers are delta seconds; decimals allowed.
/// - Anything that resolves to more than a year from now (`9999999999` as delta seconds, values past Int64) is
///   absurd → no hint (the backoff applies). A sane hint above `retry_after.max` is the caller's business.
public enum RetryHint: Sendable, Equatable {
    case none
    case wait(Duration)

    static let absurdSeconds: Double = 365 * 24 * 3600
    static let epochThreshold: Double = 1_000_000_000

    /// `nowWall`: wall-clock seconds since the Unix epoch.
    public static func parse(retryAfter: String?, rateLimitReset: String?, nowWall: Double) -> RetryHint {
        if let retryAfter, case .wait(let d) = parseRetryAfter(retryAfter, nowWall: nowWall) { return .wait(d) }
        if let rateLimitReset, case .wait(let d) = parseRateLimitReset(rateLimitReset, nowWall: nowWall) { return .wait(d) }
        return .none
    }

    public static func parseRetryAfter(_ value: String, nowWall: Double) -> RetryHint {
        let text = value.trimmingCharacters(in: " \t")
        guard !text.isEmpty else { return .none }
        if text.allSatisfy(\.isASCIIDigit) {
            guard text.count <= 12, let seconds = Double(text) else { return .none }
            return bounded(seconds)
        }
        guard let epoch = HTTPDate.parse(text) else { return .none }
        return bounded(max(0, epoch - nowWall))
    }

    public static func parseRateLimitReset(_ value: String, nowWall: Double) -> RetryHint {
        let text = value.trimmingCharacters(in: " \t")
        guard !text.isEmpty, text.count <= 24, DurationParser.isPlainDecimal(text), let number = Double(text),
            number.isFinite
        else { return .none }
        if number >= epochThreshold { return bounded(max(0, number - nowWall)) }
        return bounded(number)
    }

    private static func bounded(_ seconds: Double) -> RetryHint {
        guard seconds.isFinite, seconds >= 0, seconds <= absurdSeconds else { return .none }
        return .wait(.nanoseconds(Int64((seconds * 1e9).rounded())))
    }
}

/// RFC 9110 §5.6.7 HTTP-date parsing (IMF-fixdate, obsolete RFC 850, asctime) to epoch seconds.
public enum HTTPDate {
    static let months = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
    static let shortDays = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
    static let longDays = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]

    public static func parse(_ text: String) -> Double? {
        let parts = text.split(separator: " ", omittingEmptySubsequences: true).map { String($0).lowercased() }
        // IMF-fixdate: "Sun, 06 Nov 1994 08:49:37 GMT"
        if parts.count == 6, parts[0].hasSuffix(","), shortDays.contains(String(parts[0].dropLast())), parts[5] == "gmt" {
            guard let day = Int(parts[1]), parts[1].count == 2, let month = months.firstIndex(of: parts[2]),
                parts[3].count == 4, let year = Int(parts[3]) else { return nil }
            return assemble(year: year, month: month + 1, day: day, time: parts[4])
        }
        // RFC 850: "Sunday, 06-Nov-94 08:49:37 GMT"
        if parts.count == 4, parts[0].hasSuffix(","), longDays.contains(String(parts[0].dropLast())), parts[3] == "gmt" {
            let date = parts[1].split(separator: "-").map(String.init)
            guard date.count == 3, date[0].count == 2, let day = Int(date[0]),
                let month = months.firstIndex(of: date[1]), date[2].count == 2, let yy = Int(date[2]) else { return nil }
            // RFC 9110: a two-digit year more than 50 years in the future means the past century.
            let year = yy < 70 ? 2000 + yy : 1900 + yy
            return assemble(year: year, month: month + 1, day: day, time: parts[2])
        }
        // asctime: "Sun Nov  6 08:49:37 1994"
        if parts.count == 5, shortDays.contains(parts[0]), let month = months.firstIndex(of: parts[1]) {
            guard let day = Int(parts[2]), parts[2].count <= 2, parts[4].count == 4, let year = Int(parts[4]) else {
                return nil
            }
            return assemble(year: year, month: month + 1, day: day, time: parts[3])
        }
        return nil
    }

    private static func assemble(year: Int, month: Int, day: Int, time: String) -> Double? {
        let hms = time.split(separator: ":").map(String.init)
        guard hms.count == 3, hms.allSatisfy({ $0.count == 2 && $0.allSatisfy(\.isASCIIDigit) }),
            let h = Int(hms[0]), let m = Int(hms[1]), let s = Int(hms[2]),
            h < 24, m < 60, s <= 60, (1...31).contains(day), (1...12).contains(month), (1600...9999).contains(year)
        else { return nil }
        let days = daysFromCivil(year: year, month: month, day: day)
        return Double(days) * 86400 + Double(h * 3600 + m * 60 + s)
    }

    /// Days since 1970-01-01 (Howard Hinnant's algorithm).
    static func daysFromCivil(year: Int, month: Int, day: Int) -> Int {
        let y = month <= 2 ? year - 1 : year
        let era = (y >= 0 ? y : y - 399) / 400
        let yoe = y - era * 400
        let mp = (month + 9) % 12
        let doy = (153 * mp + 2) / 5 + day - 1
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy
        return era * 146097 + doe - 719468
    }
}
