import BackstopCore
import Testing

@Suite("ISO 8601 times")
struct ISO8601TimeTests {
    @Test(
        "whole seconds and milliseconds in UTC, across leap days, century rules and before the epoch",
        arguments: [
            (Int64(0), nil, "1970-01-01T00:00:00Z"),
            (1_795_719_595, nil, "2026-11-26T18:59:55Z"),
            (951_782_400, 7, "2000-02-29T00:00:00.007Z"),
            (4_107_542_399, 999, "2100-02-28T23:59:59.999Z"),
            (4_107_542_400, nil, "2100-03-01T00:00:00Z"),
            (-1, nil, "1969-12-31T23:59:59Z"),
            (253_402_300_799, nil, "9999-12-31T23:59:59Z"),
        ] as [(Int64, Int?, String)])
    func formats(seconds: Int64, milliseconds: Int?, expected: String) {
        #expect(ISO8601Time.format(seconds: seconds, milliseconds: milliseconds) == expected)
    }

    @Test("fractional epoch seconds round down, as the status page shows them")
    func roundsDown() {
        #expect(ISO8601Time.format(epochSeconds: 1_795_719_595.9) == "2026-11-26T18:59:55Z")
        #expect(ISO8601Time.format(epochSeconds: -0.5) == "1969-12-31T23:59:59Z")
    }
}
