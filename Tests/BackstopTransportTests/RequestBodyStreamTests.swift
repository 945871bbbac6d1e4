import BackstopCore
import Foundation
import NIOConcurrencyHelpers
import NIOCore
import Testing

@testable import BackstopTransport

/// The streamed request body between a client's event loop and the transport thread: every byte comes out once, in
/// order, whatever the chunk sizes and the reads' sizes; small chunks and slices of larger buffers are copied into
/// the stream's own buffers; backpressure stops and resumes the producer at its marks.
@Suite("Request body stream")
struct RequestBodyStreamTests {
    /// Chunks of random sizes (1 byte to 100 KiB), some of them slices of larger buffers, read back through random
    /// read sizes while more are appended.
    @Test("every byte once and in order, whatever the chunk and read sizes", arguments: [1, 2, 3] as [UInt64])
    func order(seed: UInt64) {
        var random = SplitMix64(seed: seed)
        let stream = RequestBodyStream(expectedLength: nil, highWater: .max, lowWater: 0, onDrained: {})
        var sent: [UInt8] = []
        var received: [UInt8] = []
        var destination = [UInt8](repeating: 0, count: 200_000)
        func drain(upTo limit: Int) {
            destination.withUnsafeMutableBytes { raw in
                let window = UnsafeMutableRawBufferPointer(rebasing: raw[0..<limit])
                if case .bytes(let n) = stream.read(into: window) { received += window[0..<n] }
            }
        }
        for round in 0..<400 {
            let size = round % 7 == 0 ? Int(random.next() % 100_000) + 1 : Int(random.next() % 64) + 1
            let bytes = (0..<size).map { _ in UInt8(truncatingIfNeeded: random.next()) }
            sent += bytes
            var chunk = ByteBuffer(bytes: Array(repeating: 0xEE, count: Int(random.next() % 3)) + bytes)
            chunk.moveReaderIndex(forwardBy: chunk.readableBytes - size)  // a slice of a larger buffer
            #expect(stream.append(chunk))
            if random.next() % 3 == 0 { drain(upTo: Int(random.next() % 150_000) + 1) }
        }
        stream.finish()
        while received.count < sent.count { drain(upTo: Int(random.next() % 150_000) + 1) }
        #expect(received == sent)
        destination.withUnsafeMutableBytes { raw in
            if case .end = stream.read(into: raw) {} else { Issue.record("not at its end") }
        }
    }

    /// Each wake-up of a paused consumer used to wrap the stored resume closure in one more thunk: 20,000 wake-ups
    /// (a body of 1-byte chunks) made a chain whose release overflowed the transport thread's 1 MiB stack. Released
    /// here on a thread with 256 KiB: with the chain back, this test crashes.
    @Test("20,000 wake-ups of a paused consumer: each resumes it once, and the stream is released on a small stack")
    func manyWakeUps() async {
        let resumed = NIOLockedValueBox(0)
        var stream: RequestBodyStream? = RequestBodyStream(expectedLength: nil, onDrained: {})
        stream!.setResumeConsumer { resumed.withLockedValue { $0 += 1 } }
        var destination = [UInt8](repeating: 0, count: 16)
        for _ in 0..<20_000 {
            let paused = destination.withUnsafeMutableBytes { stream!.read(into: $0) }
            guard case .pause = paused else {
                Issue.record("the consumer did not pause on an empty stream")
                return
            }
            stream!.append(ByteBuffer(bytes: [0x61]))
            _ = destination.withUnsafeMutableBytes { stream!.read(into: $0) }
        }
        #expect(resumed.withLockedValue { $0 } == 20_000)
        let holder = NIOLockedValueBox(stream)
        stream = nil
        await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
            let thread = Thread {
                holder.withLockedValue { $0 = nil }  // the last reference, released on this thread
                done.resume()
            }
            thread.stackSize = 256 << 10
            thread.start()
        }
    }

    @Test("the producer stops at the high mark and is told once the transport drained below the low mark")
    func backpressure() {
        let drained = NIOLockedValueBox(0)
        let stream = RequestBodyStream(
            expectedLength: nil, highWater: 1000, lowWater: 100, onDrained: { drained.withLockedValue { $0 += 1 } })
        for _ in 0..<99 { #expect(stream.append(ByteBuffer(bytes: Array(repeating: 1, count: 10)))) }
        #expect(!stream.append(ByteBuffer(bytes: Array(repeating: 1, count: 10))), "1000 bytes: stop")
        var destination = [UInt8](repeating: 0, count: 850)
        _ = destination.withUnsafeMutableBytes { stream.read(into: $0) }
        #expect(drained.withLockedValue { $0 } == 0, "150 left: not below the low mark")
        _ = destination.withUnsafeMutableBytes {
            stream.read(into: UnsafeMutableRawBufferPointer(rebasing: $0[0..<100]))
        }
        #expect(drained.withLockedValue { $0 } == 1)
    }
}
