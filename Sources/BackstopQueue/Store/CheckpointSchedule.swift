/// When the queue store's write-ahead log is copied into the database file (a checkpoint), and on which connection
/// (docs/performance.md#queued-delivery). Without I/O: it hears what the commits and checkpoints reported, and says
/// what to run next.
///
/// SQLite's own rule checkpoints at commit time, on the committing connection, whenever the WAL holds 1,000 frames:
/// about every quarter second under load, each a few milliseconds of copying and an `fsync` of the database file
/// that the next group commit waits for. Here the bulk is copied by a connection of its own, on a thread of its
/// own (`background`), while commits go on. Such a copy never catches up with a WAL that commits keep growing, and
/// SQLite starts the WAL over only once everything in it is copied; so when the WAL reaches `limit`, the writer copies
/// the few frames committed since the last copy itself (`foreground`), between two batches, and its next commit
/// starts the WAL over.
struct CheckpointSchedule: Equatable {
    /// What to run after an event.
    enum Action: Equatable {
        case none
        /// Copy the WAL on the checkpointer's connection.
        case background
        /// Copy what is left on the writer's connection before its next batch.
        case foreground
    }

    /// Frames committed and not yet copied that start a background copy (SQLite's default at commit time).
    let threshold: Int
    /// Frames in the WAL at which the writer copies the rest itself, so the WAL starts over.
    let limit: Int
    /// Frames in the WAL after the last commit.
    private(set) var walFrames = 0
    /// Frames of the WAL already copied into the database file.
    private(set) var copied = 0
    /// A background copy runs.
    private(set) var running = false
    private(set) var closed = false

    init(threshold: Int = 1000, limit: Int = 4096) {
        self.threshold = threshold
        self.limit = max(limit, threshold)
    }

    /// A commit left `frames` frames in the WAL (SQLite's WAL hook). Fewer than before: the WAL started over.
    mutating func committed(walFrames frames: Int) -> Action {
        if frames < walFrames { copied = 0 }
        walFrames = frames
        return next(writer: true)
    }

    /// The background copy ended: it had copied `copied` of the WAL's `walFrames` frames; nil when it could not run
    /// (another connection was checkpointing). Says whether to copy again at once (`background` or `none`: a
    /// `foreground` copy waits for the writer's next commit, on the writer's thread). One that could not run is
    /// tried again after the next commit, not at once: a failure that lasts must not keep a thread busy.
    mutating func backgroundEnded(walFrames frames: Int?, copied done: Int?) -> Action {
        running = false
        guard frames != nil else { return .none }
        record(walFrames: frames, copied: done)
        return next(writer: false)
    }

    /// The writer's own copy ended (nil: it could not run): what is copied counts as for a background one; the
    /// writer's next commit starts the WAL over when everything is.
    mutating func foregroundEnded(walFrames frames: Int?, copied done: Int?) {
        record(walFrames: frames, copied: done)
    }

    /// A copy's report: a WAL longer than the last commit said holds a commit not reported yet; a copy of more than
    /// the WAL holds was of the WAL before it started over, and tells nothing about this one.
    private mutating func record(walFrames frames: Int?, copied done: Int?) {
        guard let frames, let done else { return }
        walFrames = max(walFrames, frames)
        if done <= walFrames { copied = done }
    }

    /// No copy starts any more. True when none runs (the checkpointer's connection can be closed at once).
    mutating func close() -> Bool {
        closed = true
        return !running
    }

    /// `writer`: asked on the writer's thread, which can copy itself.
    private mutating func next(writer: Bool) -> Action {
        guard !closed, !running else { return .none }
        if walFrames - copied >= threshold {
            running = true
            return .background
        }
        if writer && walFrames >= limit && copied < walFrames { return .foreground }
        return .none
    }
}
