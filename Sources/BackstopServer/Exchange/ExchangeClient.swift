import BackstopCore
import NIOCore

/// What an exchange needs from its client connection: writing the response, ending it, answering with an error,
/// holding reads for upload backpressure, and the connection's timer. `ProxyHandler` implements it; unit tests use a
/// recording fake. Called on the connection's event loop only.
protocol ExchangeClient: AnyObject {
    var allocator: ByteBufferAllocator { get }
    /// Whether the client socket takes more bytes without queueing past the channel's high-water mark.
    var isWritable: Bool { get }
    /// The request is HTTP/1.0 (its response is written as 1.0 and cannot be chunked).
    var clientIsHTTP10: Bool { get }
    /// The client asked to close after this response.
    var closeAfterResponse: Bool { get }
    /// Response bytes (a head, framing, body data), not yet flushed.
    func writeResponse(_ buffer: ByteBuffer)
    func flush()
    /// The response is complete (`tail` ends its framing); `close` that the connection must close after it.
    func writeResponseEnd(tail: ByteBuffer?, requestComplete: Bool, close: Bool)
    /// The response broke after its head: the only honest signal left is closing the connection.
    func abortResponse()
    /// Answer with a Backstop error; `attempts` upstream attempts were made (nil for none).
    func exchangeFailed(_ reason: ProxyErrorReason, requestComplete: Bool, attempts: Int?)
    /// Stop reading from the client (a streamed upload is above its high-water mark), and resume.
    func holdReads()
    func releaseReads()
    /// Make sure the connection's timer fires no later than `deadline` (monotonic, `BackstopClock` terms).
    func wakeUp(at deadline: Duration)
}
