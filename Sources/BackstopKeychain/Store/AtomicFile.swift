#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// Crash-safe file replacement: a reader (or a process started after a `kill -9`) sees the old file or the new
/// one, never a mix. Temporary files live next to the target (rename is only atomic within one filesystem) and
/// are named `.<name>.tmp-XXXXXX` so stale ones left by a killed writer can be found and removed.
enum AtomicFile {
    /// Replaces (or creates) `path` with `bytes`, mode 0600. Once the rename succeeded the replacement has
    /// happened: a failure to sync the directory after it is `.durabilityUnconfirmed`, never a plain error, so
    /// no caller undoes what depends on the new file (such as the key a rekeyed keychain now needs).
    static func replace(_ path: String, with bytes: [UInt8]) throws(KeychainError) {
        let temporary = try writeTemporary(for: path, bytes: bytes)
        guard rename(temporary, path) == 0 else {
            let code = errno
            unlink(temporary)
            throw .io(operation: "rename to", path: path, errno: code)
        }
        do {
            try Posix.fsyncDirectory(Posix.directory(of: path))
        } catch .io(_, _, let code) {
            throw .durabilityUnconfirmed(path: path, errno: code)
        }
    }

    /// Creates `path` with `bytes`, mode 0600, only if nothing exists there. Returns false (writing nothing)
    /// when the path is taken, so two processes racing to create a key agree on one of them.
    ///
    /// The bytes are written to an unnamed file (`O_TMPFILE`) that gets its name only when complete: a writer
    /// killed at any moment leaves no copy behind (this writes key files, and a stray named temporary would be
    /// a plaintext key nobody cleans up). Filesystems without `O_TMPFILE` get a named temporary instead.
    static func createExclusive(_ path: String, with bytes: [UInt8]) throws(KeychainError) -> Bool {
        let directory = Posix.directory(of: path)
        let fd = open(directory, Posix.oTmpFile | O_WRONLY | O_CLOEXEC, 0o600)
        guard fd >= 0 else { return try createExclusiveNamed(path, with: bytes) }
        defer { close(fd) }
        guard fchmod(fd, 0o600) == 0 else { throw .io(operation: "chmod", path: path, errno: errno) }
        try Posix.writeAll(fd, bytes, path: path)
        try Posix.fsync(fd, path: path)
        // linkat through /proc publishes the complete file atomically and fails if the name is taken.
        if linkat(AT_FDCWD, "/proc/self/fd/\(fd)", AT_FDCWD, path, AT_SYMLINK_FOLLOW) != 0 {
            let code = errno
            if code == EEXIST { return false }
            throw .io(operation: "link to", path: path, errno: code)
        }
        try Posix.fsyncDirectory(directory)
        return true
    }

    private static func createExclusiveNamed(_ path: String, with bytes: [UInt8]) throws(KeychainError) -> Bool {
        let temporary = try writeTemporary(for: path, bytes: bytes)
        defer { unlink(temporary) }
        if link(temporary, path) == 0 {
            try Posix.fsyncDirectory(Posix.directory(of: path))
            return true
        }
        let code = errno
        if code == EEXIST { return false }
        throw .io(operation: "link to", path: path, errno: code)
    }

    /// Deletes temporaries left by writers that were killed between creating and renaming them. Only safe while
    /// holding the keychain lock, which every writer holds for the whole life of its temporary file.
    static func removeStaleTemporaries(for path: String) {
        let directory = Posix.directory(of: path)
        let prefix = temporaryPrefix(for: path)
        guard let dir = opendir(directory) else { return }
        defer { closedir(dir) }
        while let entry = readdir(dir) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix(while: { $0 != 0 }), as: UTF8.self)
            }
            if name.hasPrefix(prefix) { unlink(directory + "/" + name) }
        }
    }

    static func temporaryPrefix(for path: String) -> String {
        "." + Posix.baseName(of: path) + ".tmp-"
    }

    /// Writes `bytes` to a fresh 0600 temporary file beside `path` and fsyncs it; unlinks it on any failure.
    private static func writeTemporary(for path: String, bytes: [UInt8]) throws(KeychainError) -> String {
        let directory = Posix.directory(of: path)
        var template = Array((directory + "/" + temporaryPrefix(for: path) + "XXXXXX").utf8CString)
        let fd = template.withUnsafeMutableBufferPointer { mkstemp($0.baseAddress!) }
        guard fd >= 0 else { throw .io(operation: "create temporary file in", path: directory, errno: errno) }
        // mkostemp (atomic O_CLOEXEC) is a GNU extension Swift does not import; nothing forks in between here.
        _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
        let temporary = String(decoding: template.dropLast().map { UInt8(bitPattern: $0) }, as: UTF8.self)
        do throws(KeychainError) {
            defer { close(fd) }
            // mkstemp already uses 0600; set it explicitly so the guarantee does not rest on libc defaults.
            guard fchmod(fd, 0o600) == 0 else { throw .io(operation: "chmod", path: temporary, errno: errno) }
            try Posix.writeAll(fd, bytes, path: temporary)
            try Posix.fsync(fd, path: temporary)
        } catch {
            unlink(temporary)
            throw error
        }
        return temporary
    }
}
