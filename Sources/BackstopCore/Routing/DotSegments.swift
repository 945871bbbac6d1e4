/// Finds `.` and `..` segments in a request path the way the most lenient server behind Backstop would read it, so
/// that no spelling of "climb one level up" reaches an upstream with the injected credential attached
/// (docs/reference/behaviour.md#dot-segments). Pure; runs for every request.
///
/// A path is judged after percent-decoding, repeated until nothing changes (`%252e` is `%2e` is `.`: servers that
/// decode twice exist), with IIS's `%uXXXX` form decoded too. In the decoded bytes both `/` and `\` end a segment
/// (IIS and Windows servers), a `;parameter` tail is ignored (Tomcat and Jetty read `..;x` as `..`), and so is
/// whatever follows a NUL (C servers stop there). A segment that is then `.` or `..` is a dot segment. Bytes that are
/// not valid UTF-8 once decoded (the overlong `%c0%ae`, which old decoders read as `.`) make the whole path suspect,
/// and so does an encoding nested deeper than `maxDecodingRounds`.
///
/// The path itself is never rewritten: a path that passes is forwarded byte for byte, so an encoded slash that forms
/// no dot segment (`group%2Fproject`) reaches the upstream as it was sent.
public enum DotSegments {
    /// Percent-decoding rounds after which a still-changing path is refused rather than decoded further.
    public static let maxDecodingRounds = 4

    /// Whether `path` (the part before `?`) has a dot segment, or cannot be judged (invalid UTF-8 once decoded,
    /// encodings nested too deep): either way it is refused.
    public static func isSuspect<Bytes: Collection<UInt8>>(_ path: Bytes) -> Bool {
        // Most paths hold no `%`: judged as they are, without a copy.
        guard path.contains(UInt8(ascii: "%")) else {
            // Raw bytes are judged as decoded ones are: invalid UTF-8 cannot be judged (found by the path fuzz
            // target). An ASCII path, the usual one, skips the validation.
            if !path.allSatisfy({ $0 < 0x80 }), String(validating: path, as: UTF8.self) == nil { return true }
            return hasDotSegment(path)
        }
        var bytes = Array(path)
        for _ in 0..<maxDecodingRounds {
            guard let decoded = decodeOnce(bytes) else {
                guard String(validating: bytes, as: UTF8.self) != nil else { return true }
                return hasDotSegment(bytes)
            }
            // A dot segment visible at any depth is enough, even if a later round would garble it.
            if hasDotSegment(decoded) { return true }
            bytes = decoded
        }
        return decodeOnce(bytes) != nil || String(validating: bytes, as: UTF8.self) == nil || hasDotSegment(bytes)
    }

    /// Whether any segment of already-decoded bytes is `.` or `..`.
    public static func hasDotSegment<Bytes: Collection<UInt8>>(_ bytes: Bytes) -> Bool {
        var dots = 0
        var inSegment = true  // still reading the part of the segment that counts (before `;` or NUL)
        var onlyDots = true
        for byte in bytes {
            switch byte {
            case UInt8(ascii: "/"), UInt8(ascii: "\\"):
                if onlyDots && (dots == 1 || dots == 2) { return true }
                dots = 0
                inSegment = true
                onlyDots = true
            case UInt8(ascii: ";"), 0:
                inSegment = false
            case UInt8(ascii: ".") where inSegment:
                dots += 1
            default:
                if inSegment { onlyDots = false }
            }
        }
        return onlyDots && (dots == 1 || dots == 2)
    }

    /// One round of percent-decoding (`%XX`, and `%uXXXX` as UTF-8); nil when nothing was decoded.
    public static func decodeOnce(_ bytes: [UInt8]) -> [UInt8]? {
        guard let first = bytes.firstIndex(of: UInt8(ascii: "%")) else { return nil }
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count)
        out.append(contentsOf: bytes[..<first])
        var changed = false
        var i = first
        while i < bytes.count {
            let byte = bytes[i]
            guard byte == UInt8(ascii: "%") else {
                out.append(byte)
                i += 1
                continue
            }
            if i + 2 < bytes.count, let high = Hex.value(bytes[i + 1]), let low = Hex.value(bytes[i + 2]) {
                out.append(high << 4 | low)
                i += 3
                changed = true
            } else if i + 5 < bytes.count, bytes[i + 1] | 0x20 == UInt8(ascii: "u"),
                let scalar = unicodeEscape(bytes[(i + 2)..<(i + 6)])
            {
                out.append(contentsOf: String(scalar).utf8)
                i += 6
                changed = true
            } else {
                out.append(byte)
                i += 1
            }
        }
        return changed ? out : nil
    }

    private static func unicodeEscape(_ digits: ArraySlice<UInt8>) -> Unicode.Scalar? {
        var value: UInt32 = 0
        for digit in digits {
            guard let nibble = Hex.value(digit) else { return nil }
            value = value << 4 | UInt32(nibble)
        }
        // A lone surrogate is no scalar: the escape stays as it was, and the path is judged without it.
        return Unicode.Scalar(value)
    }
}
