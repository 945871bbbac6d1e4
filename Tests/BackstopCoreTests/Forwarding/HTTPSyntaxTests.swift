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
}
