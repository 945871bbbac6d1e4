/// Why the queue store could not do what was asked. Messages name the store's file, never a request's contents.
public enum QueueError: Error, Sendable, Equatable, CustomStringConvertible {
    /// `spool.max_bytes` has no room for the request (507 `spool-full`).
    case budgetExhausted
    /// The filesystem is full (SQLite's `SQLITE_FULL`), or has no room left for the queue's reserve
    /// (`SpoolReserve`): nothing of the request was stored (507 `spool-full`).
    case diskFull
    /// The store could not be opened or used: `detail` says what SQLite or the system reported.
    case storage(path: String, detail: String)
    /// The store was closed.
    case closed
    /// `queue.db` was removed or replaced while the daemon ran: nothing more is stored in it.
    case removed(path: String)

    /// Whether this is a lack of room (budget or disk), which a queued request answers with 507 `spool-full`.
    public var isSpoolFull: Bool { self == .budgetExhausted || self == .diskFull }

    public var description: String {
        switch self {
        case .budgetExhausted: "spool.max_bytes reached: the queue cannot take this request"
        case .diskFull:
            "the spool's filesystem is full: free space on it (a spool.max_bytes well below its size keeps this from "
                + "happening)"
        case .storage(let path, let detail): "queue store \(path): \(detail)"
        case .closed: "the queue store is closed"
        case .removed(let path):
            "queue store \(path) was removed or replaced while backstop ran: no request is stored in it any more "
                + "(restart backstop to make a new queue; what was still queued in the removed file is lost with it)"
        }
    }
}
