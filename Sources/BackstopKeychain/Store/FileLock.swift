import Foundation

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// An exclusive `flock` on a sidecar lock file.
///
/// The lock file is created once (mode 0600) and never deleted: deleting it would let two processes lock two
/// different inodes under the same name. `flock` locks belong to an open file description, not to a thread, and
/// every acquisition opens its own, so the lock also serializes threads and tasks of one process, and a task may
/// hold it across suspension points and release it from any thread.
enum FileLock {
    /// Opens the lock file and locks it; returns the descriptor to pass to `release`.
    static func acquire(path: String, wait: Bool) throws(KeychainError) -> Int32 {
        let fd = try Posix.open(path, O_RDWR | O_CREAT | O_NOFOLLOW, 0o600)
        while flock(fd, LOCK_EX | (wait ? 0 : LOCK_NB)) != 0 {
            let code = errno
            if code == EINTR { continue }
            close(fd)
            if code == EWOULDBLOCK { throw .lockBusy(path: path) }
            throw .io(operation: "lock", path: path, errno: code)
        }
        return fd
    }

    /// Waits for the lock on a thread of its own, so that a blocking `flock` never stalls the cooperative pool.
    /// Not cancellable while waiting: the lock is only ever held for one keychain read-modify-write.
    static func acquire(path: String) async throws(KeychainError) -> Int32 {
        let result: Result<Int32, KeychainError> = await withCheckedContinuation { continuation in
            let thread = Thread {
                let result = Result { () throws(KeychainError) in try acquire(path: path, wait: true) }
                continuation.resume(returning: result)
            }
            thread.name = "backstop-keychain-lock"
            thread.start()
        }
        return try result.get()
    }

    /// Closing the descriptor releases the lock.
    static func release(_ fd: Int32) {
        close(fd)
    }

    static func withLock<T, E: Error>(
        path: String, wait: Bool, _ body: () throws(E) -> T
    ) throws(KeychainError) -> Result<T, E> {
        let fd = try acquire(path: path, wait: wait)
        defer { release(fd) }
        do {
            return .success(try body())
        } catch {
            return .failure(error)
        }
    }
}
