import BackstopCore
import NIOCore

/// Who may connect to a listener: loopback clients always, others only inside `allow_clients`.
struct ClientAccessFilter: Sendable {
    let allowClients: [CIDR]

    func allows(_ address: SocketAddress?) -> Bool {
        guard let address else { return true }
        switch address {
        case .unixDomainSocket: return true
        case .v4(let v4):
            let bytes = withUnsafeBytes(of: v4.address.sin_addr.s_addr) { Array($0) }
            if bytes[0] == 127 { return true }
            return allowClients.contains { Self.matches($0, bytes) }
        case .v6(let v6):
            let bytes = withUnsafeBytes(of: v6.address.sin6_addr) { Array($0) }
            if bytes == Array(repeating: 0, count: 15) + [1] { return true }
            // IPv4-mapped (::ffff:a.b.c.d): judge by the IPv4 address.
            if bytes[0..<10].allSatisfy({ $0 == 0 }) && bytes[10] == 0xFF && bytes[11] == 0xFF {
                let v4 = Array(bytes[12..<16])
                if v4[0] == 127 { return true }
                return allowClients.contains { Self.matches($0, v4) }
            }
            return allowClients.contains { Self.matches($0, bytes) }
        }
    }

    static func matches(_ cidr: CIDR, _ bytes: [UInt8]) -> Bool {
        guard cidr.address.count == bytes.count else { return false }
        var remaining = cidr.prefixLength
        for i in 0..<bytes.count where remaining > 0 {
            let bits = min(8, remaining)
            let mask: UInt8 = bits == 8 ? 0xFF : ~(0xFF >> UInt8(bits))
            if bytes[i] & mask != cidr.address[i] & mask { return false }
            remaining -= bits
        }
        return true
    }
}
