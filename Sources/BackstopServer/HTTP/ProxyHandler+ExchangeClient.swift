import BackstopCore
import NIOCore

/// What an `Exchange` asks of its client connection (`ExchangeClient`): writing the response, ending it, failing
/// it with a local answer, and holding or releasing the request body's reads.
extension ProxyHandler {
    var allocator: ByteBufferAllocator { context?.channel.allocator ?? ByteBufferAllocator() }

    var isWritable: Bool { context?.channel.isWritable ?? false }

    /// Response bytes up to this many are held until the next flush (`heldResponse`); larger buffers go out as
    /// they are, never copied.
    static let coalescingLimit = 16 * 1024

    func writeResponse(_ buffer: ByteBuffer) {
        guard let context else { return }
        connection.responseStarted()
        write(buffer, context)
    }

    /// Appends `buffer` to the held bytes while they stay small, else writes the held bytes and then `buffer` (or
    /// holds it, when it is small itself).
    private func write(_ buffer: ByteBuffer, _ context: ChannelHandlerContext) {
        if let held = heldResponse?.readableBytes {
            if held + buffer.readableBytes <= Self.coalescingLimit {
                heldResponse!.writeImmutableBuffer(buffer)  // in place: the handler holds the only reference
                return
            }
            writeHeldResponse(context)
        }
        if buffer.readableBytes < Self.coalescingLimit {
            heldResponse = buffer
        } else {
            context.write(wrapOutboundOut(buffer), promise: nil)
        }
    }

    /// Writes the held bytes, if any: before a flush, and before anything written past `write`.
    func writeHeldResponse(_ context: ChannelHandlerContext) {
        guard let held = heldResponse else { return }
        heldResponse = nil
        context.write(wrapOutboundOut(held), promise: nil)
    }

    func flush() {
        guard let context else { return }
        writeHeldResponse(context)
        context.flush()
    }

    func writeResponseEnd(tail: ByteBuffer?, requestComplete: Bool, close: Bool) {
        exchange = nil
        let now = self.now
        releaseReads(now: now)
        guard let context else { return }
        let close = close || closeAfterResponse || !requestComplete
        if !requestComplete { connection.discardRequest() }
        let resumeReading = connection.responseEnded(close: close, now: now)
        if let tail { write(tail, context) }
        writeHeldResponse(context)
        if close {
            let channel = context.channel
            context.writeAndFlush(wrapOutboundOut(channel.allocator.buffer(capacity: 0))).whenComplete { _ in
                channel.close(promise: nil)
            }
        } else {
            context.flush()
        }
        if resumeReading { context.read() }
        requestMayBeDone(now: now)
    }

    func abortResponse() {
        exchange = nil
        heldResponse = nil  // never flushed: the connection closes on a broken response
        connection.close()
        context?.close(promise: nil)
    }

    func exchangeFailed(_ reason: ProxyErrorReason, requestComplete: Bool, attempts: Int?) {
        exchange = nil
        releaseReads(now: now)
        if !requestComplete { connection.discardRequest() }
        sendLocalError(reason, close: closeAfterResponse || !requestComplete, attempts: attempts)
    }

    func holdReads() { connection.holdUploads() }

    func releaseReads() { releaseReads(now: now) }

    func releaseReads(now: Duration) {
        if connection.releaseUploads(now: now) { context?.read() }
    }
}
