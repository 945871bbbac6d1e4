import Testing

@testable import BackstopCore

/// `Hex` and `PercentEncoding`, over every byte value.
@Suite("Percent-encoding and hex")
struct PercentEncodingTests {
    @Test func hexDigitsReadBackForEveryByte_andNothingElseIsADigit() {
        for byte in UInt8.min...UInt8.max {
            let lower = Hex.lowercase([byte]).utf8.map { $0 }
            let upper = [Hex.uppercaseDigits[Int(byte >> 4)], Hex.uppercaseDigits[Int(byte & 0x0F)]]
            #expect(Hex.value(lower[0])! << 4 | Hex.value(lower[1])! == byte)
            #expect(Hex.value(upper[0])! << 4 | Hex.value(upper[1])! == byte)
        }
        let digits = Set("0123456789abcdefABCDEF".utf8)
        for byte in UInt8.min...UInt8.max where !digits.contains(byte) { #expect(Hex.value(byte) == nil) }
        #expect(Hex.lowercase([0x00, 0xAB, 0xFF]) == "00abff")
    }

    @Test func everyByteEncodesAsUnreservedOrPercentXX_andDecodesBack() {
        let all = Array(UInt8.min...UInt8.max)
        var encoded: [UInt8] = []
        PercentEncoding.encode(all, into: &encoded)
        #expect(
            encoded.allSatisfy { PercentEncoding.isUnreserved($0) || $0 == UInt8(ascii: "%") || Hex.value($0) != nil })
        #expect(encoded.count == 66 + 3 * 190, "66 unreserved bytes kept, 190 as %XX")
        #expect(PercentEncoding.decode(encoded) == all)
    }

    @Test func formBodies_slashKeeping_andLenientDecoding() {
        var form: [UInt8] = []
        PercentEncoding.encode("a b+c/é~".utf8, into: &form, spaceAsPlus: true)
        #expect(String(decoding: form, as: UTF8.self) == "a+b%2Bc%2F%C3%A9~")
        #expect(PercentEncoding.decode(form, plusIsSpace: true) == Array("a b+c/é~".utf8))
        var path: [UInt8] = []
        PercentEncoding.encode("/a b/c".utf8, into: &path, alsoKept: UInt8(ascii: "/"))
        #expect(String(decoding: path, as: UTF8.self) == "/a%20b/c")
        // A `%` without two hex digits after it stays; `+` stays without plusIsSpace.
        #expect(PercentEncoding.decode(Array("%zz%4".utf8)) == Array("%zz%4".utf8))
        #expect(PercentEncoding.decode(Array("a+b%41".utf8)) == Array("a+bA".utf8))
    }
}
