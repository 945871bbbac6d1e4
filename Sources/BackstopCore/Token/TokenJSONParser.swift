/// A parsed JSON value (only what token responses need to inspect).
indirect enum TokenJSONValue: Equatable {
    case null
    case bool(Bool)
    case number(Double)
    case string(String)
    case array([TokenJSONValue])
    case object([String: TokenJSONValue])
}

/// A strict RFC 8259 parser over bytes.
///
/// Hand-written rather than Foundation's so behaviour is the same on every platform and under our control:
/// numbers keep full range (`1e400` becomes +infinity, which callers clamp, instead of failing the whole body),
/// booleans never pass for numbers, invalid UTF-8 and lone surrogates are rejected, nesting is bounded so a
/// hostile body cannot exhaust the stack, and failures carry no excerpt of the (secret-bearing) input.
/// Duplicate object keys: the last one wins.
struct TokenJSONParser {
    static let maxDepth = 64

    private let bytes: [UInt8]
    private var index = 0

    private init(_ bytes: [UInt8]) { self.bytes = bytes }

    /// The document's value, or nil when `bytes` is not exactly one valid JSON value (surrounding whitespace allowed).
    static func parse(_ bytes: [UInt8]) -> TokenJSONValue? {
        guard String(validating: bytes, as: UTF8.self) != nil else { return nil }
        var parser = TokenJSONParser(bytes)
        parser.skipWhitespace()
        guard let value = parser.parseValue(depth: 0) else { return nil }
        parser.skipWhitespace()
        return parser.index == bytes.count ? value : nil
    }

    /// `text` as a JSON number literal (the whole string, no whitespace), or nil.
    static func number(fromLiteral text: String) -> Double? {
        var parser = TokenJSONParser(Array(text.utf8))
        guard let value = parser.parseNumber(), parser.index == parser.bytes.count else { return nil }
        return value
    }

    private var current: UInt8? { index < bytes.count ? bytes[index] : nil }

    private mutating func skipWhitespace() {
        while let byte = current, byte == 0x20 || byte == 0x09 || byte == 0x0A || byte == 0x0D { index += 1 }
    }

    private mutating func consume(_ literal: String) -> Bool {
        let expected = Array(literal.utf8)
        guard bytes.count - index >= expected.count, Array(bytes[index..<index + expected.count]) == expected else {
            return false
        }
        index += expected.count
        return true
    }

    private mutating func parseValue(depth: Int) -> TokenJSONValue? {
        guard depth < Self.maxDepth, let byte = current else { return nil }
        switch byte {
        case UInt8(ascii: "{"): return parseObject(depth: depth + 1)
        case UInt8(ascii: "["): return parseArray(depth: depth + 1)
        case UInt8(ascii: "\""): return parseString().map(TokenJSONValue.string)
        case UInt8(ascii: "t"): return consume("true") ? .bool(true) : nil
        case UInt8(ascii: "f"): return consume("false") ? .bool(false) : nil
        case UInt8(ascii: "n"): return consume("null") ? .null : nil
        default: return parseNumber().map(TokenJSONValue.number)
        }
    }

    private mutating func parseObject(depth: Int) -> TokenJSONValue? {
        index += 1
        var members: [String: TokenJSONValue] = [:]
        skipWhitespace()
        if current == UInt8(ascii: "}") {
            index += 1
            return .object(members)
        }
        while true {
            skipWhitespace()
            guard current == UInt8(ascii: "\""), let key = parseString() else { return nil }
            skipWhitespace()
            guard current == UInt8(ascii: ":") else { return nil }
            index += 1
            skipWhitespace()
            guard let value = parseValue(depth: depth) else { return nil }
            members[key] = value
            skipWhitespace()
            switch current {
            case UInt8(ascii: ","): index += 1
            case UInt8(ascii: "}"):
                index += 1
                return .object(members)
            default: return nil
            }
        }
    }

    private mutating func parseArray(depth: Int) -> TokenJSONValue? {
        index += 1
        var elements: [TokenJSONValue] = []
        skipWhitespace()
        if current == UInt8(ascii: "]") {
            index += 1
            return .array(elements)
        }
        while true {
            skipWhitespace()
            guard let value = parseValue(depth: depth) else { return nil }
            elements.append(value)
            skipWhitespace()
            switch current {
            case UInt8(ascii: ","): index += 1
            case UInt8(ascii: "]"):
                index += 1
                return .array(elements)
            default: return nil
            }
        }
    }

    /// Expects `current` to be the opening quote. The input was validated as UTF-8 up front, so raw bytes are
    /// copied through as they are.
    private mutating func parseString() -> String? {
        index += 1
        var out: [UInt8] = []
        while let byte = current {
            index += 1
            switch byte {
            case UInt8(ascii: "\""):
                return String(decoding: out, as: UTF8.self)
            case UInt8(ascii: "\\"):
                guard let escaped = current else { return nil }
                index += 1
                switch escaped {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): out.append(escaped)
                case UInt8(ascii: "b"): out.append(0x08)
                case UInt8(ascii: "f"): out.append(0x0C)
                case UInt8(ascii: "n"): out.append(0x0A)
                case UInt8(ascii: "r"): out.append(0x0D)
                case UInt8(ascii: "t"): out.append(0x09)
                case UInt8(ascii: "u"):
                    guard let scalar = parseUnicodeEscape() else { return nil }
                    UTF8.encode(scalar) { out.append($0) }
                default: return nil
                }
            case 0x00..<0x20:
                return nil
            default:
                out.append(byte)
            }
        }
        return nil
    }

    /// After `\u`: four hex digits, and for a high surrogate the `\uXXXX` low surrogate that must follow.
    private mutating func parseUnicodeEscape() -> Unicode.Scalar? {
        guard let first = parseHex4() else { return nil }
        switch first {
        case 0xD800...0xDBFF:
            guard consume("\\u"), let second = parseHex4(), (0xDC00...0xDFFF).contains(second) else { return nil }
            return Unicode.Scalar(0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00))
        case 0xDC00...0xDFFF:
            return nil
        default:
            return Unicode.Scalar(first)
        }
    }

    private mutating func parseHex4() -> UInt32? {
        guard bytes.count - index >= 4 else { return nil }
        var value: UInt32 = 0
        for _ in 0..<4 {
            let byte = bytes[index]
            let digit: UInt8
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = byte - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = byte - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = byte - UInt8(ascii: "A") + 10
            default: return nil
            }
            value = value << 4 | UInt32(digit)
            index += 1
        }
        return value
    }

    /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`, converted with `Double(_:)` (overflow gives ±infinity).
    private mutating func parseNumber() -> Double? {
        let start = index
        if current == UInt8(ascii: "-") { index += 1 }
        guard let lead = current, isDigit(lead) else { return nil }
        index += 1
        if lead != UInt8(ascii: "0") { skipDigits() }
        if current == UInt8(ascii: ".") {
            index += 1
            guard let digit = current, isDigit(digit) else { return nil }
            skipDigits()
        }
        if current == UInt8(ascii: "e") || current == UInt8(ascii: "E") {
            index += 1
            if current == UInt8(ascii: "+") || current == UInt8(ascii: "-") { index += 1 }
            guard let digit = current, isDigit(digit) else { return nil }
            skipDigits()
        }
        return Double(String(decoding: bytes[start..<index], as: UTF8.self))
    }

    private func isDigit(_ byte: UInt8) -> Bool { byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9") }

    private mutating func skipDigits() {
        while let byte = current, isDigit(byte) { index += 1 }
    }
}
