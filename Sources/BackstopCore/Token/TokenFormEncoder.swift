/// `application/x-www-form-urlencoded` as RFC 6749 Appendix B specifies it: UTF-8, space as `+`, every byte
/// outside the RFC 3986 unreserved set (`A-Z a-z 0-9 - . _ ~`) as `%XX` with uppercase hex.
enum TokenFormEncoder {
    static func encode(_ pairs: [(String, String)]) -> [UInt8] {
        var out: [UInt8] = []
        for (index, pair) in pairs.enumerated() {
            if index > 0 { out.append(UInt8(ascii: "&")) }
            appendEscaped(pair.0, to: &out)
            out.append(UInt8(ascii: "="))
            appendEscaped(pair.1, to: &out)
        }
        return out
    }

    static func appendEscaped(_ text: String, to out: inout [UInt8]) {
        let hex: [UInt8] = Array("0123456789ABCDEF".utf8)
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"),
                UInt8(ascii: "~"):
                out.append(byte)
            case UInt8(ascii: " "):
                out.append(UInt8(ascii: "+"))
            default:
                out.append(UInt8(ascii: "%"))
                out.append(hex[Int(byte >> 4)])
                out.append(hex[Int(byte & 0x0F)])
            }
        }
    }
}
