/// RFC 9110 §5.6.7 HTTP-date parsing to seconds since the Unix epoch, without Foundation.
///
/// All three formats are accepted, case-insensitively, with the leniency real servers need (RFC 9110 asks
/// recipients to accept all three and urllib3's tests send the non-canonical forms below):
/// - IMF-fixdate `Sun, 06 Nov 1994 08:49:37 GMT`; also a one-digit day, a missing weekday, a two-digit year,
///   and the zones `GMT`, `UT`, `UTC` or a numeric `±hhmm` offset (applied).
/// - obsolete RFC 850 `Sunday, 06-Nov-94 08:49:37 GMT` (same zones and weekday leniency): the two-digit year is
///   resolved against the wall clock (see `fullYear`); without a clock, `yy < 70` is 20yy.
/// - asctime `Sun Nov  6 08:49:37 1994` (always GMT).
///
/// Strict where leniency would guess: time fields are two digits each, the day must exist in its month (no
/// Feb 30 rolled into March), years are 1600…9999, the weekday name must be a real one but need not match the
/// date (`Mon, 1 Jan 2100` is a Friday; the date is what counts). Second 60 (a leap second) reads as the next
/// second. Anything else is nil.
public enum HTTPDate {
    static let months = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
    static let shortDays: Set<String> = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
    static let longDays: Set<String> = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]
    /// Longer than any date form with generous spacing: refuse before splitting megabytes of garbage.
    static let maxLength = 64

    /// Epoch seconds for `text`, or nil when it is not an HTTP-date. `nowWall` (epoch seconds) resolves
    /// two-digit years; without it a fixed pivot is used.
    public static func parse(_ text: String, nowWall: Double? = nil) -> Double? {
        guard text.utf8.count <= maxLength else { return nil }
        var parts = text.split(whereSeparator: { $0 == " " || $0 == "\t" }).map { $0.lowercased() }
        guard !parts.isEmpty else { return nil }

        // asctime: "sun nov  6 08:49:37 1994"
        if parts.count == 5, shortDays.contains(parts[0]), let month = months.firstIndex(of: parts[1]) {
            guard let day = number(parts[2], digits: 1...2), let year = number(parts[4], digits: 4...4) else {
                return nil
            }
            return assemble(year: year, month: month + 1, day: day, time: parts[3], offsetSeconds: 0)
        }

        // The other two start with an optional "weekday,"; either the short or the long name is taken for both.
        if parts[0].hasSuffix(",") {
            let name = String(parts[0].dropLast())
            guard shortDays.contains(name) || longDays.contains(name) else { return nil }
            parts.removeFirst()
        }

        // RFC 850: "06-nov-94 08:49:37 gmt"
        if parts.count == 3, parts[0].contains("-") {
            guard let offset = zoneOffset(parts[2]) else { return nil }
            let date = parts[0].split(separator: "-", omittingEmptySubsequences: false)
            guard date.count == 3, let day = number(date[0], digits: 1...2),
                let month = months.firstIndex(of: String(date[1])), let yy = number(date[2], digits: 2...2)
            else { return nil }
            return assemble(
                year: fullYear(twoDigits: yy, nowWall: nowWall), month: month + 1, day: day, time: parts[1],
                offsetSeconds: offset)
        }

        // IMF-fixdate: "06 nov 1994 08:49:37 gmt"
        guard parts.count == 5, let day = number(parts[0], digits: 1...2),
            let month = months.firstIndex(of: parts[1]), let offset = zoneOffset(parts[4])
        else { return nil }
        let year: Int
        if let four = number(parts[2], digits: 4...4) {
            year = four
        } else if let two = number(parts[2], digits: 2...2) {
            year = fullYear(twoDigits: two, nowWall: nowWall)
        } else {
            return nil
        }
        return assemble(year: year, month: month + 1, day: day, time: parts[3], offsetSeconds: offset)
    }

    /// Seconds east of GMT for an accepted zone, nil otherwise.
    private static func zoneOffset(_ zone: String) -> Int? {
        if zone == "gmt" || zone == "ut" || zone == "utc" { return 0 }
        let bytes = Array(zone.utf8)
        guard bytes.count == 5, bytes[0] == UInt8(ascii: "+") || bytes[0] == UInt8(ascii: "-"),
            let hhmm = number(zone.dropFirst(), digits: 4...4), hhmm / 100 < 24, hhmm % 100 < 60
        else { return nil }
        let seconds = (hhmm / 100) * 3600 + (hhmm % 100) * 60
        return bytes[0] == UInt8(ascii: "-") ? -seconds : seconds
    }

    /// The year with these last two digits in (current − 50, current + 50]: RFC 9110 makes a year "more than 50
    /// years in the future" the most recent past one, and the window keeps a year 10 years ahead in the future
    /// even across a century (in 2095, `05` is 2105).
    static func fullYear(twoDigits yy: Int, nowWall: Double?) -> Int {
        guard let nowWall, nowWall.isFinite, abs(nowWall) < 1e15 else { return yy < 70 ? 2000 + yy : 1900 + yy }
        let currentYear = CivilDate.date(days: Int((nowWall / 86400).rounded(.down))).year
        let century = currentYear - ((currentYear % 100) + 100) % 100
        var year = century + yy
        if year > currentYear + 50 { year -= 100 } else if year <= currentYear - 50 { year += 100 }
        return year
    }

    /// The value of a run of ASCII digits whose length is in `digits`, else nil (no signs, no spaces).
    private static func number(_ text: some StringProtocol, digits: ClosedRange<Int>) -> Int? {
        guard digits.contains(text.utf8.count) else { return nil }
        var value = 0
        for byte in text.utf8 {
            guard byte >= UInt8(ascii: "0"), byte <= UInt8(ascii: "9") else { return nil }
            value = value * 10 + Int(byte - UInt8(ascii: "0"))
        }
        return value
    }

    private static func assemble(year: Int, month: Int, day: Int, time: String, offsetSeconds: Int) -> Double? {
        let hms = time.split(separator: ":", omittingEmptySubsequences: false)
        guard hms.count == 3, let h = number(hms[0], digits: 2...2), let m = number(hms[1], digits: 2...2),
            let s = number(hms[2], digits: 2...2), h < 24, m < 60, s <= 60,
            (1600...9999).contains(year), (1...12).contains(month), (1...daysIn(month: month, year: year)).contains(day)
        else { return nil }
        let days = CivilDate.days(year: year, month: month, day: day)
        return Double(days) * 86400 + Double(h * 3600 + m * 60 + s - offsetSeconds)
    }

    static func daysIn(month: Int, year: Int) -> Int {
        switch month {
        case 2: (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 ? 29 : 28
        case 4, 6, 9, 11: 30
        default: 31
        }
    }
}
