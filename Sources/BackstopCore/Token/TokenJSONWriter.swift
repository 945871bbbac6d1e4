/// A flat JSON object of string members, written by hand so member order and bytes are predictable
/// (`JSONSerialization` reorders keys and escapes `/`).
///
/// Escaping follows RFC 8259 §7: `"` and `\` are escaped, control characters U+0000–U+001F become the short
/// escapes `\b \f \n \r \t` or `\u00XX`; everything else, including non-ASCII, is written as raw UTF-8.
enum TokenJSONWriter {
    static func object(_ members: [(String, String)]) -> [UInt8] {
        var out: [UInt8] = [UInt8(ascii: "{")]
        for (index, member) in members.enumerated() {
            if index > 0 { out.append(UInt8(ascii: ",")) }
            appendString(member.0, to: &out)
            out.append(UInt8(ascii: ":"))
            appendString(member.1, to: &out)
        }
        out.append(UInt8(ascii: "}"))
        return out
    }

    static func appendString(_ text: String, to out: inout [UInt8]) {
        let hex = Hex.lowercaseDigits
        out.append(UInt8(ascii: "\""))
        for byte in text.utf8 {
            // Bytes of multi-byte UTF-8 sequences are all >= 0x80, so byte-wise handling is exact.
            switch byte {
            case UInt8(ascii: "\""): out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "\"")])
            case UInt8(ascii: "\\"): out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "\\")])
            case 0x08: out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "b")])
            case 0x0C: out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "f")])
            case 0x0A: out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "n")])
            case 0x0D: out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "r")])
            case 0x09: out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "t")])
            case 0x00..<0x20:
                out.append(contentsOf: Array("\\u00".utf8))
                out.append(hex[Int(byte >> 4)])
                out.append(hex[Int(byte & 0x0F)])
            default:
                out.append(byte)
            }
        }
        out.append(UInt8(ascii: "\""))
    }
}

/// A flat JSON object of string and integer members in the given order, for JOSE headers and JWT claims
/// (`private_key_jwt`); strings escaped as `TokenJSONWriter` does.
public enum JSONObjectWriter {
    /// One member's value.
    public enum Value: Sendable, Equatable {
        case string(String)
        case integer(Int64)
    }

    public static func object(_ members: [(String, Value)]) -> [UInt8] {
        var out: [UInt8] = [UInt8(ascii: "{")]
        for (index, member) in members.enumerated() {
            if index > 0 { out.append(UInt8(ascii: ",")) }
            TokenJSONWriter.appendString(member.0, to: &out)
            out.append(UInt8(ascii: ":"))
            switch member.1 {
            case .string(let text): TokenJSONWriter.appendString(text, to: &out)
            case .integer(let number): out.append(contentsOf: String(number).utf8)
            }
        }
        out.append(UInt8(ascii: "}"))
        return out
    }
}
