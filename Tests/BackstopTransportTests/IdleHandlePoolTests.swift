import Testing

@testable import BackstopTransport

/// `IdleHandlePool`: a handle configured for a CA file or disabled verification never serves other options without
/// a reset; handles of the same options are reused as they are.
@Suite("Idle handle pool")
struct IdleHandlePoolTests {
    static let plain = TransportTLSOptions()
    static let caA = TransportTLSOptions(caFile: "/a.pem")
    static let caB = TransportTLSOptions(caFile: "/b.pem")
    static let insecure = TransportTLSOptions(insecureSkipVerify: true)

    private func put(_ pool: inout IdleHandlePool<Int>, _ handle: Int, _ options: TransportTLSOptions) -> Bool {
        pool.put(handle, options: options)
    }

    private func describe(_ taken: IdleHandlePool<Int>.Taken?) -> String {
        switch taken {
        case .ready(let h)?: "ready \(h)"
        case .needsReset(let h)?: "reset \(h)"
        case nil: "none"
        }
    }

    @Test func sameOptionsAreReusedAsTheyAre() {
        var pool = IdleHandlePool<Int>(capacity: 8)
        #expect(put(&pool, 1, Self.caA))
        #expect(put(&pool, 2, Self.plain))
        #expect(describe(pool.take(for: Self.caA)) == "ready 1")
        #expect(describe(pool.take(for: Self.plain)) == "ready 2")
        #expect(describe(pool.take(for: Self.plain)) == "none")
    }

    @Test func aDefaultHandleServesAnyOptions_aConfiguredOneIsResetForOthers() {
        var pool = IdleHandlePool<Int>(capacity: 8)
        _ = pool.put(1, options: Self.plain)
        #expect(describe(pool.take(for: Self.caB)) == "ready 1", "configure adds the CA file to a default handle")
        _ = pool.put(2, options: Self.caA)
        #expect(describe(pool.take(for: Self.plain)) == "reset 2")
        _ = pool.put(3, options: Self.insecure)
        #expect(describe(pool.take(for: Self.caA)) == "reset 3")
        _ = pool.put(4, options: Self.caA)
        #expect(describe(pool.take(for: Self.caB)) == "reset 4")
        #expect(pool.count == 0)
    }

    @Test func everySequenceKeepsTheInvariant() {
        // Model: what each handle was last configured with. A `ready` handle must be default or match exactly.
        let options = [Self.plain, Self.caA, Self.caB, Self.insecure]
        for seed in 0..<200 {
            var pool = IdleHandlePool<Int>(capacity: 3)
            var configured: [Int: TransportTLSOptions] = [:]
            var next = 0
            var state = UInt64(seed)
            for _ in 0..<40 {
                state = state &* 6364136223846793005 &+ 1442695040888963407
                let wanted = options[Int(state >> 60) % options.count]
                let handle: Int
                switch pool.take(for: wanted) {
                case .ready(let h)?:
                    #expect(configured[h] == wanted || configured[h] == Self.plain)
                    handle = h
                case .needsReset(let h)?:
                    #expect(configured[h] != wanted && configured[h] != Self.plain)
                    handle = h
                case nil:
                    next += 1
                    handle = next
                }
                configured[handle] = wanted
                if !pool.put(handle, options: wanted) { configured[handle] = nil }
                #expect(pool.count <= 3)
            }
        }
    }

    @Test func aFullPoolRefuses_removeAllEmptiesIt() {
        var pool = IdleHandlePool<Int>(capacity: 2)
        #expect(put(&pool, 1, Self.plain))
        #expect(put(&pool, 2, Self.caA))
        #expect(!put(&pool, 3, Self.caB))
        let all = pool.removeAll()
        #expect(Set(all) == [1, 2])
        #expect(pool.count == 0)
    }
}
