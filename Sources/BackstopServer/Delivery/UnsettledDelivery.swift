import BackstopQueue

/// A delivery whose try ended but whose outcome the store could not record (its disk is full): the deliverer keeps
/// the outcome and records it later, without sending the request again meanwhile
/// (docs/reference/behaviour.md#queued-delivery). The wait between tries doubles from `firstWait` up to `maxWait`,
/// so a store that stays full is asked about once a minute rather than in a loop.
struct UnsettledDelivery: Equatable, Sendable {
    let delivery: ClaimedDelivery
    let decision: DeliveryDecision
    /// Failed attempts to record the outcome so far.
    private(set) var failures: Int
    /// When to try recording it again (wall-clock seconds since the Unix epoch).
    private(set) var retryAt: Double

    static let firstWait = 1.0
    static let maxWait = 60.0

    /// The first attempt to record `decision` failed at `now`.
    init(_ delivery: ClaimedDelivery, _ decision: DeliveryDecision, failedAt now: Double) {
        self.delivery = delivery
        self.decision = decision
        failures = 1
        retryAt = now + Self.wait(afterFailures: 1)
    }

    /// Another attempt failed at `now`.
    mutating func failedAgain(at now: Double) {
        failures += 1
        retryAt = now + Self.wait(afterFailures: failures)
    }

    /// The wait after `failures` failed attempts: 1 s, 2 s, 4 s, … at most `maxWait`.
    static func wait(afterFailures failures: Int) -> Double {
        guard failures > 1 else { return firstWait }
        // Past 2^6 the cap applies; the exponent is bounded so the shift cannot overflow.
        return min(maxWait, firstWait * Double(1 << min(failures - 1, 16)))
    }
}
