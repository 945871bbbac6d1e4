/// The byte rules of HTTP/1.1 syntax (RFC 9110 §5.6): tokens, field values, decimal numbers. The one place these
/// are decided, for request and response heads, config values and keychain entries alike.
public enum HTTPSyntax {
    /// A `tchar`: letters, digits and ``!#$%&'*+-.^_`|~``.
    @inlinable
    public static func isTokenByte(_ b: UInt8) -> Bool {
        // One load from a 256-entry table (`1` for each of the 77 tchars, row by row 64 bytes): the 128-bit map it
        // replaced took two branches and a shift, ~11 instructions a byte against ~5 for the loops over names
        // (docs/performance.md#parsing-heads). This runs for every byte of every field name.
        let table: StaticString = """
            0000000000000000000000000000000001011111001101101111111111000000\
            0111111111111111111111111110001111111111111111111111111111101010\
            0000000000000000000000000000000000000000000000000000000000000000\
            0000000000000000000000000000000000000000000000000000000000000000
            """
        return table.utf8Start[Int(b)] == UInt8(ascii: "1")
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

    /// The index of the first byte at or after `start` that cannot be in a field value (the CR that ends its line,
    /// or a control character), or `bytes.count`. Eight bytes at a time (little-endian loads), two words a turn while
    /// neither holds such a byte: this runs over every value of every request and response head.
    @inlinable
    public static func fieldValueEnd(in bytes: UnsafeRawBufferPointer, from start: Int) -> Int {
        guard let base = bytes.baseAddress else { return start }
        // `&+`, `&-`: every index stays within `bytes` (an overflow check on each cost a fifth of the loop).
        var i = start
        while bytes.count &- i >= 8 {
            var marks = nonValueMarks(base.loadUnaligned(fromByteOffset: i, as: UInt64.self))
            if marks == 0 {
                guard bytes.count &- i >= 16 else {
                    i &+= 8
                    continue
                }
                marks = nonValueMarks(base.loadUnaligned(fromByteOffset: i &+ 8, as: UInt64.self))
                i &+= 8
                if marks == 0 {
                    i &+= 8
                    continue
                }
            }
            let first = i &+ marks.trailingZeroBitCount >> 3
            guard bytes[first] == 0x09 else { return first }
            i = first &+ 1  // a tab, which a value may hold
        }
        while i < bytes.count, isFieldValueByte(bytes[i]) { i &+= 1 }
        return i
    }

    /// The high bit of each byte of `word` below 0x20 (HTAB included), and of each DEL (0x7F). A borrow can mark a
    /// byte above a marked one too, never one below the first: the lowest mark is the first such byte, and where it
    /// is is read off the mask (the line's CR is in every value's last word).
    @inlinable @inline(__always)
    static func nonValueMarks(_ word: UInt64) -> UInt64 {
        let ones: UInt64 = 0x0101_0101_0101_0101
        let highBits: UInt64 = 0x8080_8080_8080_8080
        let below = (word &- ones &* 0x20) & ~word & highBits
        let del = word ^ (ones &* 0x7F)
        return below | ((del &- ones) & ~del & highBits)
    }

    public static func isFieldValue(_ text: String) -> Bool { isFieldValue(text.utf8) }

    /// `text` without leading and trailing spaces and tabs (optional whitespace, RFC 9110 §5.6.3).
    public static func trimmingOWS(_ text: some StringProtocol) -> Substring {
        var trimmed = Substring(text)
        while let first = trimmed.first, first == " " || first == "\t" { trimmed.removeFirst() }
        while let last = trimmed.last, last == " " || last == "\t" { trimmed.removeLast() }
        return trimmed
    }

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
