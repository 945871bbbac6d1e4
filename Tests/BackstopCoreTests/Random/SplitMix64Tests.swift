import Testing

@testable import BackstopCore

@Suite("SplitMix64")
struct SplitMix64Tests {
    @Test("a seed replays the reference sequence (seed 0: e220a8397b1dcdaf, 6e789e6aa1b965f4, 06c45d188009454f)")
    func referenceSequence() {
        var random = SplitMix64(seed: 0)
        #expect(
            [random.next(), random.next(), random.next()] == [
                0xE220_A839_7B1D_CDAF, 0x6E78_9E6A_A1B9_65F4, 0x06C4_5D18_8009_454F,
            ])
    }

    @Test("generators seeded from the system start apart, and each draws what its seed says")
    func systemSeeded() {
        var first = SplitMix64()
        var second = SplitMix64()
        let a = (0..<4).map { _ in first.next() }
        let b = (0..<4).map { _ in second.next() }
        #expect(a != b, "two daemons' jitter must not move in step")
        #expect(Set(a).count == 4)
    }
}
