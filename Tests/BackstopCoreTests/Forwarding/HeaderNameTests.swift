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

/// `HeaderName.equals` compares eight bytes at a time (docs/performance.md#parsing-heads): against the byte rule it
/// replaced, for every byte at every position of names of every length it is given.
@Suite("Header name comparison")
struct HeaderNameEqualsTests {
    /// The rule byte by byte: ASCII letters lowercased, every other byte as it is.
    static func reference(_ bytes: [UInt8], _ lowercase: [UInt8]) -> Bool {
        bytes.count == lowercase.count
            && zip(bytes, lowercase).allSatisfy { ($0 >= 65 && $0 <= 90 ? $0 + 32 : $0) == $1 }
    }

    static let names: [StaticString] = [
        "te", "via", "host", "close", "expect", "chunked", "location", "abcdefghi", "keep-alive", "connection",
        "retry-after", "content-length", "proxy-connection", "transfer-encoding", "x-backstop-attempts",
        "x-correlation-id-0123456",
    ]

    @Test("Every byte at every position of the name, in either case, compares as the byte rule says")
    func everyByteEverywhere() {
        for name in Self.names {
            let lowercase = Array(UnsafeBufferPointer(start: name.utf8Start, count: name.utf8CodeUnitCount))
            let uppercase = lowercase.map { $0 >= 97 && $0 <= 122 ? $0 - 32 : $0 }
            for spelling in [lowercase, uppercase] {
                #expect(spelling.withUnsafeBytes { HeaderName.equals($0, name) })
                for position in spelling.indices {
                    for byte in UInt8.min...UInt8.max {
                        var bytes = spelling
                        bytes[position] = byte
                        let equal = bytes.withUnsafeBytes { HeaderName.equals($0, name) }
                        #expect(equal == Self.reference(bytes, lowercase), "\(name) byte \(byte) at \(position)")
                    }
                }
            }
            for other in [Array(lowercase.dropLast()), lowercase + [0x61], []] {
                #expect(!other.withUnsafeBytes { HeaderName.equals($0, name) })
            }
        }
    }

    @Test("lowercased lowercases exactly the ASCII upper-case letters of a word, whatever its neighbours")
    func wordLowercasing() {
        for a in UInt8.min...UInt8.max {
            for b in UInt8.min...UInt8.max {
                let lanes = (0..<8).map { $0 % 2 == 0 ? a : b }
                let word = lanes.enumerated().reduce(UInt64(0)) { $0 | UInt64($1.element) << (8 * $1.offset) }
                let lowered = HeaderName.lowercased(word)
                for (lane, byte) in lanes.enumerated() {
                    let expected = byte >= 65 && byte <= 90 ? byte + 32 : byte
                    if UInt8(truncatingIfNeeded: lowered >> (8 * lane)) != expected {
                        Issue.record("byte \(byte) in lane \(lane) beside \(lane % 2 == 0 ? b : a)")
                    }
                }
            }
        }
    }
}
