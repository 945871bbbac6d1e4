import BackstopCore
import NIOCore

/// Who may connect to a listener: loopback and unix-socket clients always, others only inside `allow_clients`.
/// A connection whose peer address is unknown is refused: nothing proves it is allowed.
struct ClientAccessFilter: Sendable {
    let allowClients: [CIDR]

    func allows(_ address: SocketAddress?) -> Bool {
        guard let address else { return false }
        let bytes: [UInt8]
        switch address {
        case .unixDomainSocket: return true
        case .v4(let v4): bytes = withUnsafeBytes(of: v4.address.sin_addr.s_addr) { Array($0) }
        case .v6(let v6): bytes = withUnsafeBytes(of: v6.address.sin6_addr) { Array($0) }
        }
        if IPAddressBytes.isLoopback(bytes) { return true }
        return allowClients.contains { $0.contains(bytes) }
    }
}
