import BackstopCore
import Testing

/// The byte rules every parser of heads shares, against their definitions in RFC 9110 §5.6.2 and §5.5.
@Suite("HTTP syntax")
struct HTTPSyntaxTests {
    static let tchars = Set(Array("!#$%&'*+-.^_`|~0123456789".utf8) + (0x41...0x5A) + (0x61...0x7A))

    @Test("A tchar is exactly one of the 77 token characters, for every byte")
    func tokenBytes() {
        #expect(Self.tchars.count == 77)
        for byte in UInt8.min...UInt8.max {
            #expect(HTTPSyntax.isTokenByte(byte) == Self.tchars.contains(byte), "byte \(byte)")
        }
    }

    @Test("fieldValueEnd stops at the first byte a value cannot hold, wherever it is and whatever it is")
    func fieldValueEnd() {
        // A 40-byte value (crossing several 8-byte words), with each byte value put at each position in turn.
        for bad in UInt8.min...UInt8.max {
            for position in 0..<40 {
                var bytes = Array(repeating: UInt8(ascii: "v"), count: 40)
                bytes[position] = bad
                let expected = HTTPSyntax.isFieldValueByte(bad) ? bytes.count : position
                for start in [0, 3] where start <= position {
                    let end = bytes.withUnsafeBytes { HTTPSyntax.fieldValueEnd(in: $0, from: start) }
                    #expect(end == expected, "byte \(bad) at \(position), from \(start)")
                }
            }
        }
        let tabbed: [UInt8] = [0x61, 0x09, 0x62, 0x80, 0xFF, 0x20, 0x63, 0x0D, 0x0A]
        #expect(tabbed.withUnsafeBytes { HTTPSyntax.fieldValueEnd(in: $0, from: 0) } == 7)
    }

    /// Byte by byte, as the definition reads.
    static func referenceEnd(_ bytes: [UInt8], from start: Int) -> Int {
        var i = start
        while i < bytes.count, HTTPSyntax.isFieldValueByte(bytes[i]) { i += 1 }
        return i
    }

    @Test("fieldValueEnd finds a byte a value cannot hold after a tab anywhere before it, in any word of a pair")
    func fieldValueEndAfterATab() {
        // Two words a turn: a tab, then the byte that ends the value in the same word, the next or one further on.
        for bad in [UInt8(0x00), 0x0A, 0x0D, 0x1F, 0x7F] {
            for tab in 0..<40 {
                for position in (tab + 1)..<48 {
                    var bytes = Array(repeating: UInt8(ascii: "v"), count: 48)
                    bytes[tab] = 0x09
                    bytes[position] = bad
                    for start in [0, 3] {
                        let end = bytes.withUnsafeBytes { HTTPSyntax.fieldValueEnd(in: $0, from: start) }
                        #expect(end == Self.referenceEnd(bytes, from: start), "tab at \(tab), \(bad) at \(position)")
                    }
                }
            }
        }
    }

    @Test("fieldValueEnd agrees with the byte-by-byte rule when several bytes around a word's edge are unusual")
    func fieldValueEndAgainstTheRule() {
        // Borrows between bytes are where a word-at-a-time check goes wrong: pairs and triples of bytes near the
        // rule's edges (NUL, 0x01, HTAB, LF, CR, 0x1F, space, DEL, obs-text), at every position of two words.
        let edges: [UInt8] = [0x00, 0x01, 0x08, 0x09, 0x0A, 0x0D, 0x1F, 0x20, 0x21, 0x7E, 0x7F, 0x80, 0xFF, 0x61]
        for a in edges {
            for b in edges {
                for c in [UInt8(0x09), 0x00, 0x61] {
                    for position in 0..<16 {
                        var bytes = Array(repeating: UInt8(ascii: "v"), count: 24)
                        bytes[position] = a
                        bytes[position + 1] = b
                        bytes[position + 2] = c
                        for start in [0, 1, 5] {
                            let end = bytes.withUnsafeBytes { HTTPSyntax.fieldValueEnd(in: $0, from: start) }
                            #expect(
                                end == Self.referenceEnd(bytes, from: start),
                                "\(a), \(b), \(c) at \(position), from \(start)")
                        }
                    }
                }
            }
        }
        // And 20,000 lines of random bytes, mostly visible, from a fixed seed.
        var state: UInt64 = 0x9E37_79B9_7F4A_7C15
        for _ in 0..<20_000 {
            var bytes: [UInt8] = []
            for _ in 0..<32 {
                state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
                let draw = UInt8(truncatingIfNeeded: state >> 56)
                bytes.append(draw < 16 ? draw : draw < 32 ? 0x09 : 0x20 + draw % 0x60)
            }
            let end = bytes.withUnsafeBytes { HTTPSyntax.fieldValueEnd(in: $0, from: 0) }
            #expect(end == Self.referenceEnd(bytes, from: 0), "\(bytes)")
        }
    }
}
