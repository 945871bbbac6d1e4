import BackstopKeychain

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A file with no name in the spool directory: `O_TMPFILE`, or where the filesystem lacks it a `mkstemp` file
/// unlinked before anything is written. A crash leaves nothing behind that anyone could open; the kernel frees the
/// blocks when the descriptor closes. Owns the descriptor and closes it once.
final class SpoolFile: Sendable {
    let fd: Int32

    init(directory: String) throws(SpoolError) {
        var fd = open(directory, Posix.oTmpFile | O_RDWR | O_CLOEXEC, 0o600)
        if fd < 0 {
            let code = errno
            // EISDIR/EOPNOTSUPP/EINVAL: a kernel or filesystem without O_TMPFILE.
            guard code == EISDIR || code == EOPNOTSUPP || code == EINVAL else {
                throw SpoolError.from(operation: "open a spool file in \(directory)", errno: code)
            }
            fd = try Self.unlinkedTemporary(in: directory)
        }
        self.fd = fd
    }

    deinit { close(fd) }

    private static func unlinkedTemporary(in directory: String) throws(SpoolError) -> Int32 {
        var template = Array((directory + "/.spool-XXXXXX").utf8CString)
        let fd = template.withUnsafeMutableBufferPointer { mkstemp($0.baseAddress!) }
        guard fd >= 0 else { throw SpoolError.from(operation: "create a spool file in \(directory)", errno: errno) }
        // mkostemp (atomic O_CLOEXEC) is a GNU extension Swift does not import; set it at once instead.
        guard fcntl(fd, F_SETFD, FD_CLOEXEC) == 0 else {
            let code = errno
            let named = template.withUnsafeBufferPointer { unlink($0.baseAddress!) }
            close(fd)
            throw SpoolError.from(
                operation: "mark a spool file close-on-exec in \(directory)"
                    + (named == 0 ? "" : "; the file could not be removed either"),
                errno: code)
        }
        let unlinked = template.withUnsafeBufferPointer { unlink($0.baseAddress!) }
        guard unlinked == 0 else {
            let code = errno
            close(fd)
            throw SpoolError.from(operation: "unlink a spool file in \(directory)", errno: code)
        }
        return fd
    }

    /// Writes all of `bytes` at `offset`.
    func write(_ bytes: UnsafeRawBufferPointer, at offset: Int) throws(SpoolError) {
        var done = 0
        while done < bytes.count {
            let n = pwrite(fd, bytes.baseAddress! + done, bytes.count - done, off_t(offset + done))
            if n < 0 {
                if errno == EINTR { continue }
                throw SpoolError.from(operation: "write the spool file", errno: errno)
            }
            done += n
        }
    }

    /// Reads exactly `buffer.count` bytes at `offset`; false when the file ends first (truncated).
    func read(into buffer: UnsafeMutableRawBufferPointer, at offset: Int) throws(SpoolError) -> Bool {
        var done = 0
        while done < buffer.count {
            let n = pread(fd, buffer.baseAddress! + done, buffer.count - done, off_t(offset + done))
            if n < 0 {
                if errno == EINTR { continue }
                throw SpoolError.from(operation: "read the spool file", errno: errno)
            }
            if n == 0 { return false }
            done += n
        }
        return true
    }
}
