/// Parses config durations: a number with a unit, `250ms`, `2s`, `1.5s`, `5m`, `1h`, `100us`.
public enum DurationParser {
    public static func parse(_ text: String) -> Duration? {
        let trimmed = text.trimmingCharacters(in: " \t")
        let units: [(String, Double)] = [("ms", 1e-3), ("us", 1e-6), ("µs", 1e-6), ("ns", 1e-9), ("s", 1), ("m", 60), ("h", 3600)]
        for (suffix, scale) in units where trimmed.hasSuffix(suffix) {
            let number = String(trimmed.dropLast(suffix.count))
            guard isPlainDecimal(number), let value = Double(number), value.isFinite, value >= 0 else { return nil }
            let seconds = value * scale
            guard seconds < 1e9 else { return nil }
            return .nanoseconds(Int64((seconds * 1e9).rounded()))
        }
        return nil
    }

    static func isPlainDecimal(_ text: String) -> Bool {
        guard !text.isEmpty else { return false }
        var dots = 0
        for ch in text {
            if ch == "." { dots += 1 } else if !ch.isASCIIDigit { return false }
        }
        return dots <= 1 && text != "."
    }
}

/// Parses config sizes: plain bytes (`1048576`) or a number with a unit (`512KiB`, `8MiB`, `1GiB`, `10KB`, `5MB`).
public enum SizeParser {
    public static func parse(_ text: String) -> Int? {
        let trimmed = text.trimmingCharacters(in: " \t")
        let units: [(String, Double)] = [
            ("KiB", 1024), ("MiB", 1_048_576), ("GiB", 1_073_741_824), ("KB", 1000), ("MB", 1_000_000), ("GB", 1_000_000_000),
            ("B", 1),
        ]
        for (suffix, scale) in units where trimmed.hasSuffix(suffix) {
            let number = String(trimmed.dropLast(suffix.count)).trimmingCharacters(in: " ")
            guard DurationParser.isPlainDecimal(number), let value = Double(number) else { return nil }
            let bytes = value * scale
            guard bytes < 1e15 else { return nil }
            return Int(bytes.rounded())
        }
        guard !trimmed.isEmpty, trimmed.allSatisfy(\.isASCIIDigit), trimmed.count < 16 else { return nil }
        return Int(trimmed)
    }
}

/// Parses `a.b.c.d/n` and IPv6 `x::y/n` networks.
public enum CIDRParser {
    public static func parse(_ text: String) -> CIDR? {
        let parts = text.split(separator: "/", omittingEmptySubsequences: false)
        guard parts.count <= 2 else { return nil }
        let address = String(parts[0])
        guard let bytes = IPAddressParser.parse(address) else { return nil }
        let maxLength = bytes.count * 8
        var length = maxLength
        if parts.count == 2 {
            guard let value = Int(parts[1]), value >= 0, value <= maxLength, parts[1].allSatisfy(\.isASCIIDigit)
            else { return nil }
            length = value
        }
        return CIDR(address: bytes, prefixLength: length)
    }
}

/// Parses literal IPv4 and IPv6 addresses into bytes.
public enum IPAddressParser {
    public static func parse(_ text: String) -> [UInt8]? {
        if text.contains(":") { return parseV6(text) }
        return parseV4(text)
    }

    static func parseV4(_ text: String) -> [UInt8]? {
        let parts = text.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 4 else { return nil }
        var bytes: [UInt8] = []
        for part in parts {
            guard !part.isEmpty, part.count <= 3, part.allSatisfy(\.isASCIIDigit), let value = UInt8(part) else { return nil }
            bytes.append(value)
        }
        return bytes
    }

    static func parseV6(_ text: String) -> [UInt8]? {
        var head: [UInt16] = []
        var tail: [UInt16] = []
        let halves = text.components(separatedBy: "::")
        guard halves.count <= 2 else { return nil }
        func groups(_ part: String, allowV4: Bool) -> [UInt16]? {
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
        guard let first = groups(halves[0], allowV4: halves.count == 1) else { return nil }
        head = first
        if halves.count == 2 {
            guard let second = groups(halves[1], allowV4: true) else { return nil }
            tail = second
            guard head.count + tail.count <= 7 else { return nil }
        } else {
            guard head.count == 8 else { return nil }
        }
        let all = head + Array(repeating: 0, count: 8 - head.count - tail.count) + tail
        return all.flatMap { [UInt8($0 >> 8), UInt8($0 & 0xFF)] }
    }

    /// Whether a listen host is loopback: 127.0.0.0/8, ::1, or `localhost`.
    public static func isLoopback(_ host: String) -> Bool {
        if host.lowercased() == "localhost" { return true }
        guard let bytes = parse(host) else { return false }
        if bytes.count == 4 { return bytes[0] == 127 }
        return bytes == Array(repeating: 0, count: 15) + [1]
    }
}

extension String {
    func components(separatedBy separator: String) -> [String] {
        var result: [String] = []
        var current = ""
        var index = startIndex
        while index < endIndex {
            if self[index...].hasPrefix(separator) {
                result.append(current)
                current = ""
                index = self.index(index, offsetBy: separator.count)
            } else {
                current.append(self[index])
                index = self.index(after: index)
            }
        }
        result.append(current)
        return result
    }
}
