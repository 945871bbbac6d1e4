import BackstopCore
import Testing

/// A wall clock a little before "Sun, 06 Nov 1994 08:49:37 GMT" (784111777), for HTTP-date hints.
private let rfcExampleEpoch = 784_111_777.0
/// A realistic "now" for X-RateLimit-Reset epochs (2023-11-14T22:13:20Z).
private let now2023 = 1_700_000_000.0

@Suite("Retry hint: Retry-After")
struct RetryHintRetryAfterTests {
    @Test(arguments: [
        ("1", Duration.seconds(1)),
        ("  5  ", .seconds(5)),
        ("\t42 ", .seconds(42)),
        ("0", .zero),
        ("120", .seconds(120)),
        ("1000", .seconds(1000)),
        ("000000000030", .seconds(30)),
        ("31536000", .seconds(31_536_000)),
    ])
    func deltaSeconds(value: String, expected: Duration) {
        #expect(RetryHint.parseRetryAfter(value, nowWall: now2023) == .wait(expected))
    }

    @Test(arguments: [
        "-1", "1.5", "+3", "", " ", "\t", "abc", "5s", "0x10", "1e3", "12 34", "1,5", "Mon", "inf", "nan", "∞",
        "1\u{0301}", "١٢", "５",
    ])
    func malformedDeltaIsNoHint(value: String) {
        #expect(RetryHint.parseRetryAfter(value, nowWall: now2023) == .none)
    }

    @Test(arguments: [
        "31536001",  // a year and a second
        "9999999999",
        "999999999999",  // 12 digits, parsed and then refused
        "0000000000030",  // 13 characters: refused before parsing
        "99999999999999999999999",
        String(repeating: "9", count: 400),  // would be +inf as a Double
    ])
    func absurdDeltaIsNoHint(value: String) {
        #expect(RetryHint.parseRetryAfter(value, nowWall: now2023) == .none)
    }

    @Test(arguments: [
        "Sun, 06 Nov 1994 08:49:37 GMT",  // IMF-fixdate
        "Sunday, 06-Nov-94 08:49:37 GMT",  // RFC 850
        "Sun Nov  6 08:49:37 1994",  // asctime
        "Sun Nov 6 08:49:37 1994",  // asctime with a single space
        "sun, 06 nov 1994 08:49:37 gmt",  // case-insensitive
        "  Sun, 06 Nov 1994 08:49:37 GMT\t",
    ])
    func httpDateInTheFutureGivesTheExactDelay(value: String) {
        #expect(RetryHint.parseRetryAfter(value, nowWall: rfcExampleEpoch - 90) == .wait(.seconds(90)))
        #expect(RetryHint.parseRetryAfter(value, nowWall: rfcExampleEpoch - 0.25) == .wait(.milliseconds(250)))
    }

    @Test(arguments: [
        "Sun, 06 Nov 1994 08:49:37 GMT", "Sunday, 06-Nov-94 08:49:37 GMT", "Sun Nov  6 08:49:37 1994",
    ])
    func httpDateNowOrInThePastIsZero(value: String) {
        #expect(RetryHint.parseRetryAfter(value, nowWall: rfcExampleEpoch) == .wait(.zero))
        #expect(RetryHint.parseRetryAfter(value, nowWall: rfcExampleEpoch + 1000) == .wait(.zero))
        #expect(RetryHint.parseRetryAfter(value, nowWall: now2023) == .wait(.zero))
    }

    @Test func httpDateMoreThanAYearAheadIsNoHint() {
        #expect(RetryHint.parseRetryAfter("Fri, 31 Dec 9999 23:59:59 GMT", nowWall: now2023) == .none)
        // Exactly a year ahead is still a hint; a second more is not.
        let yearAhead = rfcExampleEpoch - 365 * 86400
        #expect(RetryHint.parseRetryAfter("Sun, 06 Nov 1994 08:49:37 GMT", nowWall: yearAhead)
            == .wait(.seconds(365 * 86400)))
        #expect(RetryHint.parseRetryAfter("Sun, 06 Nov 1994 08:49:38 GMT", nowWall: yearAhead) == .none)
    }

    @Test(arguments: [
        "Sun, 06 Foo 1994 08:49:37 GMT",  // bad month
        "Sun, 06 Nov 1994 25:00:00 GMT",  // bad hour
        "Sun, 06 Nov 1994 24:00:00 GMT",
        "Sun, 06 Nov 1994 08:60:00 GMT",  // bad minute
        "Sun, 06 Nov 1994 08:49:61 GMT",  // bad second (60 is a leap second)
        "Sun, 32 Nov 1994 08:49:37 GMT",  // bad day
        "Sun, 00 Nov 1994 08:49:37 GMT",
        "Sun, 6 Nov 1994 08:49:37 GMT",  // IMF-fixdate needs a two-digit day
        "Sun, 06 Nov 94 08:49:37 GMT",  // and a four-digit year
        "Sun, 06 Nov 1994 8:49:37 GMT",  // and two-digit time fields
        "Sun, 06 Nov 1994 08:49 GMT",
        "Sun, 06 Nov 1994 08:49:37:00 GMT",
        "Sun, 06 Nov 1994 08:4a:37 GMT",
        "Sun, 06 Nov 1994 08:49:37 UTC",  // only GMT
        "Sun, 06 Nov 1994 08:49:37 +0000",
        "Sun, 06 Nov 1994 08:49:37",
        "Sun, 06 Nov 1994",
        "Xyz, 06 Nov 1994 08:49:37 GMT",  // bad weekday name
        "Sun 06 Nov 1994 08:49:37 GMT",  // missing comma
        "Sunday, 06-Nov-1994 08:49:37 GMT",  // RFC 850 needs a two-digit year
        "Sunday, 6-Nov-94 08:49:37 GMT",
        "Sunday, 06-Foo-94 08:49:37 GMT",
        "Sunday, 06-Nov-94 08:49:37 UTC",
        "Sun, 06-Nov-94 08:49:37 GMT",  // RFC 850 needs the long weekday
        "Sun Nov 123 08:49:37 1994",  // asctime day too long
        "Sun Nov  6 08:49:37 94",
        "Sun Nov  6 25:49:37 1994",
        "Sun Foo  6 08:49:37 1994",
        "Sun, 06 Nov 1599 08:49:37 GMT",  // before 1600
        "Sun, 06 Nov 0000 08:49:37 GMT",
        "Sun, -6 Nov 1994 08:49:37 GMT",
        "Sun, 06 Nov 1994 -8:49:37 GMT",
    ])
    func malformedDateIsNoHint(value: String) {
        #expect(HTTPDate.parse(value) == nil)
        #expect(RetryHint.parseRetryAfter(value, nowWall: rfcExampleEpoch - 90) == .none)
    }
}

@Suite("Retry hint: HTTP-date")
struct RetryHTTPDateTests {
    @Test(arguments: [
        ("Sun, 06 Nov 1994 08:49:37 GMT", 784_111_777.0),
        ("Thu, 01 Jan 1970 00:00:00 GMT", 0),
        ("Sat, 01 Jan 2000 00:00:00 GMT", 946_684_800),
        ("Tue, 29 Feb 2000 00:00:00 GMT", 951_782_400),
        ("Thu, 29 Feb 2024 12:00:00 GMT", 1_709_208_000),
        ("Tue, 19 Jan 2038 03:14:08 GMT", 2_147_483_648),
        ("Sat, 01 Jan 1600 00:00:00 GMT", -11_676_096_000),
        ("Fri, 31 Dec 9999 23:59:59 GMT", 253_402_300_799),
        ("Thursday, 01-Jan-70 00:00:00 GMT", 0),
        ("Thursday, 01-Jan-37 00:00:00 GMT", 2_114_380_800),  // yy < 70 → 20yy
        ("Sat Jan  1 00:00:00 2000", 946_684_800),
        ("Tue Jan 19 03:14:08 2038", 2_147_483_648),
    ])
    func knownEpochs(text: String, epoch: Double) {
        #expect(HTTPDate.parse(text) == epoch)
    }

    @Test func leapSecondIsAcceptedAsTheNextSecond() {
        #expect(HTTPDate.parse("Sun, 06 Nov 1994 08:49:60 GMT") == 784_111_800)
    }

    /// The parser checks each field's range but not the calendar: an impossible day of the month rolls over into
    /// the next month (RFC 9110 §5.6.7 asks recipients to be robust), and the weekday name is not checked.
    @Test func impossibleDaysRollOverAndWeekdaysAreNotChecked() {
        #expect(HTTPDate.parse("Wed, 30 Feb 1994 00:00:00 GMT") == 762_566_400)  // = 02 Mar 1994
        #expect(HTTPDate.parse("Wed, 30 Feb 1994 00:00:00 GMT") == HTTPDate.parse("Wed, 02 Mar 1994 00:00:00 GMT"))
        #expect(HTTPDate.parse("Thu, 29 Feb 1900 00:00:00 GMT") == -2_203_891_200)  // 1900 is no leap year
        #expect(HTTPDate.parse("Thu, 31 Apr 2037 00:00:00 GMT") == HTTPDate.parse("Fri, 01 May 2037 00:00:00 GMT"))
        #expect(HTTPDate.parse("Mon, 06 Nov 1994 08:49:37 GMT") == 784_111_777)
    }
}

@Suite("Retry hint: X-RateLimit-Reset")
struct RetryHintRateLimitResetTests {
    @Test(arguments: [
        ("30", Duration.seconds(30)),
        (" 30\t", .seconds(30)),
        ("0", .zero),
        ("1.5", .milliseconds(1500)),
        ("0.25", .milliseconds(250)),
        ("31536000", .seconds(31_536_000)),
        ("000000000000000000000030", .seconds(30)),  // 24 characters
    ])
    func deltaSeconds(value: String, expected: Duration) {
        #expect(RetryHint.parseRateLimitReset(value, nowWall: now2023) == .wait(expected))
    }

    @Test func epochSecondsAreRelativeToTheWallClock() {
        #expect(RetryHint.parseRateLimitReset("1700000030", nowWall: now2023) == .wait(.seconds(30)))
        #expect(RetryHint.parseRateLimitReset("\(Int(now2023) + 30)", nowWall: now2023) == .wait(.seconds(30)))
        #expect(RetryHint.parseRateLimitReset("1700000030.5", nowWall: now2023) == .wait(.milliseconds(30_500)))
        #expect(RetryHint.parseRateLimitReset("1700000030", nowWall: now2023 + 0.75) == .wait(.milliseconds(29_250)))
        #expect(RetryHint.parseRateLimitReset("1700000000", nowWall: now2023) == .wait(.zero))
    }

    @Test func pastEpochIsZero() {
        #expect(RetryHint.parseRateLimitReset("1699999970", nowWall: now2023) == .wait(.zero))
        // The threshold itself is an epoch (2001-09-09), long past.
        #expect(RetryHint.parseRateLimitReset("1000000000", nowWall: now2023) == .wait(.zero))
    }

    @Test(arguments: [
        "9999999999",  // epoch in 2286
        "999999999",  // just below the epoch threshold: delta seconds, 31 years
        "31536001",
        "99999999999999999999999",
        "0000000000000000000000030",  // 25 characters
    ])
    func absurdIsNoHint(value: String) {
        #expect(RetryHint.parseRateLimitReset(value, nowWall: now2023) == .none)
    }

    @Test(arguments: ["", " ", "-5", "+5", "abc", "1e3", "1.2.3", ".", "30s", "nan", "inf", "0x1E", "3 0", "1,5"])
    func malformedIsNoHint(value: String) {
        #expect(RetryHint.parseRateLimitReset(value, nowWall: now2023) == .none)
    }
}

@Suite("Retry hint: precedence")
struct RetryHintPrecedenceTests {
    @Test func retryAfterWinsOverRateLimitReset() {
        #expect(RetryHint.parse(retryAfter: "5", rateLimitReset: "30", nowWall: now2023) == .wait(.seconds(5)))
        #expect(RetryHint.parse(retryAfter: "0", rateLimitReset: "30", nowWall: now2023) == .wait(.zero))
        // A past date is a usable hint (zero), so it still wins.
        #expect(RetryHint.parse(retryAfter: "Sun, 06 Nov 1994 08:49:37 GMT", rateLimitReset: "30", nowWall: now2023)
            == .wait(.zero))
    }

    @Test(arguments: ["abc", "", "-1", "1.5", "9999999999", "Sun, 06 Nov 1994 25:00:00 GMT"])
    func unusableRetryAfterFallsThroughToRateLimitReset(retryAfter: String) {
        #expect(RetryHint.parse(retryAfter: retryAfter, rateLimitReset: "30", nowWall: now2023) == .wait(.seconds(30)))
        #expect(RetryHint.parse(retryAfter: retryAfter, rateLimitReset: "1700000012", nowWall: now2023)
            == .wait(.seconds(12)))
        #expect(RetryHint.parse(retryAfter: retryAfter, rateLimitReset: nil, nowWall: now2023) == .none)
        #expect(RetryHint.parse(retryAfter: retryAfter, rateLimitReset: "9999999999", nowWall: now2023) == .none)
    }

    @Test func missingHeaders() {
        #expect(RetryHint.parse(retryAfter: nil, rateLimitReset: nil, nowWall: now2023) == .none)
        #expect(RetryHint.parse(retryAfter: nil, rateLimitReset: "30", nowWall: now2023) == .wait(.seconds(30)))
        #expect(RetryHint.parse(retryAfter: "7", rateLimitReset: nil, nowWall: now2023) == .wait(.seconds(7)))
        #expect(RetryHint.parse(retryAfter: "abc", rateLimitReset: "abc", nowWall: now2023) == .none)
    }

    @Test func rateLimitResetStyleValuesInRetryAfterAreNotDecimals() {
        // Retry-After is delta-seconds only: a decimal there is garbage, even if X-RateLimit-Reset would take it.
        #expect(RetryHint.parse(retryAfter: "1.5", rateLimitReset: nil, nowWall: now2023) == .none)
        #expect(RetryHint.parse(retryAfter: nil, rateLimitReset: "1.5", nowWall: now2023) == .wait(.milliseconds(1500)))
    }
}
