import Testing

@testable import BackstopQueue

/// What the store holds out of the queue in memory (docs/reference/behaviour.md#queued-delivery): rows being sent
/// take a slot; rows whose outcome waits to be recorded are held without one.
@Suite("Claim table")
struct ClaimTableTests {
    @Test("claimed rows are held and take slots; an unrecorded outcome keeps the row held and frees its slot")
    func lifecycle() {
        var table = ClaimTable()
        #expect(table.held("events", at: 0) == [] && table.sendingCount("events") == 0)
        table.claimed("events", [1, 2, 3])
        table.claimed("audit", [7])
        table.claimed("audit", [])
        #expect(table.held("events", at: 0) == [1, 2, 3] && table.sendingCount("events") == 3)
        table.settleFailed("events", 2)
        #expect(table.held("events", at: 0) == [1, 2, 3] && table.sendingCount("events") == 2)
        table.settleFailed("events", 2)
        #expect(table.held("events", at: 0) == [1, 2, 3] && table.sendingCount("events") == 2)
        table.release("events", [2])
        #expect(table.held("events", at: 0) == [1, 3] && table.sendingCount("events") == 2)
        table.release("events", [1, 3, 99])
        table.release("audit", [7])
        #expect(table == ClaimTable(), "nothing left behind, not even empty sets")
    }

    @Test("a failed try whose outcome was not recorded is skipped until its time, then claimable again")
    func deferred() {
        var table = ClaimTable()
        table.claimed("events", [4, 5])
        table.retryUnrecorded("events", 4, until: 110)
        #expect(table.sendingCount("events") == 1)
        #expect(table.held("events", at: 100) == [4, 5])
        #expect(table.held("events", at: 110) == [5])
        #expect(table.allHeld("events").seqs == [4, 5] && table.allHeld("events").deferredUntil == 110)
        table.claimed("events", [4])
        #expect(table.allHeld("events").deferredUntil == nil && table.sendingCount("events") == 2)
        table.retryUnrecorded("events", 5, until: 120)
        table.release("events", [4, 5])
        #expect(table == ClaimTable())
    }
}
