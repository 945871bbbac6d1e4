extension CIDR {
    /// Whether `bytes` (4 for IPv4, 16 for IPv6, network order) lie inside this network. An IPv4-mapped IPv6
    /// address (`::ffff:a.b.c.d`) is judged as the IPv4 address it carries.
    public func contains(_ bytes: [UInt8]) -> Bool {
        let candidate = IPAddressBytes.unmapped(bytes)
        guard address.count == candidate.count else { return false }
        var remaining = prefixLength
        for i in 0..<candidate.count where remaining > 0 {
            let bits = min(8, remaining)
            let mask: UInt8 = bits == 8 ? 0xFF : ~(0xFF >> UInt8(bits))
            if candidate[i] & mask != address[i] & mask { return false }
            remaining -= bits
        }
        return true
    }
}

/// Small facts about raw IP addresses (network-order bytes: 4 for IPv4, 16 for IPv6).
public enum IPAddressBytes {
    /// `::ffff:a.b.c.d` → `a.b.c.d`; anything else unchanged.
    public static func unmapped(_ bytes: [UInt8]) -> [UInt8] {
        guard bytes.count == 16, bytes[0..<10].allSatisfy({ $0 == 0 }), bytes[10] == 0xFF, bytes[11] == 0xFF else {
            return bytes
        }
        return Array(bytes[12..<16])
    }

    /// 127.0.0.0/8 or ::1 (mapped addresses included).
    public static func isLoopback(_ bytes: [UInt8]) -> Bool {
        let plain = unmapped(bytes)
        if plain.count == 4 { return plain[0] == 127 }
        return plain == Array(repeating: 0, count: 15) + [1]
    }

    /// 0.0.0.0 or :: (a listener bound to every local address).
    public static func isUnspecified(_ bytes: [UInt8]) -> Bool {
        bytes.allSatisfy { $0 == 0 }
    }
}
