/// Hexadecimal digits both ways, for every encoder in the project (percent-encoding, JSON `\u00XX`, digests).
public enum Hex {
    public static let lowercaseDigits: [UInt8] = Array("0123456789abcdef".utf8)
    public static let uppercaseDigits: [UInt8] = Array("0123456789ABCDEF".utf8)

    /// The value of one hex digit (either case); nil for any other byte.
    @inlinable
    public static func value(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): byte - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): byte - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): byte - UInt8(ascii: "A") + 10
        default: nil
        }
    }

    /// `bytes` as lowercase hex (digests, signatures).
    public static func lowercase<Bytes: Sequence<UInt8>>(_ bytes: Bytes) -> String {
        var out: [UInt8] = []
        out.reserveCapacity(bytes.underestimatedCount * 2)
        for byte in bytes {
            out.append(lowercaseDigits[Int(byte >> 4)])
            out.append(lowercaseDigits[Int(byte & 0x0F)])
        }
        return String(decoding: out, as: UTF8.self)
    }
}

/// Percent-encoding (RFC 3986 §2.1) both ways, with uppercase hex, as form bodies (RFC 6749 Appendix B) and AWS
/// SigV4 canonical requests both want it. Routing's dot-segment judgement decodes more leniently on purpose
/// (`DotSegments.decodeOnce`, which also reads `%uXXXX`).
public enum PercentEncoding {
    /// RFC 3986's unreserved set: `A-Z a-z 0-9 - . _ ~`, the bytes that are never encoded.
    @inlinable
    public static func isUnreserved(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"),
            UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"),
            UInt8(ascii: "~"):
            true
        default:
            false
        }
    }

    /// Appends `bytes` with every byte outside the unreserved set (and outside `alsoKept`) as `%XX`; a space as
    /// `+` when `spaceAsPlus` (form bodies).
    public static func encode(
        _ bytes: some Sequence<UInt8>, into out: inout [UInt8], alsoKept: UInt8? = nil, spaceAsPlus: Bool = false
    ) {
        for byte in bytes {
            if isUnreserved(byte) || byte == alsoKept {
                out.append(byte)
            } else if spaceAsPlus && byte == UInt8(ascii: " ") {
                out.append(UInt8(ascii: "+"))
            } else {
                out.append(UInt8(ascii: "%"))
                out.append(Hex.uppercaseDigits[Int(byte >> 4)])
                out.append(Hex.uppercaseDigits[Int(byte & 0x0F)])
            }
        }
    }

    /// `%XX` decoded once; a `%` not followed by two hex digits is kept as it is; `+` is a space when `plusIsSpace`.
    public static func decode(_ bytes: some Collection<UInt8>, plusIsSpace: Bool = false) -> [UInt8] {
        let bytes = Array(bytes)
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count)
        var i = 0
        while i < bytes.count {
            if bytes[i] == UInt8(ascii: "%"), i + 2 < bytes.count, let high = Hex.value(bytes[i + 1]),
                let low = Hex.value(bytes[i + 2])
            {
                out.append(high << 4 | low)
                i += 3
                continue
            }
            out.append(plusIsSpace && bytes[i] == UInt8(ascii: "+") ? UInt8(ascii: " ") : bytes[i])
            i += 1
        }
        return out
    }
}
