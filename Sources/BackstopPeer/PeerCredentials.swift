import CPeerCredentials
import Glibc

/// Who is at the other end of a local connection, as the kernel says (docs/reference/config.md#clients): the
/// peer credentials of a unix socket, or the owner of a loopback TCP client's socket. Each function does one
/// system call or netlink exchange and keeps nothing open.
public enum PeerCredentials {
    /// A unix-socket peer's user, primary group and process, taken when it connected (`SO_PEERCRED`).
    public struct UnixPeer: Sendable, Equatable {
        public var uid: UInt32
        public var gid: UInt32
        public var pid: Int32
        public init(uid: UInt32, gid: UInt32, pid: Int32) {
            self.uid = uid
            self.gid = gid
            self.pid = pid
        }
    }

    /// The peer of the connected unix socket `fd`.
    public static func unixPeer(fd: Int32) throws(PeerLookupError) -> UnixPeer {
        var uid: UInt32 = 0
        var gid: UInt32 = 0
        var pid: Int32 = 0
        let rc = bs_unix_peer_credentials(fd, &uid, &gid, &pid)
        guard rc == 0 else { throw PeerLookupError(operation: "SO_PEERCRED", errno: -rc) }
        return UnixPeer(uid: uid, gid: gid, pid: pid)
    }

    /// The user owning the client socket of a TCP connection this host accepted: `client` is the accepted
    /// connection's remote end, `server` its local end (addresses of 4 or 16 bytes; IPv4-mapped IPv6 is looked up
    /// as IPv4, as the kernel keeps such a client). Nil when this host has no such socket: the client is remote, in
    /// another network namespace, or already gone; also when its process already closed it (an orphaned socket,
    /// or a time-wait entry, whose uid the kernel reports as 0): no process owns it any more.
    public static func tcpClientOwner(
        client: (address: [UInt8], port: UInt16), server: (address: [UInt8], port: UInt16)
    ) throws(PeerLookupError) -> UInt32? {
        let clientAddress = unmapped(client.address)
        let serverAddress = unmapped(server.address)
        guard clientAddress.count == serverAddress.count, clientAddress.count == 4 || clientAddress.count == 16 else {
            throw PeerLookupError(operation: "inet_diag", errno: EINVAL)
        }
        var uid: UInt32 = 0
        let family = clientAddress.count == 4 ? AF_INET : AF_INET6
        let rc = clientAddress.withUnsafeBufferPointer { src in
            serverAddress.withUnsafeBufferPointer { dst in
                bs_tcp_socket_owner(family, src.baseAddress, client.port, dst.baseAddress, server.port, &uid)
            }
        }
        if rc == -ENOENT { return nil }
        guard rc == 0 else { throw PeerLookupError(operation: "inet_diag", errno: -rc) }
        return uid
    }

    /// `::ffff:a.b.c.d` as its 4 IPv4 bytes; any other address unchanged.
    static func unmapped(_ address: [UInt8]) -> [UInt8] {
        guard address.count == 16, address[0..<10].allSatisfy({ $0 == 0 }), address[10] == 0xFF, address[11] == 0xFF
        else { return address }
        return Array(address[12..<16])
    }
}

/// A failed kernel query about a peer.
public struct PeerLookupError: Error, Sendable, Equatable, CustomStringConvertible {
    public var operation: String
    public var errno: Int32
    public var description: String { "\(operation) failed: \(String(cString: strerror(errno)))" }
}
