#if canImport(Glibc)
import Glibc
#endif

/// The file at a unix listener's path, looked at before binding (docs/reference/config.md#listen): a socket left
/// behind by a process that died is replaced, but one that a running process still accepts connections on is not
/// taken from it (a second `backstop run` on the same config would otherwise unlink the first one's socket, serve,
/// and remove the path when it exits, leaving the first unreachable).
enum UnixListenerPath {
    /// The path holds a socket a running process accepts connections on.
    struct InUse: Error, CustomStringConvertible {
        var description: String { "another process is listening on this socket (is backstop already running?)" }
    }

    /// Throws `InUse` when a connection to the socket at `path` is accepted (or its backlog is full); returns when
    /// nothing is there, the file is not a socket (the bind reports that), or nothing listens on it.
    static func ensureNotInUse(_ path: String) throws {
        var info = stat()
        guard lstat(path, &info) == 0, info.st_mode & S_IFMT == S_IFSOCK else { return }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        // Too long for an address: the bind reports it.
        guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else { return }
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: bytes) }
        let descriptor = socket(AF_UNIX, CInt(SOCK_STREAM.rawValue | SOCK_CLOEXEC.rawValue | SOCK_NONBLOCK.rawValue), 0)
        guard descriptor >= 0 else { return }
        defer { close(descriptor) }
        let result = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
        // ECONNREFUSED: nobody listens (a stale socket); EAGAIN: a listener whose backlog is full.
        if result == 0 || errno == EAGAIN { throw InUse() }
    }
}
