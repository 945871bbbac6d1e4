/// Whether a delivery waits to be sent or was given up on.
public enum DeliveryState: Int, Sendable, Equatable, CaseIterable {
    case queued = 0
    /// A dead letter: kept, counted, listed; retried or dropped only by an operator.
    case dead = 1
}

/// One queued delivery taken by a deliverer: in flight until `settle` (or `unclaim`) gives it back. A crash before
/// that leaves it queued, to be delivered again after the restart (at least once).
public struct ClaimedDelivery: Sendable, Equatable {
    public let id: DeliveryID
    public let upstream: String
    public let request: QueuedRequest
    /// Tries made before this one.
    public let attempts: Int
    /// When it was accepted (wall-clock seconds since the Unix epoch).
    public let acceptedAt: Double
    /// When its `max_age` runs from: the acceptance, or the operator's last `retry`.
    public let clockStart: Double
    let seq: Int
}

/// What `claim` found: deliveries to send now, and those it turned into dead letters on the way.
public struct ClaimBatch: Sendable, Equatable {
    /// Oldest first.
    public var deliveries: [ClaimedDelivery] = []
    /// Deliveries whose `max_age` ran out before they were delivered, now dead letters.
    public var expired: [DeliveryID] = []
    /// Entries that do not open (altered, truncated, sealed under another key): dead letters with the last outcome
    /// `damaged`, kept for the operator and never sent. One whose id did not read is named by the new id it got.
    public var damaged: [DeliveryID] = []
}

/// One line of `backstop deliveries list`: never a body or a header value.
public struct DeliverySummary: Sendable, Equatable {
    public let id: DeliveryID
    public let upstream: String
    /// nil when the entry does not open (`damaged`).
    public let method: String?
    /// The path without its query; nil when the entry does not open.
    public let path: String?
    public let acceptedAt: Double
    public let attempts: Int
    public let lastOutcome: String?
    public let state: DeliveryState
    /// When the next try is due (queued ones).
    public let nextAttemptAt: Double
}

/// The queue's numbers for the metrics (docs/reference/operations.md#metrics).
public struct QueueSnapshot: Sendable, Equatable {
    /// Per upstream name.
    public struct Upstream: Sendable, Equatable {
        public var queued = 0
        public var dead = 0
        /// Acceptance time of the oldest queued delivery; nil when none is queued.
        public var oldestQueuedAt: Double?
        public init(queued: Int = 0, dead: Int = 0, oldestQueuedAt: Double? = nil) {
            self.queued = queued
            self.dead = dead
            self.oldestQueuedAt = oldestQueuedAt
        }
    }

    public var upstreams: [String: Upstream] = [:]
    /// Bytes the stored deliveries take in the spool budget.
    public var storedBytes = 0

    public init(upstreams: [String: Upstream] = [:], storedBytes: Int = 0) {
        self.upstreams = upstreams
        self.storedBytes = storedBytes
    }
}
