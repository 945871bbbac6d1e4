/// The byte rules of HTTP/1.1 syntax (RFC 9110 §5.6): tokens, field values, decimal numbers. The one place these
/// are decided, for request and response heads, config values and keychain entries alike.
public enum HTTPSyntax {
    /// A `tchar`: letters, digits and ``!#$%&'*+-.^_`|~``.
    @inlinable
    public static func isTokenByte(_ b: UInt8) -> Bool {
        switch b {
        case 0x30...0x39, 0x41...0x5A, 0x61...0x7A: true
        case UInt8(ascii: "!"), UInt8(ascii: "#"), UInt8(ascii: "$"), UInt8(ascii: "%"), UInt8(ascii: "&"),
            UInt8(ascii: "'"), UInt8(ascii: "*"), UInt8(ascii: "+"), UInt8(ascii: "-"), UInt8(ascii: "."),
            UInt8(ascii: "^"), UInt8(ascii: "_"), UInt8(ascii: "`"), UInt8(ascii: "|"), UInt8(ascii: "~"):
            true
        default: false
        }
    }

    /// A token (method and header names): one or more `tchar`.
    public static func isToken(_ bytes: some Collection<UInt8>) -> Bool {
        !bytes.isEmpty && bytes.allSatisfy(isTokenByte)
    }

    public static func isToken(_ text: String) -> Bool { isToken(text.utf8) }

    /// A byte allowed in a field value: visible characters, space, tab and obs-text; never CR, LF, NUL or another
    /// control character (each would let a value add lines to a head).
    @inlinable
    public static func isFieldValueByte(_ b: UInt8) -> Bool {
        (b >= 0x20 && b != 0x7F) || b == 0x09
    }

    public static func isFieldValue(_ bytes: some Collection<UInt8>) -> Bool { bytes.allSatisfy(isFieldValueByte) }

    public static func isFieldValue(_ text: String) -> Bool { isFieldValue(text.utf8) }

    /// 1 to `maxDigits` (at most 18, so the value fits an `Int`) ASCII digits as an `Int`; nil for anything else
    /// (signs, spaces, hex, an empty value).
    public static func decimal(_ bytes: some Collection<UInt8>, maxDigits: Int = 18) -> Int? {
        guard !bytes.isEmpty, bytes.count <= min(maxDigits, 18) else { return nil }
        var n = 0
        for b in bytes {
            guard b >= 0x30, b <= 0x39 else { return nil }
            n = n * 10 + Int(b - 0x30)
        }
        return n
    }
}
