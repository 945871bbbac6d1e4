import BackstopCore
import Testing

@Suite("Dot segments")
struct DotSegmentsTests {
    @Test("a path of invalid UTF-8 cannot be judged and is refused, with or without a percent-encoding")
    func invalidUTF8IsSuspect() {
        // From the path fuzz target: raw 0xFF bytes without any `%` passed.
        #expect(DotSegments.isSuspect([UInt8]("/api/..".utf8) + [0xFF, 0xFF] + [UInt8]("adm".utf8)))
        #expect(DotSegments.isSuspect([UInt8]("/api/%2e".utf8) + [0xFF]))
        #expect(!DotSegments.isSuspect([UInt8]("/caf\u{E9}/menu".utf8)))
        #expect(!DotSegments.isSuspect([UInt8]("/api/v1".utf8)))
        #expect(DotSegments.isSuspect([UInt8]("/api/../admin".utf8)))
    }
}
