import Foundation
import NIOConcurrencyHelpers

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// An exclusive `flock` on a sidecar lock file, held until `release()` (or until the value goes away): the
/// keychain's read-modify-write lock and the queue spool's owner lock.
///
/// The lock file is created once (mode 0600) and never deleted: deleting it would let two processes lock two
/// different inodes under the same name. `flock` locks belong to an open file description, not to a thread, and
/// every acquisition opens its own, so the lock also serializes threads and tasks of one process, and a task may
/// hold it across suspension points and release it from any thread.
public final class FileLock: Sendable {
    /// Why the lock was not taken.
    public enum Failure: Error, Equatable {
        /// Another holder has it (only without waiting).
        case busy
        /// `open` or `flock` failed with `errno`.
        case system(operation: String, errno: Int32)
    }

    private let descriptor: NIOLockedValueBox<Int32>

    /// Opens (creating) the lock file at `path` and locks it; without `wait`, throws `busy` when it is held.
    public convenience init(path: String, wait: Bool) throws(Failure) {
        self.init(locked: try Self.lock(path: path, wait: wait))
    }

    private init(locked fd: Int32) { descriptor = NIOLockedValueBox(fd) }

    /// Waits for the lock on a thread of its own, so that a blocking `flock` never stalls the cooperative pool.
    /// Not cancellable while waiting: the keychain holds it only for one read-modify-write. The thread hands back
    /// the descriptor, and the lock object is made here: an object made on that thread and read after the
    /// continuation resumed is a hand-over ThreadSanitizer does not see (it reported `release()` against `init`).
    public static func acquire(path: String) async throws(Failure) -> FileLock {
        let result: Result<Int32, Failure> = await withCheckedContinuation { continuation in
            let thread = Thread {
                continuation.resume(returning: Result { () throws(Failure) in try lock(path: path, wait: true) })
            }
            thread.name = "backstop-file-lock"
            thread.start()
        }
        return FileLock(locked: try result.get())
    }

    /// The descriptor of the lock file at `path`, opened (created) and locked.
    private static func lock(path: String, wait: Bool) throws(Failure) -> Int32 {
        var fd: Int32
        repeat {
            fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)
        } while fd < 0 && errno == EINTR
        guard fd >= 0 else { throw .system(operation: "open", errno: errno) }
        while flock(fd, LOCK_EX | (wait ? 0 : LOCK_NB)) != 0 {
            let code = errno
            if code == EINTR { continue }
            close(fd)
            throw code == EWOULDBLOCK ? .busy : .system(operation: "lock", errno: code)
        }
        return fd
    }

    /// Whether the locked file has no name left (removed, or replaced by a rename over it): whatever was kept in it
    /// is gone at the next start. False once released.
    public var isUnlinked: Bool {
        descriptor.withLockedValue { fd in
            guard fd >= 0 else { return false }
            var info = stat()
            return fstat(fd, &info) == 0 && info.st_nlink == 0
        }
    }

    /// Releases the lock (closing the descriptor); later calls do nothing.
    public func release() {
        let held = descriptor.withLockedValue { fd in
            defer { fd = -1 }
            return fd
        }
        if held >= 0 { close(held) }
    }

    deinit { release() }
}

extension FileLock.Failure {
    /// The keychain's error for this failure on the lock file at `path`.
    func keychainError(path: String) -> KeychainError {
        switch self {
        case .busy: .lockBusy(path: path)
        case .system(let operation, let errno): .io(operation: operation, path: path, errno: errno)
        }
    }
}
