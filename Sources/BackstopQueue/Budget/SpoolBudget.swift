import NIOConcurrencyHelpers

/// The disk budget `spool.max_bytes` that spooled bodies and queued deliveries share (docs/reference/config.md#spool):
/// one accounting object, so a burst of large spooled bodies leaves no room for queued deliveries and the other way
/// round, and `backstop_spool_bytes` reads one number.
///
/// Bytes are reserved before they are written and released when the file or row that holds them is gone. What is
/// counted is the payload written (sealed bytes), not the filesystem's blocks: the budget is a promise about what
/// Backstop writes, checked before each write, and the disk can still fill first (then the write fails and the
/// caller answers 507 the same way).
public final class SpoolBudget: Sendable {
    /// The most bytes that may be reserved at once.
    public let limit: Int
    private let reserved = NIOLockedValueBox<Int>(0)

    public init(limit: Int) {
        precondition(limit > 0, "a spool budget needs room for something")
        self.limit = limit
    }

    /// Reserves `bytes`, or returns false (reserving nothing) when they do not fit.
    public func reserve(_ bytes: Int) -> Bool {
        precondition(bytes >= 0)
        return reserved.withLockedValue { used in
            guard bytes <= limit - used else { return false }
            used += bytes
            return true
        }
    }

    /// Reserves `bytes` whatever the limit: for what is already on disk when the store opens (it was accepted
    /// under an earlier, perhaps larger, limit and must still be counted).
    public func reserveUnconditionally(_ bytes: Int) {
        precondition(bytes >= 0)
        reserved.withLockedValue { $0 += bytes }
    }

    /// Gives back bytes reserved earlier.
    public func release(_ bytes: Int) {
        precondition(bytes >= 0)
        reserved.withLockedValue { used in
            precondition(bytes <= used, "released more spool bytes than were reserved")
            used -= bytes
        }
    }

    /// Bytes reserved now (`backstop_spool_bytes`).
    public var used: Int { reserved.withLockedValue { $0 } }
}
