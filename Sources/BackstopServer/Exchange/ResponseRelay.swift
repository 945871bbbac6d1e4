import BackstopCore
import NIOCore

/// How one response's body goes to the client: the framing its head announced (docs/reference/behaviour.md#forwarding)
/// and the guarantee that the client never gets more body bytes than that framing announced, whatever the
/// upstream sends (docs/reference/behaviour.md#untrusted-upstream-responses). Pure: it only shapes bytes.
struct ResponseRelay {
    enum Outcome: Equatable {
        /// This many body bytes went out.
        case written(Int)
        /// The body ran past its announced `Content-Length`: exactly the announced bytes went out; the connection
        /// must close.
        case overran
    }

    let framing: ResponseFraming
    /// Body bytes the client may still get under the `Content-Length` it was told.
    private var remaining: Int
    private var sentChunk = false
    /// Body bytes sent to the client.
    private(set) var bytes = 0

    init(framing: ResponseFraming) {
        self.framing = framing
        if case .contentLength(let length) = framing { remaining = length } else { remaining = 0 }
    }

    /// Frames `buffer` for the client through `write`.
    mutating func relay(_ buffer: ByteBuffer, allocator: ByteBufferAllocator, write: (ByteBuffer) -> Void) -> Outcome {
        let count = buffer.readableBytes
        guard count > 0 else { return .written(0) }
        switch framing {
        case .chunked:
            var prefix = allocator.buffer(capacity: 24)
            ResponseHeadWriter.chunkPrefix(&prefix, size: count, first: !sentChunk)
            sentChunk = true
            write(prefix)
            write(buffer)
        case .closeDelimited:
            write(buffer)
        case .contentLength:
            guard count <= remaining else {
                if remaining > 0 { write(buffer.getSlice(at: buffer.readerIndex, length: remaining)!) }
                bytes += remaining
                remaining = 0
                return .overran
            }
            remaining -= count
            write(buffer)
        case .bodyless:
            return .written(0)  // curl delivers none; a stray byte must not corrupt the connection
        }
        bytes += count
        return .written(count)
    }

    /// The end of the body: its closing bytes (the last chunk), or nil when the body ended short of its
    /// `Content-Length` (the client would wait for the rest, or read the next response as body: close instead).
    func end(allocator: ByteBufferAllocator) -> (tail: ByteBuffer?, short: Bool) {
        switch framing {
        case .contentLength where remaining > 0:
            return (nil, true)
        case .chunked:
            var end = allocator.buffer(capacity: 8)
            ResponseHeadWriter.chunkedEnd(&end, afterChunks: sentChunk)
            return (end, false)
        case .contentLength, .closeDelimited, .bodyless:
            return (nil, false)
        }
    }
}
