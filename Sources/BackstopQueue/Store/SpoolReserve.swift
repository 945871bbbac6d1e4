import NIOConcurrencyHelpers

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Room kept on the spool's filesystem so the queue can always record outcomes ("A full disk" in
/// docs/reference/behaviour.md#queued-delivery): the file `queue.reserve`, allocated (`posix_fallocate`) to `size`
/// bytes. Requests fill the disk around it; when a write that frees room (a delivered row's delete, a drop; never a
/// failed try's new time, which frees nothing) fails for want of blocks, the reserve is let go (truncated to nothing)
/// and the write tried again: SQLite in WAL mode needs free blocks to delete a row and to
/// copy its WAL into the database, and a queue that filled the disk with its own requests could otherwise free
/// nothing and not even open again. A request is taken only while the reserve is whole (made whole again first when
/// there is room).
///
/// Shared by the processes that open the store (the daemon, `backstop deliveries`): each looks at the file's size,
/// never at a flag of its own, so a command that let it go is seen by the daemon.
final class SpoolReserve: Sendable {
    static let fileName = "queue.reserve"
    /// The smallest and largest reserve; between them, an eighth of the filesystem. The largest holds the WAL at its
    /// longest (`CheckpointSchedule`'s default limit, 4,096 pages of 4 KiB) with room to spare: what a checkpoint may
    /// add to the database file after the reserve was let go.
    static let smallest = 256 << 10
    static let largest = 24 << 20

    let path: String
    let size: Int
    /// The open file, closed with this value: `descriptor` is only read after `init`.
    private let descriptor: Int32

    /// Opens (creating it, mode 0600, never through a link) the reserve in `directory`, sized for its filesystem,
    /// and allocates it when there is room (a full disk leaves it short: `ensure` tries again).
    init(directory: String) throws(QueueError) {
        path = directory + "/" + Self.fileName
        var fs = statvfs()
        let total = statvfs(directory, &fs) == 0 ? Int(clamping: UInt64(fs.f_blocks) &* UInt64(fs.f_frsize)) : 0
        size = Self.size(forFilesystemOf: total)
        let fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard fd >= 0 else {
            throw .storage(path: path, detail: "cannot open: \(String(cString: strerror(errno)))")
        }
        descriptor = fd
        _ = ensure()
    }

    deinit { close(descriptor) }

    /// An eighth of a filesystem of `total` bytes, within `smallest`…`largest`.
    static func size(forFilesystemOf total: Int) -> Int {
        min(largest, max(smallest, total / 8))
    }

    /// When to checkpoint so that the WAL never holds more than half the reserve: after the reserve is let go, a
    /// checkpoint of everything in it fits. The defaults on a filesystem that can afford the largest reserve; a
    /// smaller one (a small tmpfs) checkpoints sooner.
    var checkpointSchedule: CheckpointSchedule {
        let defaults = CheckpointSchedule()
        let limit = min(defaults.limit, max(8, size / 2 / 4096))
        return CheckpointSchedule(threshold: min(defaults.threshold, max(2, limit / 4)), limit: limit)
    }

    /// Whether the reserve is whole, allocating what it lacks first; false when the disk has no room for it.
    func ensure() -> Bool {
        var info = stat()
        guard fstat(descriptor, &info) == 0 else { return false }
        if Int(info.st_size) >= size { return true }
        return posix_fallocate(descriptor, 0, off_t(size)) == 0
    }

    /// Lets the reserve go; returns whether it held anything to give back.
    func release() -> Bool {
        var info = stat()
        guard fstat(descriptor, &info) == 0, info.st_size > 0 else { return false }
        return ftruncate(descriptor, 0) == 0
    }
}
