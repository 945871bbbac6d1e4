import Testing

@testable import BackstopCore

/// `HeaderName.string`: a name comes out as the client spelled it, whether it is one of the common spellings kept
/// as literals or not.
@Suite("Header names as strings")
struct HeaderNameTests {
    static let common = [
        "Host", "Range", "Accept", "Cookie", "Origin", "Referer", "User-Agent", "Connection", "traceparent",
        "Content-Type", "X-Request-Id", "X-Request-ID", "Authorization", "Cache-Control", "If-None-Match",
        "Content-Length", "Accept-Encoding", "Accept-Language", "X-Forwarded-For",
    ]

    static func string(_ text: String) -> String {
        Array(text.utf8).withUnsafeBytes { HeaderName.string($0) }
    }

    @Test("A common name, in its usual spelling, in another case, or one byte off, comes out byte for byte")
    func spellingKept() {
        for name in Self.common {
            #expect(Array(Self.string(name).utf8) == Array(name.utf8))
            for variant in [
                name.lowercased(), name.uppercased(), String(name.dropLast()) + "x", "x" + name.dropFirst(),
            ] {
                #expect(Array(Self.string(variant).utf8) == Array(variant.utf8), "\(variant)")
            }
        }
    }

    @Test("Any other name is decoded as sent, an empty one and one with bytes above ASCII included")
    func otherNames() {
        for name in ["", "X", "X-Tenant", "X-Correlation-Id", "a-very-long-header-name-beyond-fifteen"] {
            #expect(Self.string(name) == name)
        }
        let bytes: [UInt8] = [0x58, 0xC3, 0xA9]  // "Xé"
        #expect(Array(bytes.withUnsafeBytes { HeaderName.string($0) }.utf8) == bytes)
    }
}
