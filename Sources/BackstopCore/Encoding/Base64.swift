/// Base64 (RFC 4648 §4) and base64url (§5) without Foundation: strict decoding for hostile input
/// (`Proxy-Authorization`), and encoding for JOSE (`private_key_jwt`) and HTTP Basic.
public enum Base64 {
    private static let standard = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)
    private static let url = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)

    /// Standard alphabet with `=` padding.
    public static func encode<Bytes: Sequence<UInt8>>(_ bytes: Bytes) -> String {
        encode(Array(bytes), alphabet: standard, pad: true)
    }

    /// URL-safe alphabet without padding, as JWS compact serialisation uses (RFC 7515 §2).
    public static func encodeURL<Bytes: Sequence<UInt8>>(_ bytes: Bytes) -> String {
        encode(Array(bytes), alphabet: url, pad: false)
    }

    private static func encode(_ bytes: [UInt8], alphabet: [UInt8], pad: Bool) -> String {
        var out: [UInt8] = []
        out.reserveCapacity((bytes.count + 2) / 3 * 4)
        var i = 0
        while i + 3 <= bytes.count {
            let n = UInt32(bytes[i]) << 16 | UInt32(bytes[i + 1]) << 8 | UInt32(bytes[i + 2])
            out += [
                alphabet[Int(n >> 18)], alphabet[Int(n >> 12 & 63)], alphabet[Int(n >> 6 & 63)], alphabet[Int(n & 63)],
            ]
            i += 3
        }
        let rest = bytes.count - i
        if rest == 1 {
            let n = UInt32(bytes[i]) << 16
            out += [alphabet[Int(n >> 18)], alphabet[Int(n >> 12 & 63)]]
            if pad { out += [UInt8(ascii: "="), UInt8(ascii: "=")] }
        } else if rest == 2 {
            let n = UInt32(bytes[i]) << 16 | UInt32(bytes[i + 1]) << 8
            out += [alphabet[Int(n >> 18)], alphabet[Int(n >> 12 & 63)], alphabet[Int(n >> 6 & 63)]]
            if pad { out.append(UInt8(ascii: "=")) }
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// Strict standard-alphabet decoding: padding required to a multiple of 4, no whitespace, and the unused bits of
    /// the last character zero (so every byte string has exactly one accepted encoding). Nil for anything else.
    public static func decode<Bytes: Collection<UInt8>>(_ text: Bytes) -> [UInt8]? {
        let chars = Array(text)
        guard chars.count % 4 == 0 else { return nil }
        var out: [UInt8] = []
        out.reserveCapacity(chars.count / 4 * 3)
        var i = 0
        while i < chars.count {
            let last = i + 4 == chars.count
            var values: [UInt32] = []
            var padding = 0
            for c in chars[i..<i + 4] {
                if c == UInt8(ascii: "=") {
                    guard last else { return nil }
                    padding += 1
                    continue
                }
                guard padding == 0, let v = value(c) else { return nil }
                values.append(v)
            }
            guard padding <= 2 else { return nil }
            var n: UInt32 = 0
            for v in values { n = n << 6 | v }
            n <<= UInt32(6 * padding)
            let produced = 3 - padding
            // Bits below the last produced byte must be zero (non-canonical encodings are refused).
            let unused = n & ((1 << UInt32(8 * padding)) - 1)
            guard unused == 0 else { return nil }
            for k in 0..<produced { out.append(UInt8(truncatingIfNeeded: n >> UInt32(16 - 8 * k))) }
            i += 4
        }
        return out
    }

    private static func value(_ c: UInt8) -> UInt32? {
        switch c {
        case UInt8(ascii: "A")...UInt8(ascii: "Z"): UInt32(c - UInt8(ascii: "A"))
        case UInt8(ascii: "a")...UInt8(ascii: "z"): UInt32(c - UInt8(ascii: "a") + 26)
        case UInt8(ascii: "0")...UInt8(ascii: "9"): UInt32(c - UInt8(ascii: "0") + 52)
        case UInt8(ascii: "+"): 62
        case UInt8(ascii: "/"): 63
        default: nil
        }
    }
}
