import BackstopCore
import Testing

/// "Sun, 06 Nov 1994 08:49:37 GMT", the RFC 9110 example date.
private let rfcExampleEpoch = 784_111_777.0
/// A realistic "now" for X-RateLimit-Reset epochs (2023-11-14T22:13:20Z).
private let now2023 = 1_700_000_000.0
/// urllib3's frozen clock in test_retry.py: 2019-06-03T11:00:00Z.
private let urllib3Now = 1_559_559_600.0
private let longest = RetryHint.longestWait

@Suite("Retry hint: Retry-After")
struct RetryHintRetryAfterTests {
    @Test(arguments: [
        // urllib3 test_parse_retry_after
        ("0", Duration.zero), ("1000", .seconds(1000)), ("\t42 ", .seconds(42)),
        ("1", .seconds(1)), ("  5  ", .seconds(5)), ("120", .seconds(120)),
        ("000000000030", .seconds(30)), ("0000000000000000000000000000030", .seconds(30)),
        ("31536000", .seconds(31_536_000)),  // exactly a year: the longest sane wait
    ])
    func deltaSeconds(value: String, expected: Duration) {
        #expect(RetryHint.parseRetryAfter(value, nowWall: now2023) == .wait(expected))
    }

    @Test(arguments: [
        // urllib3 test_parse_retry_after_invalid, then more of the same kind.
        "-1", "+1", "1.0", "\u{B2}", "5.5", "-0", "- 1", "", " ", "\t", "abc", "5s", "0x10", "1e3", "12 34", "1,5",
        "Mon", "inf", "nan", "∞", "1\u{0301}", "١٢", "５", "5\r", "5\n", "\u{00A0}5",
    ])
    func negativeFractionalOrMalformedIsNoHint(value: String) {
        #expect(RetryHint.parseRetryAfter(value, nowWall: now2023) == .none)
    }

    @Test(arguments: [
        "31536001",  // a year and a second
        "9999999999",
        "9223372036854775807",  // Int64.max
        "9223372036854775808",  // one past
        "99999999999999999999999",
        String(repeating: "9", count: 400),  // +inf as a Double
    ])
    func absurdDeltaIsNoHint(value: String) {
        // docs/reference/behaviour.md: absurd values count as "no hint" (the backoff applies); none overflows on the way.
        #expect(RetryHint.parseRetryAfter(value, nowWall: now2023) == .none)
        #expect(RetryHint.parseRetryAfter(value, nowWall: .nan) == .none)
    }

    @Test func theLongestSaneWaitIsAYear() {
        #expect(longest == .seconds(365 * 86400))
    }

    @Test(arguments: [
        // urllib3 test_respect_retry_after_header_sleep, clock at 2019-06-03T11:00:00Z.
        ("Mon, 3 Jun 2019 12:00:00 UTC", Duration.seconds(3600)),
        ("Mon, 3 Jun 2019 11:00:00 UTC", .zero),
        ("Mon, 03 Jun 2019 11:30:12 GMT", .seconds(1812)),
        ("Monday, 03-Jun-19 11:30:12 GMT", .seconds(1812)),
        ("Mon Jun  3 11:30:12 2019", .seconds(1812)),
        ("Mon, 03 Jun 2019 10:59:59 GMT", .zero),
        ("Fri, 31 Dec 1999 23:59:59 GMT", .zero),
        ("Mon, 03 Jun 2019 13:30:12 +0200", .seconds(1812)),
    ])
    func urllib3DateCases(value: String, expected: Duration) {
        #expect(RetryHint.parseRetryAfter(value, nowWall: urllib3Now) == .wait(expected))
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

    @Test func datesWithinAYearAreTakenAtFaceValueLaterOnesAreNoHint() {
        // 2024-11-13T22:13:20Z is 365 days after now2023: the longest sane wait.
        #expect(RetryHint.parseRetryAfter("Wed, 13 Nov 2024 22:13:20 GMT", nowWall: now2023) == .wait(longest))
        #expect(RetryHint.parseRetryAfter("Wed, 13 Nov 2024 22:13:21 GMT", nowWall: now2023) == .none)
        #expect(RetryHint.parseRetryAfter("Mon, 1 Jan 2100 00:00:00 GMT", nowWall: now2023) == .none)
        #expect(RetryHint.parseRetryAfter("Fri, 31 Dec 9999 23:59:59 GMT", nowWall: now2023) == .none)
    }

    @Test func aDateNeedsAFiniteWallClock() {
        #expect(RetryHint.parseRetryAfter("Sun, 06 Nov 1994 08:49:37 GMT", nowWall: .nan) == .none)
        #expect(RetryHint.parseRetryAfter("Sun, 06 Nov 1994 08:49:37 GMT", nowWall: .infinity) == .none)
        #expect(RetryHint.parseRetryAfter("5", nowWall: .nan) == .wait(.seconds(5)))
    }

    @Test(arguments: [
        "Sun, 06 Foo 1994 08:49:37 GMT",  // bad month
        "Sun, 06 Nov 1994 25:00:00 GMT",  // bad hour
        "Sun, 06 Nov 1994 24:00:00 GMT",
        "Sun, 06 Nov 1994 08:60:00 GMT",  // bad minute
        "Sun, 06 Nov 1994 08:49:61 GMT",  // bad second (60 is a leap second)
        "Sun, 32 Nov 1994 08:49:37 GMT",  // bad day
        "Sun, 00 Nov 1994 08:49:37 GMT",
        "Sun, 006 Nov 1994 08:49:37 GMT",
        "Wed, 30 Feb 1994 00:00:00 GMT",  // days that do not exist
        "Thu, 29 Feb 1900 00:00:00 GMT",  // 1900 is no leap year
        "Thu, 31 Apr 2037 00:00:00 GMT",
        "Sunday, 31-Jun-94 08:49:37 GMT",
        "Sat Feb 29 00:00:00 2023",
        "Sun, 06 Nov 994 08:49:37 GMT",  // a three- or five-digit year
        "Sun, 06 Nov 19940 08:49:37 GMT",
        "Sun, 06 Nov 1994 8:49:37 GMT",  // two-digit time fields
        "Sun, 06 Nov 1994 08:49 GMT",
        "Sun, 06 Nov 1994 08:49:37:00 GMT",
        "Sun, 06 Nov 1994 08:4a:37 GMT",
        "Sun, 06 Nov 1994 08::37 GMT",
        "Sun, 06 Nov 1994 08:49:37 PST",  // unknown zones
        "Sun, 06 Nov 1994 08:49:37 +2400",
        "Sun, 06 Nov 1994 08:49:37 +0060",
        "Sun, 06 Nov 1994 08:49:37 +000",
        "Sun, 06 Nov 1994 08:49:37 0000",
        "Sun, 06 Nov 1994 08:49:37",  // no zone
        "Sun, 06 Nov 1994 08:49:37 GMT GMT",
        "Sun, 06 Nov 1994",
        "Xyz, 06 Nov 1994 08:49:37 GMT",  // bad weekday name
        "Sun 06 Nov 1994 08:49:37 GMT",  // missing comma
        "Sunday, 06-Nov-1994 08:49:37 GMT",  // RFC 850 needs a two-digit year
        "Sunday, 06-Foo-94 08:49:37 GMT",
        "Sunday, 06-Nov-94 08:49:37 CET",
        "Sunday, 06-Nov 08:49:37 GMT",
        "Sunday, 06--94 08:49:37 GMT",
        "Sun Nov 123 08:49:37 1994",  // asctime day too long
        "Sun Nov  6 08:49:37 94",
        "Sun Nov  6 25:49:37 1994",
        "Sun Foo  6 08:49:37 1994",
        "Sun, 06 Nov 1599 08:49:37 GMT",  // before 1600
        "Sun, 06 Nov 0000 08:49:37 GMT",
        "Sun, -6 Nov 1994 08:49:37 GMT",
        "Sun, +6 Nov 1994 08:49:37 GMT",
        "Sun, 06 Nov 1994 -8:49:37 GMT",
        "Sun, 06 Nov 1994 08:49:37 GMT" + String(repeating: " ", count: 40) + "x",
        String(repeating: "Sun, ", count: 10_000),
        ",",
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
        ("Mon, 3 Jun 2019 12:00:00 UTC", 1_559_563_200),  // urllib3's form: one-digit day, UTC
        ("Mon, 3 Jun 2019 12:00:00 UT", 1_559_563_200),
        ("06 Nov 1994 08:49:37 GMT", 784_111_777),  // no weekday (RFC 5322 allows it)
        ("Sunday, 06 Nov 1994 08:49:37 GMT", 784_111_777),  // long weekday in IMF form
        ("Sun, 06 Nov 1994 09:49:37 +0100", 784_111_777),  // numeric offsets are applied
        ("Sun, 06 Nov 1994 03:19:37 -0530", 784_111_777),
        ("Sun, 06 Nov 1994 08:49:37 +0000", 784_111_777),
        ("Sun, 06 Nov 1994 08:49:37 -0000", 784_111_777),
        ("Sun,   06  Nov 1994\t08:49:37 GMT", 784_111_777),  // extra spaces and tabs between fields
        ("Mon, 01 Jan 2100 00:00:00 GMT", 4_102_444_800),  // a Friday: weekday names are not checked
        ("Thursday, 01-Jan-70 00:00:00 GMT", 0),
        ("Thursday, 01-Jan-37 00:00:00 GMT", 2_114_380_800),  // without a clock yy < 70 → 20yy
        ("Sun, 06-Nov-94 08:49:37 GMT", 784_111_777),  // short weekday in RFC 850 form
        ("Sunday, 6-Nov-94 08:49:37 GMT", 784_111_777),
        ("06-Nov-94 08:49:37 GMT", 784_111_777),
        ("Sunday, 06-Nov-94 08:49:37 UTC", 784_111_777),
        ("Sat Jan  1 00:00:00 2000", 946_684_800),
        ("Tue Jan 19 03:14:08 2038", 2_147_483_648),
        ("Thu Feb 29 00:00:00 2024", 1_709_164_800),
    ])
    func knownEpochs(text: String, epoch: Double) {
        #expect(HTTPDate.parse(text) == epoch)
    }

    @Test func leapSecondIsAcceptedAsTheNextSecond() {
        #expect(HTTPDate.parse("Sun, 06 Nov 1994 08:49:60 GMT") == 784_111_800)
    }

    @Test func twoDigitYearsFollowTheFiftyYearRuleAgainstTheWallClock() {
        func rfc850(_ yy: String) -> String { "Thursday, 01-Jan-\(yy) 00:00:00 GMT" }
        func imf(_ yyyy: Int) -> Double? { HTTPDate.parse("Thu, 01 Jan \(yyyy) 00:00:00 GMT") }
        // In 2023: 50 years ahead (2073) is still ahead; 51 (2074) is the past century.
        #expect(HTTPDate.parse(rfc850("73"), nowWall: now2023) == imf(2073))
        #expect(HTTPDate.parse(rfc850("74"), nowWall: now2023) == imf(1974))
        #expect(HTTPDate.parse(rfc850("23"), nowWall: now2023) == imf(2023))
        #expect(HTTPDate.parse(rfc850("00"), nowWall: now2023) == imf(2000))
        #expect(HTTPDate.parse(rfc850("99"), nowWall: now2023) == imf(1999))
        // The current year comes from the clock: one second before 2024 "74" is 1974, at 2024 it is 2074.
        let newYear2024 = 1_704_067_200.0
        #expect(HTTPDate.parse(rfc850("74"), nowWall: newYear2024 - 1) == imf(1974))
        #expect(HTTPDate.parse(rfc850("74"), nowWall: newYear2024) == imf(2074))
        // The window is (now − 50, now + 50]: in 1994 "44" is 2044 (exactly 50 ahead), "45" is 1945.
        #expect(HTTPDate.parse(rfc850("44"), nowWall: rfcExampleEpoch) == imf(2044))
        #expect(HTTPDate.parse(rfc850("45"), nowWall: rfcExampleEpoch) == imf(1945))
        // Across a century: in 2095 "05" is 2105, ten years ahead, not 2005.
        let in2095 = imf(2095)!
        #expect(HTTPDate.parse(rfc850("05"), nowWall: in2095) == imf(2105))
        #expect(HTTPDate.parse(rfc850("46"), nowWall: in2095) == imf(2046))
        // The IMF form with a two-digit year uses the same rule.
        #expect(HTTPDate.parse("Thu, 01 Jan 74 00:00:00 GMT", nowWall: now2023) == imf(1974))
        #expect(HTTPDate.parse("Thu, 01 Jan 30 00:00:00 GMT", nowWall: now2023) == imf(2030))
        // A clock before 1970 works too.
        #expect(HTTPDate.parse(rfc850("69"), nowWall: -86400 * 365) == imf(1969))
    }

    @Test func theRetryAfterParserPassesItsClockToTheDateParser() {
        // In 2080 "80" is 2080 (a minute ahead), where the fixed pivot (1980) would say "past, zero".
        let in2080 = HTTPDate.parse("Mon, 01 Jan 2080 00:00:00 GMT")!
        #expect(HTTPDate.parse("Tuesday, 01-Jan-80 00:01:00 GMT") == HTTPDate.parse("Tue, 01 Jan 1980 00:01:00 GMT"))
        #expect(RetryHint.parseRetryAfter("Monday, 01-Jan-80 00:01:00 GMT", nowWall: in2080) == .wait(.seconds(60)))
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
        ("0.000000001", .nanoseconds(1)),
        ("1.0000000009999", .nanoseconds(1_000_000_000)),  // beyond nanoseconds is ignored, not rounded
        ("31536000", .seconds(31_536_000)),
        ("000000000000000000000030", .seconds(30)),
        ("00000000000000000000000000000000000030", .seconds(30)),
    ])
    func deltaSeconds(value: String, expected: Duration) {
        #expect(RetryHint.parseRateLimitReset(value, nowWall: now2023) == .wait(expected))
    }

    @Test func epochSecondsAreRelativeToTheWallClock() {
        #expect(RetryHint.epochThreshold == 1_000_000_000)
        #expect(RetryHint.parseRateLimitReset("1700000030", nowWall: now2023) == .wait(.seconds(30)))
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
        "9999999999",  // epoch in 2286: 263 years ahead
        "999999999",  // just below the epoch threshold: delta seconds, 31 years
        "99999999999999999999999",
        "99999999999999999999999.5",
        String(repeating: "9", count: 400),
    ])
    func absurdValuesAreNoHint(value: String) {
        #expect(RetryHint.parseRateLimitReset(value, nowWall: now2023) == .none)
    }

    @Test func anEpochNeedsAFiniteWallClock() {
        #expect(RetryHint.parseRateLimitReset("1700000030", nowWall: .nan) == .none)
        #expect(RetryHint.parseRateLimitReset("1700000030", nowWall: -.infinity) == .none)
        #expect(RetryHint.parseRateLimitReset("30", nowWall: .nan) == .wait(.seconds(30)))
    }

    @Test(arguments: [
        "", " ", "-5", "+5", "-1700000030", "abc", "1e3", "1.2.3", ".", ".5", "5.", "1.-5", "1. 5", "30s", "nan",
        "inf", "0x1E", "3 0", "1,5", "١٢", "5\r",
    ])
    func malformedIsNoHint(value: String) {
        #expect(RetryHint.parseRateLimitReset(value, nowWall: now2023) == .none)
    }
}

@Suite("Retry hint: precedence")
struct RetryHintPrecedenceTests {
    @Test func retryAfterWinsOverRateLimitReset() {
        #expect(RetryHint.parse(retryAfter: "5", rateLimitReset: "30", nowWall: now2023) == .wait(.seconds(5)))
        #expect(RetryHint.parse(retryAfter: "0", rateLimitReset: "30", nowWall: now2023) == .wait(.zero))
        // A past date is a usable hint (zero), so it still wins; an absurd one is no hint and falls through.
        #expect(
            RetryHint.parse(retryAfter: "Sun, 06 Nov 1994 08:49:37 GMT", rateLimitReset: "30", nowWall: now2023)
                == .wait(.zero))
        #expect(
            RetryHint.parse(retryAfter: "9999999999", rateLimitReset: "30", nowWall: now2023) == .wait(.seconds(30)))
    }

    @Test(arguments: ["abc", "", "-1", "1.5", "Sun, 06 Nov 1994 25:00:00 GMT"])
    func unusableRetryAfterFallsThroughToRateLimitReset(retryAfter: String) {
        #expect(RetryHint.parse(retryAfter: retryAfter, rateLimitReset: "30", nowWall: now2023) == .wait(.seconds(30)))
        #expect(
            RetryHint.parse(retryAfter: retryAfter, rateLimitReset: "1700000012", nowWall: now2023)
                == .wait(.seconds(12)))
        #expect(RetryHint.parse(retryAfter: retryAfter, rateLimitReset: nil, nowWall: now2023) == .none)
        #expect(RetryHint.parse(retryAfter: retryAfter, rateLimitReset: "-3", nowWall: now2023) == .none)
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
