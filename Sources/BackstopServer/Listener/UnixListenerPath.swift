import BackstopKeychain
import NIOCore

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

    /// Why a unix listener could not be put at its path after binding.
    struct PlacementFailed: Error, CustomStringConvertible {
        var description: String
    }

    /// Binds with `bind` in a directory of its own next to `path` (mode 0700: nobody else can reach the socket),
    /// gives the socket its mode 0660 there, then renames it to `path`: the socket is never reachable with the
    /// process umask's mode, and no `chmod` by path can be led through a link put at `path` meanwhile
    /// (docs/reference/config.md#listen). A path too long for the private name is bound in place, as before.
    static func bindPrivately(
        _ path: String, bind: (String) async throws -> any Channel
    ) async throws -> any Channel {
        let parent = Posix.directory(of: path)
        var template = Array((parent == "/" ? "" : parent).utf8CString.dropLast()) + Array("/.bs-XXXXXX".utf8CString)
        let maxPath = MemoryLayout.size(ofValue: sockaddr_un().sun_path) - 1
        guard template.count - 1 + 2 <= maxPath, mkdtemp(&template) != nil else {
            let channel = try await bind(path)
            chmod(path, 0o660)
            return channel
        }
        let directory = String(cString: template)
        defer { rmdir(directory) }
        let privatePath = directory + "/s"
        let channel: any Channel
        do {
            channel = try await bind(privatePath)
        } catch {
            unlink(privatePath)
            throw error
        }
        guard chmod(privatePath, 0o660) == 0, rename(privatePath, path) == 0 else {
            let why = String(cString: strerror(errno))
            unlink(privatePath)
            try? await channel.close()
            throw PlacementFailed(description: "cannot put the socket at \(path): \(why)")
        }
        return channel
    }
}
