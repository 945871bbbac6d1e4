import Testing

@testable import BackstopCore

@Suite("System random bytes")
struct SystemRandomTests {
    @Test("exactly the count asked for, every byte value reachable, calls apart", arguments: [0, 1, 7, 8, 9, 16, 33])
    func bytes(count: Int) {
        let draws = (0..<64).map { _ in SystemRandom.bytes(count) }
        #expect(draws.allSatisfy { $0.count == count })
        if count >= 8 { #expect(Set(draws).count == draws.count) }
        if count == 33 {
            // 64 × 33 uniform bytes cover both halves of every bit position; a truncation bug or a zero fill would not.
            for bit in 0..<8 {
                let set = draws.joined().filter { $0 & (1 << bit) != 0 }.count
                #expect((600...1_512).contains(set), "bit \(bit): \(set) of 2112")
            }
        }
    }
}
