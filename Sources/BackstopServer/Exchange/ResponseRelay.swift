import BackstopCore
import NIOCore

/// The framing counter of one response to the client: the framing its head announced
/// (docs/reference/behaviour.md#forwarding) and the guarantee that the client never gets more body bytes than that
/// framing announced, whatever the upstream sends (docs/reference/behaviour.md#untrusted-upstream-responses). Pure:
/// it decides which bytes go out and how they are framed; `ConnectionStateMachine` turns its answers into events
/// (an overlong or short body is `framingBroken`) and `ProxyHandler` writes the bytes.
struct ResponseRelay: Equatable {
    enum Outcome: Equatable {
        /// Write these bytes (none when empty), as an HTTP/1.1 chunk when `chunk` says so.
        case write(ByteBuffer, chunk: Chunk?)
        /// The body ran past its announced `Content-Length`: only `allowed` (the announced rest, if any) may go out,
        /// then the connection must close.
        case overran(allowed: ByteBuffer?)
    }

    /// An HTTP/1.1 chunk: `first` has no CRLF before its size line.
    struct Chunk: Equatable { var first: Bool }

    /// The last chunk of a chunked body; `afterChunks`: a CRLF ends the previous chunk first.
    struct LastChunk: Equatable { var afterChunks: Bool }

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

    /// What of `buffer` goes to the client, and how.
    mutating func relay(_ buffer: ByteBuffer) -> Outcome {
        let count = buffer.readableBytes
        guard count > 0 else { return .write(buffer, chunk: nil) }
        switch framing {
        case .chunked:
            let chunk = Chunk(first: !sentChunk)
            sentChunk = true
            bytes += count
            return .write(buffer, chunk: chunk)
        case .closeDelimited:
            bytes += count
            return .write(buffer, chunk: nil)
        case .contentLength:
            guard count <= remaining else {
                let allowed = remaining > 0 ? buffer.getSlice(at: buffer.readerIndex, length: remaining) : nil
                bytes += remaining
                remaining = 0
                return .overran(allowed: allowed)
            }
            remaining -= count
            bytes += count
            return .write(buffer, chunk: nil)
        case .bodyless:
            // curl delivers none; a stray byte must not corrupt the connection.
            return .write(ByteBuffer(), chunk: nil)
        }
    }

    /// The body ended short of its `Content-Length`: the client would wait for the rest, or read the next response
    /// as body.
    var fellShort: Bool {
        if case .contentLength = framing { return remaining > 0 }
        return false
    }

    /// The closing bytes of a chunked body.
    var lastChunk: LastChunk? {
        guard case .chunked = framing else { return nil }
        return LastChunk(afterChunks: sentChunk)
    }
}
