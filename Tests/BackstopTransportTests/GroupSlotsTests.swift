import BackstopCore
import Testing

@testable import BackstopTransport

/// `GroupSlots`: a new connection takes the first group with room, and no group's multi handle ever holds more than
/// `perGroup` open connections (curl's walk to one of them stays that short).
@Suite("Group slots")
struct GroupSlotsTests {
    @Test func fillsTheFirstGroupBeforeOpeningAnother() {
        var slots = GroupSlots(perGroup: 3)
        var taken: [Int] = []
        for _ in 0..<7 {
            let slot = slots.slotWithRoom
            slots.opened(slot)
            taken.append(slot)
        }
        #expect(taken == [0, 0, 0, 1, 1, 1, 2])
        #expect(slots.open == [3, 3, 1])
    }

    @Test func aClosedConnectionMakesRoomInItsOwnGroupFirst() {
        var slots = GroupSlots(perGroup: 2)
        for _ in 0..<5 { slots.opened(slots.slotWithRoom) }
        #expect(slots.open == [2, 2, 1])
        slots.closed(1)
        #expect(slots.slotWithRoom == 1)
        slots.closed(0)
        #expect(slots.slotWithRoom == 0)
        slots.opened(0)
        #expect(slots.slotWithRoom == 1)
        slots.opened(1)
        #expect(slots.slotWithRoom == 2)
        #expect(slots.open == [2, 2, 1])
    }

    @Test func emptyGroupsAreKeptAndReusedInOrder() {
        var slots = GroupSlots(perGroup: 1)
        for _ in 0..<3 { slots.opened(slots.slotWithRoom) }
        for slot in [2, 0, 1] { slots.closed(slot) }
        #expect(slots.open == [0, 0, 0])
        #expect(slots.slotWithRoom == 0)
    }

    /// Random opens and closes against a model that checks every slot: the chosen slot is always the lowest with
    /// room, no slot exceeds `perGroup`, and slots are added only when all are full.
    @Test(arguments: [1, 2, 16])
    func randomOpensAndClosesMatchTheModel(perGroup: Int) {
        var slots = GroupSlots(perGroup: perGroup)
        var connections: [Int] = []  // the slot of each open connection
        var generator = SplitMix64(seed: UInt64(perGroup))
        for _ in 0..<5_000 {
            if connections.isEmpty || generator.next() % 3 != 0 {
                let expected = (0..<slots.open.count).first { slot in connections.filter { $0 == slot }.count < perGroup
                }
                let slot = slots.slotWithRoom
                #expect(slot == (expected ?? slots.open.count))
                slots.opened(slot)
                connections.append(slot)
            } else {
                let index = Int(generator.next() % UInt64(connections.count))
                slots.closed(connections.remove(at: index))
            }
            #expect(slots.open.allSatisfy { $0 <= perGroup })
            for slot in slots.open.indices {
                #expect(slots.open[slot] == connections.filter { $0 == slot }.count)
            }
            if connections.count > 200 { for slot in connections { slots.closed(slot) }; connections.removeAll() }
        }
    }
}
