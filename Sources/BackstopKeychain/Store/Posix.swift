#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// Thin errno-checked wrappers over the few system calls the keychain needs. Every failure names the operation
/// and the path, so the caller can report it as is.
public enum Posix {
    /// Linux's `O_TMPFILE` (`__O_TMPFILE | O_DIRECTORY`), which Glibc's module does not export to Swift: a file
    /// with no name in a directory, gone when its last descriptor closes.
    public static let oTmpFile: Int32 = 0o20_000_000 | O_DIRECTORY

    static func open(_ path: String, _ flags: Int32, _ mode: mode_t = 0) throws(KeychainError) -> Int32 {
        while true {
            let fd = systemOpen(path, flags | O_CLOEXEC, mode)
            if fd >= 0 { return fd }
            if errno != EINTR { throw .io(operation: "open", path: path, errno: errno) }
        }
    }

    static func fstat(_ fd: Int32, path: String) throws(KeychainError) -> stat {
        var info = stat()
        guard systemFstat(fd, &info) == 0 else { throw .io(operation: "stat", path: path, errno: errno) }
        return info
    }

    /// Reads a whole file with `read(2)` until end of file. Unlike readers that trust `st_size`, this reads
    /// procfs files (which report size 0) completely.
    public static func readFile(_ path: String) throws(KeychainError) -> [UInt8] {
        let fd = try open(path, O_RDONLY)
        defer { close(fd) }
        return try readAll(fd, path: path)
    }

    /// Reads until end of file.
    static func readAll(_ fd: Int32, path: String) throws(KeychainError) -> [UInt8] {
        var result: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 64 * 1024)
        while true {
            let n = chunk.withUnsafeMutableBytes { systemRead(fd, $0.baseAddress, $0.count) }
            if n == 0 { return result }
            if n < 0 {
                if errno == EINTR { continue }
                throw .io(operation: "read", path: path, errno: errno)
            }
            result.append(contentsOf: chunk[0..<n])
        }
    }

    static func writeAll(_ fd: Int32, _ bytes: [UInt8], path: String) throws(KeychainError) {
        var offset = 0
        while offset < bytes.count {
            let n = bytes.withUnsafeBytes { systemWrite(fd, $0.baseAddress! + offset, $0.count - offset) }
            if n < 0 {
                if errno == EINTR { continue }
                throw .io(operation: "write", path: path, errno: errno)
            }
            offset += n
        }
    }

    static func fsync(_ fd: Int32, path: String) throws(KeychainError) {
        while systemFsync(fd) != 0 {
            if errno != EINTR { throw .io(operation: "fsync", path: path, errno: errno) }
        }
    }

    /// Makes a rename or link in `directory` durable.
    static func fsyncDirectory(_ directory: String) throws(KeychainError) {
        let fd = try open(directory, O_RDONLY | O_DIRECTORY)
        defer { close(fd) }
        try fsync(fd, path: directory)
    }

    /// Creates `directory` and its missing parents with `mode` (existing ones are left as they are).
    static func makeDirectories(_ directory: String, mode: mode_t) throws(KeychainError) {
        guard !directory.isEmpty, directory != "/", directory != "." else { return }
        var info = stat()
        if stat(directory, &info) == 0 { return }
        try makeDirectories(Self.directory(of: directory), mode: mode)
        if mkdir(directory, mode) != 0 && errno != EEXIST {
            throw .io(operation: "create directory", path: directory, errno: errno)
        }
    }

    static func exists(_ path: String) throws(KeychainError) -> Bool {
        var info = stat()
        if lstat(path, &info) == 0 { return true }
        if errno == ENOENT { return false }
        throw .io(operation: "stat", path: path, errno: errno)
    }

    /// The directory part of `path` ("." for a bare name, "/" for a name at the root).
    public static func directory(of path: String) -> String {
        guard let slash = path.lastIndex(of: "/") else { return "." }
        return slash == path.startIndex ? "/" : String(path[..<slash])
    }

    static func baseName(of path: String) -> String {
        guard let slash = path.lastIndex(of: "/") else { return path }
        return String(path[path.index(after: slash)...])
    }
}

// Module-level aliases: inside `enum Posix` the names `open`, `fstat`, … refer to the wrappers above.
private func systemOpen(_ path: String, _ flags: Int32, _ mode: mode_t) -> Int32 { open(path, flags, mode) }
private func systemFstat(_ fd: Int32, _ info: inout stat) -> Int32 { fstat(fd, &info) }
private func systemRead(_ fd: Int32, _ buffer: UnsafeMutableRawPointer?, _ count: Int) -> Int {
    read(fd, buffer, count)
}
private func systemWrite(_ fd: Int32, _ buffer: UnsafeRawPointer?, _ count: Int) -> Int { write(fd, buffer, count) }
private func systemFsync(_ fd: Int32) -> Int32 { fsync(fd) }
