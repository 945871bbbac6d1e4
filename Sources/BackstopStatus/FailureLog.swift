import NIOConcurrencyHelpers

/// The last `capacity` failures, oldest overwritten first: a fixed ring, so a failure storm costs no memory
/// growth. Fed once per failed request at its end; read by the status page.
public final class FailureLog: Sendable {
    public static let defaultCapacity = 50
    public let capacity: Int

    struct Ring {
        var slots: [FailureRecord] = []
        /// Where the next record goes once the ring is full.
        var next = 0
        var total = 0
    }

    private let ring = NIOLockedValueBox(Ring())

    public init(capacity: Int = FailureLog.defaultCapacity) {
        self.capacity = max(1, capacity)
    }

    public func record(_ failure: FailureRecord) {
        ring.withLockedValue { r in
            r.total += 1
            if r.slots.count < capacity {
                r.slots.append(failure)
            } else {
                r.slots[r.next] = failure
                r.next = (r.next + 1) % capacity
            }
        }
    }

    /// Newest first.
    public var recent: [FailureRecord] {
        ring.withLockedValue { r in
            let ordered = r.slots.count < capacity ? r.slots : Array(r.slots[r.next...] + r.slots[..<r.next])
            return ordered.reversed()
        }
    }

    /// Failures recorded since start (including those overwritten).
    public var total: Int { ring.withLockedValue { $0.total } }
}
