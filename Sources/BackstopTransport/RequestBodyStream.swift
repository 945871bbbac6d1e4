import NIOConcurrencyHelpers
import NIOCore

/// A request body that is still arriving from the client while it is being sent upstream.
///
/// The client side (an event loop) appends chunks; the transport thread drains them from curl's read callback.
/// Backpressure both ways: `append` returns false when the buffer is above its high-water mark (the client side
/// then stops reading from its socket), and `onDrained` fires once the transport has drained it below the low mark.
public final class RequestBodyStream: Sendable {
    private struct State {
        /// Taken from the front one by one: a ring, so that is O(1) whatever the count (an array's `removeFirst` made
        /// a body of 1-byte chunks quadratic on the transport thread, which every upstream shares).
        var chunks = CircularBuffer<ByteBuffer>()
        /// A buffer of the stream's own after `chunks`, which small chunks are copied into. Held here rather than in
        /// the ring: written through the ring's subscript (a get and a set), it would be copied at each write.
        var tail: ByteBuffer?
        var bufferedBytes = 0
        var finished = false
        var failed = false
        /// curl returned CURL_READFUNC_PAUSE and waits for an unpause.
        var consumerPaused = false
        /// `append` told the producer to stop; tell it when drained.
        var producerStopped = false
    }

    private let state = NIOLockedValueBox(State())
    private let highWater: Int
    private let lowWater: Int
    /// Called (from the transport thread) when a stopped producer may resume.
    private let onDrained: @Sendable () -> Void
    /// Set by the transport when it starts sending; called to unpause curl after new data arrives. Held in a class:
    /// a closure kept directly in the lock's generic storage was wrapped in one more reabstraction thunk at each
    /// `withLockedValue` that passed it `inout`, once per wake-up, so a body of 1-byte chunks grew a chain of
    /// thousands whose release overflowed the transport thread's stack (a crash any client could cause).
    private let resumeConsumer = NIOLockedValueBox<Consumer?>(nil)

    private final class Consumer: Sendable {
        let resume: @Sendable () -> Void
        init(_ resume: @escaping @Sendable () -> Void) { self.resume = resume }
    }

    /// Stop reading from the client when this many body bytes wait for the upstream; resume below `lowWater`.
    public static let highWater = 256 << 10
    public static let lowWater = 64 << 10

    /// The body's length when the client declared it (`Content-Length`), else nil (sent chunked).
    public let expectedLength: Int?

    public init(
        expectedLength: Int?, highWater: Int = RequestBodyStream.highWater, lowWater: Int = RequestBodyStream.lowWater,
        onDrained: @escaping @Sendable () -> Void
    ) {
        self.expectedLength = expectedLength
        self.highWater = highWater
        self.lowWater = lowWater
        self.onDrained = onDrained
    }

    /// A chunk smaller than this, or one that holds on to much more memory than it reads (a slice of a larger read
    /// buffer), is copied into a buffer of the stream's own, of `ownBufferSize`: what the stream holds in memory
    /// then stays near what it counts, whatever the client's chunk sizes.
    static let copiedBelow = 16 << 10
    static let ownBufferSize = 64 << 10

    /// Adds a chunk. Returns false when the producer should pause until `onDrained`.
    @discardableResult
    public func append(_ chunk: ByteBuffer) -> Bool {
        let (wake, keepGoing) = state.withLockedValue { s -> (Bool, Bool) in
            let count = chunk.readableBytes
            if count < Self.copiedBelow || chunk.storageCapacity - count > count / 8 {
                if s.tail == nil || s.tail!.writableBytes < count {
                    if let full = s.tail { s.chunks.append(full) }
                    s.tail = ByteBufferAllocator().buffer(capacity: max(Self.ownBufferSize, count))
                }
                s.tail!.writeImmutableBuffer(chunk)
            } else {
                if let tail = s.tail {
                    s.chunks.append(tail)
                    s.tail = nil
                }
                s.chunks.append(chunk)
            }
            s.bufferedBytes += count
            let wake = s.consumerPaused
            s.consumerPaused = false
            let keepGoing = s.bufferedBytes < highWater
            if !keepGoing { s.producerStopped = true }
            return (wake, keepGoing)
        }
        if wake { resumeConsumer.withLockedValue { $0 }?.resume() }
        return keepGoing
    }

    /// Marks the end of the body.
    public func finish() {
        let wake = state.withLockedValue { s -> Bool in
            s.finished = true
            let wake = s.consumerPaused
            s.consumerPaused = false
            return wake
        }
        if wake { resumeConsumer.withLockedValue { $0 }?.resume() }
    }

    /// Marks the body as broken (client gone); the transfer aborts.
    public func fail() {
        let wake = state.withLockedValue { s -> Bool in
            s.failed = true
            let wake = s.consumerPaused
            s.consumerPaused = false
            return wake
        }
        if wake { resumeConsumer.withLockedValue { $0 }?.resume() }
    }

    func setResumeConsumer(_ resume: @escaping @Sendable () -> Void) {
        let consumer = Consumer(resume)
        resumeConsumer.withLockedValue { $0 = consumer }
    }

    /// What curl's read callback should do.
    enum ReadResult {
        case bytes(Int)
        case pause
        case end
        case abort
    }

    /// Copies up to `capacity` bytes into `destination` (transport thread).
    func read(into destination: UnsafeMutableRawBufferPointer) -> ReadResult {
        var notifyDrained = false
        let result = state.withLockedValue { s -> ReadResult in
            if s.failed { return .abort }
            var written = 0
            while written < destination.count {
                let taken: Int
                if var first = s.chunks.popFirst() {
                    taken = Self.copy(from: &first, into: destination, at: written)
                    if first.readableBytes > 0 { s.chunks.prepend(first) }
                } else if s.tail != nil, s.tail!.readableBytes > 0 {
                    taken = Self.copy(from: &s.tail!, into: destination, at: written)
                    // Drained: written from its start again rather than replaced.
                    if s.tail!.readableBytes == 0 { s.tail!.clear() }
                } else {
                    break
                }
                written += taken
            }
            s.bufferedBytes -= written
            if s.producerStopped && s.bufferedBytes < lowWater {
                s.producerStopped = false
                notifyDrained = true
            }
            if written > 0 { return .bytes(written) }
            if s.finished { return .end }
            s.consumerPaused = true
            return .pause
        }
        if notifyDrained { onDrained() }
        return result
    }

    /// Copies what fits of `buffer`'s readable bytes into `destination` from `offset`, and consumes them.
    private static func copy(
        from buffer: inout ByteBuffer, into destination: UnsafeMutableRawBufferPointer, at offset: Int
    ) -> Int {
        let n = min(destination.count - offset, buffer.readableBytes)
        buffer.withUnsafeReadableBytes { source in
            UnsafeMutableRawBufferPointer(rebasing: destination[offset..<(offset + n)])
                .copyMemory(from: UnsafeRawBufferPointer(rebasing: source[0..<n]))
        }
        buffer.moveReaderIndex(forwardBy: n)
        return n
    }
}
