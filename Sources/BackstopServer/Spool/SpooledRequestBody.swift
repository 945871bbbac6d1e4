import BackstopQueue
import BackstopTransport
import NIOCore

/// Where request bodies too large for memory are kept for retries: `spool.dir` and the `spool.max_bytes` budget that
/// queued deliveries share (docs/reference/behaviour.md#spooled-bodies).
public struct BodySpool: Sendable {
    public let directory: String
    public let budget: SpoolBudget

    public init(directory: String, budget: SpoolBudget) {
        self.directory = directory
        self.budget = budget
    }
}

/// A request body written to the spool as it arrives, so that every attempt (the first, a retry, a hedge) can send
/// it from its first byte (docs/reference/behaviour.md#spooled-bodies). The bytes live in a `SpooledBody` (a nameless
/// file of sealed 64 KiB chunks under a key held only in memory); each attempt gets its own `RequestBodyStream`, fed
/// from its own reader as the transport drains it, so memory holds at most one stream's high-water mark and one chunk
/// per attempt, whatever the size. The client is never held back for the upstream's sake: what arrives goes to disk.
///
/// The whole body's sealed size (its declared length, else `limits.max_request_body`) is reserved in `spool.max_bytes`
/// before the first byte is written, and given back when the request ends (`close`): a body that does not fit is not
/// spooled at all, rather than failing half way. Confined to the connection's event loop.
final class SpooledRequestBody {
    /// One attempt's copy of the body: its stream (what the transport reads) and where it is in the spool.
    private final class Lane {
        let stream: RequestBodyStream
        var reader: SpoolReader
        /// The stream is above its high-water mark: wait for its `onDrained`.
        var full = false
        var done = false

        init(stream: RequestBodyStream, reader: SpoolReader) {
            self.stream = stream
            self.reader = reader
        }
    }

    private let body: SpooledBody
    private let spool: BodySpool
    private let eventLoop: any EventLoop
    private let expectedLength: Int?
    /// Bytes of `spool.max_bytes` held until `close`.
    private var reserved: Int
    private var lanes: [Lane] = []
    private var failed = false
    /// Bytes moved from the spool into a stream at a time.
    static let readSize = SpooledBody.defaultChunkSize

    /// A spooled body for a request whose body is `expectedLength` bytes when declared, else at most `maxLength`;
    /// nil when `spool.max_bytes` has no room for it or no file can be made in the spool (it then streams unkept).
    static func make(
        spool: BodySpool, expectedLength: Int?, maxLength: Int, eventLoop: any EventLoop
    ) -> SpooledRequestBody? {
        let size = sealedSize(of: expectedLength ?? maxLength, chunkSize: SpooledBody.defaultChunkSize)
        guard spool.budget.reserve(size) else { return nil }
        do {
            // The body's own budget is the reservation just made: its chunks never reserve anything twice.
            let body = try SpooledBody(directory: spool.directory, budget: SpoolBudget(limit: max(size, 1)))
            return SpooledRequestBody(
                body: body, spool: spool, eventLoop: eventLoop, expectedLength: expectedLength, reserved: size)
        } catch {
            spool.budget.release(size)
            return nil
        }
    }

    /// What `length` plaintext bytes take in the spool: each chunk carries a 16-byte tag, and the last chunk is
    /// always written (empty when the length is a multiple of the chunk size).
    static func sealedSize(of length: Int, chunkSize: Int) -> Int {
        length + (length / chunkSize + 1) * SpooledBody.tagSize
    }

    private init(
        body: SpooledBody, spool: BodySpool, eventLoop: any EventLoop, expectedLength: Int?, reserved: Int
    ) {
        self.body = body
        self.spool = spool
        self.eventLoop = eventLoop
        self.expectedLength = expectedLength
        self.reserved = reserved
    }

    /// Writes `part` to the spool and feeds the attempts. False when the spool failed (its disk is full, a write
    /// failed): the body is no longer kept, and the attempts reading it fail.
    func append(_ part: ByteBuffer) -> Bool {
        guard !failed else { return false }
        // withUnsafeReadableBytes rethrows untyped errors: the typed one comes out as a value.
        let failure = part.withUnsafeReadableBytes { raw -> SpoolError? in
            do throws(SpoolError) {
                try body.append(raw)
                return nil
            } catch {
                return error
            }
        }
        if failure != nil {
            fail()
            return false
        }
        pump()
        return true
    }

    /// The last byte arrived. False when the spool failed.
    func finish() -> Bool {
        guard !failed else { return false }
        do throws(SpoolError) {
            try body.finish()
        } catch {
            fail()
            return false
        }
        pump()
        return true
    }

    /// A stream that sends the body from its first byte, for a new attempt.
    func attemptBody() -> RequestBodyStream {
        let loop = NIOLoopBound(self, eventLoop: eventLoop)
        let eventLoop = self.eventLoop
        let laneIndex = lanes.count
        let stream = RequestBodyStream(expectedLength: expectedLength ?? body.finishedLength) {
            // On the transport's thread: the stream drained below its low-water mark.
            eventLoop.execute {
                let spooled = loop.value
                guard spooled.lanes.indices.contains(laneIndex) else { return }
                spooled.lanes[laneIndex].full = false
                spooled.pump()
            }
        }
        let lane = Lane(stream: stream, reader: body.makeReader())
        lanes.append(lane)
        if failed {
            stream.fail()
            lane.done = true
        } else {
            pump()
        }
        return stream
    }

    /// The request ended: attempts still reading are failed, the spool's bytes go back to `spool.max_bytes` (the
    /// file itself is freed when the last reference to it goes).
    func close() {
        for lane in lanes where !lane.done { lane.stream.fail() }
        lanes = []
        failed = true
        if reserved > 0 { spool.budget.release(reserved) }
        reserved = 0
    }

    private func fail() {
        failed = true
        for lane in lanes where !lane.done {
            lane.stream.fail()
            lane.done = true
        }
    }

    /// Moves what each attempt can take from the spool into its stream.
    private func pump() {
        for lane in lanes where !lane.done && !lane.full {
            feed(lane)
        }
    }

    private func feed(_ lane: Lane) {
        while !lane.full {
            var buffer = ByteBufferAllocator().buffer(capacity: Self.readSize)
            var result = Result<SpoolReader.ReadResult, SpoolError>.success(.pending)
            buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: Self.readSize) { raw in
                do throws(SpoolError) {
                    let read = try lane.reader.read(
                        into: UnsafeMutableRawBufferPointer(rebasing: raw[..<Self.readSize]))
                    result = .success(read)
                    if case .bytes(let n) = read { return n }
                } catch {
                    result = .failure(error)
                }
                return 0
            }
            switch result {
            case .success(.bytes):
                if !lane.stream.append(buffer) { lane.full = true }
            case .success(.pending):
                return
            case .success(.end):
                lane.stream.finish()
                lane.done = true
                return
            case .failure:
                // A chunk that does not open (the file was altered) or cannot be read: this attempt fails, and so
                // would any other.
                fail()
                return
            }
        }
    }
}
