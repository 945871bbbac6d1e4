/// Parses literal IPv4 (`10.1.2.3`) and IPv6 (`fd00::1`, `::ffff:1.2.3.4`) addresses into network-order bytes.
public enum IPAddressParser {
    /// 4 bytes for IPv4, 16 for IPv6, nil when `text` is not a literal address (host names are not resolved).
    public static func parse(_ text: String) -> [UInt8]? {
        text.contains(":") ? parseV6(text) : parseV4(text)
    }

    /// Whether a listen host is loopback: 127.0.0.0/8, ::1, or `localhost`.
    public static func isLoopback(_ host: String) -> Bool {
        if host.asciiLowercased() == "localhost" { return true }
        guard let bytes = parse(host) else { return false }
        if bytes.count == 4 { return bytes[0] == 127 }
        return bytes == Array(repeating: 0, count: 15) + [1]
    }

    static func parseV4(_ text: String) -> [UInt8]? {
        let parts = text.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 4 else { return nil }
        var bytes: [UInt8] = []
        for part in parts {
            // Leading zeros are refused: some resolvers read `010` as octal.
            guard !part.isEmpty, part.count <= 3, part.allSatisfy(\.isASCIIDigit), part == "0" || !part.hasPrefix("0"),
                let value = UInt8(part)
            else { return nil }
            bytes.append(value)
        }
        return bytes
    }

    static func parseV6(_ text: String) -> [UInt8]? {
        func groups(_ part: Substring, allowV4: Bool) -> [UInt16]? {
            if part.isEmpty { return [] }
            var out: [UInt16] = []
            let pieces = part.split(separator: ":", omittingEmptySubsequences: false)
            for (i, piece) in pieces.enumerated() {
                if allowV4 && i == pieces.count - 1 && piece.contains(".") {
                    guard let v4 = parseV4(String(piece)) else { return nil }
                    out.append(UInt16(v4[0]) << 8 | UInt16(v4[1]))
                    out.append(UInt16(v4[2]) << 8 | UInt16(v4[3]))
                    continue
                }
                guard !piece.isEmpty, piece.count <= 4, let value = UInt16(piece, radix: 16) else { return nil }
                out.append(value)
            }
            return out
        }
        var all: [UInt16]
        if let (left, right) = text.splitOnce("::") {
            guard !right.contains("::"), let head = groups(left, allowV4: false),
                let tail = groups(right, allowV4: true),
                head.count + tail.count <= 7
            else { return nil }
            all = head + Array(repeating: 0, count: 8 - head.count - tail.count) + tail
        } else {
            guard let only = groups(Substring(text), allowV4: true), only.count == 8 else { return nil }
            all = only
        }
        return all.flatMap { [UInt8($0 >> 8), UInt8($0 & 0xFF)] }
    }
}

/// Parses `a.b.c.d/n` and IPv6 `x::y/n` networks; a bare address means a single host (/32 or /128).
public enum CIDRParser {
    public static func parse(_ text: String) -> CIDR? {
        let parts = text.split(separator: "/", omittingEmptySubsequences: false)
        guard parts.count <= 2, let bytes = IPAddressParser.parse(String(parts[0])) else { return nil }
        let maxLength = bytes.count * 8
        var length = maxLength
        if parts.count == 2 {
            guard !parts[1].isEmpty, parts[1].count <= 3, parts[1].allSatisfy(\.isASCIIDigit),
                let value = Int(parts[1]),
                value <= maxLength
            else { return nil }
            length = value
        }
        return CIDR(address: bytes, prefixLength: length)
    }
}

extension String {
    /// Splits at the first occurrence of `separator`; nil when it does not occur.
    func splitOnce(_ separator: String) -> (Substring, Substring)? {
        guard let range = firstRange(of: separator) else { return nil }
        return (self[..<range.lowerBound], self[range.upperBound...])
    }
}
