// The config model of spooled bodies and queued delivery (docs/reference/config.md#spool,
// docs/reference/config.md#delivery-and-queue).

/// The `spool` section: the directory holding spooled request bodies and the queue of deliveries, and the disk
/// budget they share.
public struct SpoolConfig: Sendable, Equatable {
    /// Absolute path (relative ones are resolved against the config file's directory).
    public var directory: String
    /// Bytes that spooled bodies and queued deliveries may take together.
    public var maxBytes: Int
    /// Where `dir` was written, for errors found later (a directory that cannot be created).
    @NotCompared public var location: SourceLocation?
    /// What a queued request takes besides its body and head, at most: two seals and its row (ids, times).
    public static let requestOverhead = 1 << 10

    /// 10 GiB (docs/reference/config.md#spool): a budget, not a reservation; nothing is allocated up front.
    public static let defaultMaxBytes = 10 << 30

    public init(directory: String, maxBytes: Int = SpoolConfig.defaultMaxBytes, location: SourceLocation? = nil) {
        self.directory = directory
        self.maxBytes = maxBytes
        self.location = location
    }
}

/// How requests to an upstream are delivered.
public enum DeliveryMode: String, Sendable, Equatable, CaseIterable {
    /// Forwarded while the client waits (the default).
    case direct
    /// Stored durably, answered `202 Accepted`, delivered in the background (at least once).
    case queue
}

/// An upstream's `queue` section (used with `delivery: queue`).
public struct QueueConfig: Sendable, Equatable {
    /// A delivery not made within this long after it was accepted becomes a dead letter.
    public var maxAge: Duration
    /// Deliveries in flight to this upstream at once.
    public var concurrency: Int

    public init(maxAge: Duration = .seconds(86_400), concurrency: Int = 4) {
        self.maxAge = maxAge
        self.concurrency = concurrency
    }
}
