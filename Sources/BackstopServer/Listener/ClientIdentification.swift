import BackstopCore
import BackstopPeer
import NIOCore

#if canImport(Glibc)
import Glibc
#endif

/// Who is at the other end of a client connection, as the kernel says (docs/reference/config.md#clients): a unix
/// socket's `SO_PEERCRED`, or the owner of a loopback TCP client's socket (`inet_diag`). The I/O half of the
/// `clients` decision, whose rules are `ClientAccessPolicy`'s; asked only when a `clients` section is in force.
enum ClientIdentification {
    /// `struct ucred` as `SO_PEERCRED` fills it on Linux: pid, uid, gid, three 32-bit fields in this order. The
    /// option is read into this type's memory, so its layout must stay exactly that.
    struct UnixCredentials: Sendable {
        var pid: Int32 = 0
        var uid: UInt32 = 0
        var gid: UInt32 = 0
    }

    /// The peer of `channel`, with its user's groups when `groups` (a `unix_group` entry needs them). Called on the
    /// channel's event loop. A client the kernel cannot tell about (remote, or gone) has no uid: only a
    /// `proxy_auth` entry can match it.
    static func connection(of channel: Channel, groups: Bool) -> ClientConnection {
        var uid: UInt32?
        var peerGroup: UInt32?
        switch channel.remoteAddress {
        case .unixDomainSocket?:
            if let credentials = unixCredentials(channel) {
                uid = credentials.uid
                peerGroup = credentials.gid
            }
        case let remote?:
            if let local = channel.localAddress, let client = endpoint(remote), let server = endpoint(local) {
                uid = try? PeerCredentials.tcpClientOwner(client: client, server: server)
            }
        case nil:
            break
        }
        guard let uid else { return ClientConnection() }
        return ClientConnection(uid: uid, groups: groups ? UnixAccounts.groups(ofUser: uid, extraGroup: peerGroup) : [])
    }

    private static func unixCredentials(_ channel: Channel) -> UnixCredentials? {
        guard let provider = channel as? SocketOptionProvider else { return nil }
        var read: UnixCredentials?
        // On the channel's event loop NIO reads the option before returning the (then completed) future, so the
        // callback has run by the time this returns.
        provider.unsafeGetSocketOption(level: SocketOptionLevel(SOL_SOCKET), name: SocketOptionName(SO_PEERCRED))
            .assumeIsolated().whenSuccess { (value: UnixCredentials) in read = value }
        return read
    }

    private static func endpoint(_ address: SocketAddress) -> (address: [UInt8], port: UInt16)? {
        guard let bytes = ProxyServer.addressBytes(address), let port = address.port, let port16 = UInt16(exactly: port)
        else { return nil }
        return (bytes, port16)
    }
}
