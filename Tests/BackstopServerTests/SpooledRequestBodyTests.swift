import BackstopQueue
import Testing

@testable import BackstopServer

/// What a spooled body reserves in `spool.max_bytes` (docs/reference/behaviour.md#spooled-bodies): its length plus a
/// 16-byte tag per 64 KiB chunk, the last chunk always written.
@Suite("Spooled request body")
struct SpooledRequestBodyTests {
    @Test(
        "the sealed size counts one tag per chunk and always a last chunk",
        arguments: [
            (0, 16), (1, 17), (65_535, 65_551), (65_536, 65_568), (65_537, 65_569), (8 << 20, (8 << 20) + 129 * 16),
        ])
    func sealedSize(length: Int, expected: Int) {
        #expect(SpooledRequestBody.sealedSize(of: length, chunkSize: 65_536) == expected)
        #expect(SpooledBody.tagSize == 16)
    }
}
