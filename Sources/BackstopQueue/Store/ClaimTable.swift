/// Which queued rows this process has taken out of the queue, by upstream (docs/reference/behaviour.md#queued-delivery):
/// those being sent (`sending`, which count against `queue.concurrency`); those whose final outcome (delivered, dead)
/// the store could not record yet (`unsettled`: a full disk), never claimed again while held, so a delivered request
/// is not sent a second time; and those whose failed try could not be recorded (`deferred`), claimable again only
/// from the time that try's outcome named, so a full disk does not turn into a resend loop. Only `sending` rows take
/// a slot. In memory only: after a restart every row is simply queued again (at least once).
struct ClaimTable: Equatable {
    private var sending: [String: Set<Int>] = [:]
    private var unsettled: [String: Set<Int>] = [:]
    private var deferred: [String: [Int: Double]] = [:]

    /// The rows of `upstream` a claim at `now` must skip.
    func held(_ upstream: String, at now: Double) -> Set<Int> {
        var held = sending[upstream, default: []].union(unsettled[upstream, default: []])
        for (seq, until) in deferred[upstream, default: [:]] where until > now { held.insert(seq) }
        return held
    }

    /// Every row of `upstream` held in any way (for the next due time the store computes itself), and the earliest
    /// time a deferred one becomes claimable again.
    func allHeld(_ upstream: String) -> (seqs: Set<Int>, deferredUntil: Double?) {
        let deferredRows = deferred[upstream, default: [:]]
        return (
            sending[upstream, default: []].union(unsettled[upstream, default: []]).union(deferredRows.keys),
            deferredRows.values.min()
        )
    }

    /// Rows of `upstream` being sent (the slots taken).
    func sendingCount(_ upstream: String) -> Int { sending[upstream]?.count ?? 0 }

    /// `seqs` were claimed (their claim committed) and are being sent.
    mutating func claimed(_ upstream: String, _ seqs: [Int]) {
        guard !seqs.isEmpty else { return }
        sending[upstream, default: []].formUnion(seqs)
        for seq in seqs { Self.remove(seq, from: &deferred, upstream) }
    }

    /// Recording `seq`'s final outcome failed: it stays held, without a slot, until recording it succeeds.
    mutating func settleFailed(_ upstream: String, _ seq: Int) {
        Self.remove(seq, from: &sending, upstream)
        unsettled[upstream, default: []].insert(seq)
    }

    /// Recording that `seq`'s try failed and is to be made again at `until` failed: it is claimable from then on.
    mutating func retryUnrecorded(_ upstream: String, _ seq: Int, until: Double) {
        Self.remove(seq, from: &sending, upstream)
        deferred[upstream, default: [:]][seq] = until
    }

    /// `seqs`' outcomes are recorded, or they are given back untried: no longer held.
    mutating func release(_ upstream: String, _ seqs: [Int]) {
        for seq in seqs {
            Self.remove(seq, from: &sending, upstream)
            Self.remove(seq, from: &unsettled, upstream)
            Self.remove(seq, from: &deferred, upstream)
        }
    }

    private static func remove(_ seq: Int, from table: inout [String: Set<Int>], _ upstream: String) {
        table[upstream]?.remove(seq)
        if table[upstream]?.isEmpty == true { table[upstream] = nil }
    }

    private static func remove(_ seq: Int, from table: inout [String: [Int: Double]], _ upstream: String) {
        table[upstream]?[seq] = nil
        if table[upstream]?.isEmpty == true { table[upstream] = nil }
    }
}
