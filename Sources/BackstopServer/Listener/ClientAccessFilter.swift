import BackstopCore
import NIOCore

/// Who may connect to a listener (docs/reference/config.md#listen): unix-socket clients always; TCP clients inside
/// `allow_clients` when the list is given, loopback clients only when it is empty (the default). A given list is the
/// whole list, as nginx's `allow …; deny all;`: a loopback client outside it is closed at accept like any other.
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
        if allowClients.isEmpty { return IPAddressBytes.isLoopback(bytes) }
        return allowClients.contains { $0.contains(bytes) }
    }
}
