import BackstopPeer
import BackstopTestSupport
import Foundation
import Glibc
import Testing

/// The kernel's word on who connected (docs/reference/config.md#clients): a unix-socket peer's credentials and a
/// loopback TCP client's socket owner, each with a real client process running as `nobody` and one as root.
@Suite("Peer credentials", .serialized)
struct PeerCredentialsTests {
    static let nobody: UInt32 = 65534

    /// A listening socket owned by the test, closed on deinit.
    final class Listener {
        let fd: Int32
        init(fd: Int32) { self.fd = fd }
        deinit { close(fd) }

        /// The next connection, waiting at most 10 s.
        func accept() throws -> Int32 {
            var poller = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&poller, 1, 10_000) == 1 else { throw PeerTestError("no connection within 10 s") }
            let client = Glibc.accept(fd, nil, nil)
            guard client >= 0 else { throw PeerTestError("accept: \(errno)") }
            return client
        }
    }

    struct PeerTestError: Error, CustomStringConvertible {
        var description: String
        init(_ text: String) { description = text }
    }

    /// A Python client connecting to `target` (a unix path, or `host:port` for TCP), as `user` when given; it holds
    /// the connection until the test closes its end.
    /// A client connecting to `target` as `user`, which waits for the server to close (or, `hangsUp`, sends a byte
    /// and closes at once, as a client that fires a request and leaves).
    static func client(_ target: String, as user: String?, hangsUp: Bool = false) throws -> ChildProcess {
        let script = """
            import socket, sys
            t = sys.argv[1]
            if t.startswith("/"):
                s = socket.socket(socket.AF_UNIX); s.connect(t)
            else:
                host, port = t.rsplit(":", 1)
                s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET); s.connect((host.strip("[]"), int(port)))
            if sys.argv[2] == "close":
                s.sendall(b"x"); s.close()
            else:
                s.recv(1)
            """
        let arguments = ["-c", script, target, hangsUp ? "close" : "wait"]
        if let user {
            return try ChildProcess.spawn(
                "/usr/sbin/runuser", ["-u", user, "--", "/usr/bin/python3"] + arguments, standardOutput: .null)
        }
        return try ChildProcess.spawn("/usr/bin/python3", arguments, standardOutput: .null)
    }

    @Test("SO_PEERCRED names the unix-socket client's user: nobody, then root")
    func unixPeer() throws {
        #expect(getuid() == 0, "the test starts a client as nobody with runuser, which needs root")
        let directory = "/tmp/backstop-peer-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        #expect(mkdir(directory, 0o755) == 0)
        defer { _ = unlink(directory + "/s.sock"); _ = rmdir(directory) }
        let path = directory + "/s.sock"
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        #expect(fd >= 0)
        let listener = Listener(fd: fd)
        let bound = bindUnixSocket(fd, path: path)
        #expect(bound == 0)
        #expect(chmod(path, 0o777) == 0)
        #expect(listen(fd, 4) == 0)
        for (user, uid, gid) in [("nobody", Self.nobody, UInt32(65534)), (nil, UInt32(0), UInt32(0))] {
            let process = try Self.client(path, as: user)
            let connection = try listener.accept()
            let peer = try PeerCredentials.unixPeer(fd: connection)
            #expect(peer.uid == uid, "\(user ?? "root")")
            #expect(peer.gid == gid, "\(user ?? "root")")
            #expect(peer.pid > 0)
            close(connection)
            process.waitUntilExit()
        }
        #expect(throws: PeerLookupError.self) { try PeerCredentials.unixPeer(fd: -1) }
    }

    @Test("inet_diag names the loopback TCP client's owner (IPv4 and IPv6); an unknown 4-tuple is nil")
    func tcpOwner() throws {
        #expect(getuid() == 0)
        for family in [AF_INET, AF_INET6] {
            let fd = socket(family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
            #expect(fd >= 0)
            let listener = Listener(fd: fd)
            var storage = sockaddr_storage()
            var length: socklen_t
            if family == AF_INET {
                var address = sockaddr_in()
                address.sin_family = sa_family_t(AF_INET)
                address.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
                withUnsafeBytes(of: address) { raw in withUnsafeMutableBytes(of: &storage) { $0.copyMemory(from: raw) }
                }
                length = socklen_t(MemoryLayout<sockaddr_in>.size)
            } else {
                var address = sockaddr_in6()
                address.sin6_family = sa_family_t(AF_INET6)
                address.sin6_addr = in6addr_loopback
                withUnsafeBytes(of: address) { raw in withUnsafeMutableBytes(of: &storage) { $0.copyMemory(from: raw) }
                }
                length = socklen_t(MemoryLayout<sockaddr_in6>.size)
            }
            let bound = withUnsafePointer(to: &storage) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) }
            }
            #expect(bound == 0)
            #expect(listen(fd, 4) == 0)
            let local = try Self.endpoint(fd, peer: false)
            let target = family == AF_INET ? "127.0.0.1:\(local.port)" : "[::1]:\(local.port)"
            for (user, uid) in [("nobody", Self.nobody), (nil, UInt32(0))] {
                let process = try Self.client(target, as: user)
                let connection = try listener.accept()
                let server = try Self.endpoint(connection, peer: false)
                let client = try Self.endpoint(connection, peer: true)
                let owner = try PeerCredentials.tcpClientOwner(client: client, server: server)
                #expect(owner == uid, "\(user ?? "root") over \(family == AF_INET ? "IPv4" : "IPv6")")
                close(connection)
                process.waitUntilExit()
            }
            let nothing = try PeerCredentials.tcpClientOwner(
                client: (address: local.address, port: 1), server: (address: local.address, port: local.port))
            #expect(nothing == nil)
            // A client that sent and closed before the lookup: its socket is orphaned or a time-wait entry (uid 0
            // in the kernel's answer), owned by nobody. Before the fix it matched root.
            let leaving = try Self.client(target, as: "nobody", hangsUp: true)
            leaving.waitUntilExit()
            let connection = try listener.accept()
            let gone = try PeerCredentials.tcpClientOwner(
                client: try Self.endpoint(connection, peer: true), server: try Self.endpoint(connection, peer: false))
            #expect(gone == nil, "\(gone.map(String.init) ?? "")")
            close(connection)
        }
    }

    static func endpoint(_ fd: Int32, peer: Bool) throws -> (address: [UInt8], port: UInt16) {
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let rc = withUnsafeMutablePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                peer ? getpeername(fd, $0, &length) : getsockname(fd, $0, &length)
            }
        }
        guard rc == 0 else { throw PeerTestError("getsockname: \(errno)") }
        if Int32(storage.ss_family) == AF_INET {
            let address = withUnsafeBytes(of: storage) { $0.load(as: sockaddr_in.self) }
            return (withUnsafeBytes(of: address.sin_addr) { Array($0) }, UInt16(bigEndian: address.sin_port))
        }
        let address = withUnsafeBytes(of: storage) { $0.load(as: sockaddr_in6.self) }
        return (withUnsafeBytes(of: address.sin6_addr) { Array($0) }, UInt16(bigEndian: address.sin6_port))
    }
}
