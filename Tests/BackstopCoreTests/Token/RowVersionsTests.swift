import BackstopCore
import Testing

/// The version rules of a shared token store's rows (docs/reference/token-store.md#row-versions).
@Suite("Row versions")
struct RowVersionsTests {
    @Test(arguments: [
        (Int64(5), Int64?.none, RowVersions.Judgement.newer),
        (0, nil, .newer),
        (6, 5, .newer),
        (5, 5, .current),
        (4, 5, .rolledBack(seen: 5)),
        (0, 5, .rolledBack(seen: 5)),  // a row sealed before versions were, after a versioned one was seen
        (0, 0, .current),
        (.max, .max, .current),
        (1, .max, .rolledBack(seen: .max)),
    ])
    func judge(stored: Int64, highWater: Int64?, expected: RowVersions.Judgement) {
        #expect(RowVersions.judge(stored: stored, highWater: highWater) == expected)
    }

    @Test(arguments: [
        (Int64?.none, Int64?.none, Int64(1)),
        (7, nil, 8),
        (nil, 7, 8),  // the row was deleted after version 7 was seen: the next one is still above it
        (7, 9, 10),  // never written below the mark (the caller refused the row before deciding)
        (9, 7, 10),
        (.max, nil, .max),  // saturates instead of trapping
    ])
    func next(stored: Int64?, highWater: Int64?, expected: Int64) {
        #expect(RowVersions.next(after: stored, highWater: highWater) == expected)
        // Whatever was seen, the row written is newer than it.
        #expect(RowVersions.judge(stored: expected, highWater: highWater) == .newer)
    }

    @Test func aSeedIsAboveEveryVersionWrittenSinceAnyEarlierSeed() {
        let now = 1_800_000_000.0
        let micros = Int64(now * 1e6)
        // A fresh or rolled-back row: the clock reading wins.
        #expect(RowVersions.seed(after: nil, highWater: nil, now: now) == micros)
        #expect(RowVersions.seed(after: 3, highWater: 12, now: now) == micros)
        // An earlier seed a second ago, refreshed 100,000 times since, then rolled back to the seeded row: a new
        // seed is still above what any instance saw.
        let earlier = RowVersions.seed(after: nil, highWater: nil, now: now - 1)
        let seen = earlier + 100_000
        let again = RowVersions.seed(after: earlier, highWater: nil, now: now)
        #expect(again > seen)
        #expect(RowVersions.judge(stored: again, highWater: seen) == .newer)
        // A clock behind the row: never below the row or the seeder's own mark.
        #expect(RowVersions.seed(after: micros + 5, highWater: nil, now: now) == micros + 6)
        #expect(RowVersions.seed(after: nil, highWater: micros + 9, now: now) == micros + 10)
        // Absurd clocks neither trap nor go below the row.
        #expect(RowVersions.seed(after: 4, highWater: nil, now: -1) == 5)
        #expect(RowVersions.seed(after: 4, highWater: nil, now: .nan) == 5)
        #expect(RowVersions.seed(after: 4, highWater: nil, now: .infinity) == 5)
        #expect(RowVersions.seed(after: 4, highWater: nil, now: 1e300) == .max)
    }
}
