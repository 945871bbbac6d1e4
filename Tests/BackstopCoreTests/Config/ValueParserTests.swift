import BackstopCore
import Testing

/// Durations, sizes, CIDRs and IP literals as written in the config.
@Suite("Config value parsers")
struct ValueParserTests {
    @Test(
        "durations",
        arguments: [
            ("250ms", Duration.milliseconds(250)), ("2s", .seconds(2)), ("1.5s", .milliseconds(1500)),
            ("5m", .seconds(300)),
            ("1h", .seconds(3600)), ("100us", .microseconds(100)), ("100µs", .microseconds(100)),
            ("7ns", .nanoseconds(7)),
            ("0s", .zero), ("0ms", .zero), (".5s", .milliseconds(500)), ("2.s", .seconds(2)), (" 3s ", .seconds(3)),
            ("0.001ms", .microseconds(1)), ("90m", .seconds(5400)), ("24h", .seconds(86400)),
        ])
    func durations(text: String, value: Duration) {
        #expect(DurationParser.parse(text) == value)
    }

    @Test(
        "malformed durations",
        arguments: [
            "", "s", "5", "-1s", "+1s", "1.2.3s", "1 parsec", "∞s", "1e3s", "0x10s", "1d", "1S", "5 m s", "nan s", ".s",
            "99999999999h", "1sec", "ms",
        ])
    func badDurations(text: String) {
        #expect(DurationParser.parse(text) == nil)
        // Only the well-formed one is too long rather than malformed.
        #expect(DurationParser.isTooLong(text) == (text == "99999999999h"))
    }

    @Test("a config starting with a UTF-8 byte order mark reads as without it; a too-long duration says so")
    func byteOrderMarkAndLongDuration() throws {
        let config = try ConfigFixture.parse("\u{FEFF}" + ConfigFixture.head)
        #expect(config.listeners.count == 1)
        let errors = ConfigFixture.errors(ConfigFixture.head + "limits: {client_idle_timeout: 1000000h}\n")
        #expect(errors.count == 1 && errors[0].message.contains("'1000000h' is too long"), "\(errors)")
    }

    @Test("a well-formed duration of 1e9 s or more is said to be too long; just under it is read")
    func tooLong() {
        #expect(DurationParser.isTooLong("1000000000s") && DurationParser.parse("1000000000s") == nil)
        #expect(DurationParser.isTooLong("9223372036854775807ns"))
        #expect(!DurationParser.isTooLong("999999999s") && DurationParser.parse("999999999s") == .seconds(999_999_999))
        #expect(!DurationParser.isTooLong("1e12s"))
    }

    @Test(
        "sizes",
        arguments: [
            ("512KiB", 524_288), ("8MiB", 8_388_608), ("1GiB", 1_073_741_824), ("10KB", 10_000), ("5MB", 5_000_000),
            ("1GB", 1_000_000_000), ("1048576", 1_048_576), ("0", 0), ("100B", 100), ("1.5MiB", 1_572_864),
            ("64 KiB", 65_536),
        ])
    func sizes(text: String, value: Int) {
        #expect(SizeParser.parse(text) == value)
    }

    @Test(
        "malformed sizes",
        arguments: [
            "", "lots", "-1", "1.5.5MiB", "99999999999999999GiB", "1kib", "1TiB", "MiB", "1e6", "0x10", "1.5",
            "12345678901234567",
        ])
    func badSizes(text: String) {
        #expect(SizeParser.parse(text) == nil)
    }

    @Test("CIDRs and IP literals")
    func addresses() {
        #expect(CIDRParser.parse("10.0.0.0/8") == CIDR(address: [10, 0, 0, 0], prefixLength: 8))
        #expect(CIDRParser.parse("192.168.1.7") == CIDR(address: [192, 168, 1, 7], prefixLength: 32))
        #expect(CIDRParser.parse("0.0.0.0/0") == CIDR(address: [0, 0, 0, 0], prefixLength: 0))
        #expect(CIDRParser.parse("::1/128")?.address == Array(repeating: 0, count: 15) + [1])
        #expect(CIDRParser.parse("fd00::/8") == CIDR(address: [0xfd] + Array(repeating: 0, count: 15), prefixLength: 8))
        #expect(
            CIDRParser.parse("::ffff:10.1.2.3/128")?.address == Array(repeating: 0, count: 10) + [
                255, 255, 10, 1, 2, 3,
            ])
        for bad in [
            "10.0.0.0/33", "::/129", "10.0.0/8", "10.0.0.0/", "10.0.0.0/8/8", "300.0.0.0/8", "010.0.0.0/8", "x/8",
            "1:2:3:4:5:6:7:8:9/64", "1::2::3/64", "10.0.0.0/-1",
        ] {
            #expect(CIDRParser.parse(bad) == nil, "\(bad)")
        }
        #expect(IPAddressParser.parse("1:2:3:4:5:6:7:8") == [0, 1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 0, 7, 0, 8])
        #expect(IPAddressParser.parse("::") == Array(repeating: 0, count: 16))
        #expect(IPAddressParser.parse("1::") == [0, 1] + Array(repeating: 0, count: 14))
        #expect(IPAddressParser.parse("1:2:3:4:5:6:7") == nil)
        #expect(IPAddressParser.parse("12345::") == nil)
        #expect(IPAddressParser.isLoopback("127.1.2.3"))
        #expect(IPAddressParser.isLoopback("::1"))
        #expect(IPAddressParser.isLoopback("0:0:0:0:0:0:0:1"))
        #expect(IPAddressParser.isLoopback("LocalHost"))
        #expect(!IPAddressParser.isLoopback("0.0.0.0"))
        #expect(!IPAddressParser.isLoopback("::"))
        #expect(!IPAddressParser.isLoopback("128.0.0.1"))
        #expect(!IPAddressParser.isLoopback("example.com"))
    }
}
