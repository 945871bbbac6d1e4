import BackstopCore
import NIOCore

/// What an `Exchange` asks of its client connection (`ExchangeClient`): writing the response, ending it, failing
/// it with a local answer, and holding or releasing the request body's reads.
extension ProxyHandler {
    var allocator: ByteBufferAllocator { context?.channel.allocator ?? ByteBufferAllocator() }

    var isWritable: Bool { context?.channel.isWritable ?? false }

    func writeResponse(_ buffer: ByteBuffer) {
        guard let context else { return }
        connection.responseStarted()
        context.write(wrapOutboundOut(buffer), promise: nil)
    }

    func flush() { context?.flush() }

    func writeResponseEnd(tail: ByteBuffer?, requestComplete: Bool, close: Bool) {
        exchange = nil
        let now = self.now
        releaseReads(now: now)
        guard let context else { return }
        let close = close || closeAfterResponse || !requestComplete
        if !requestComplete { connection.discardRequest() }
        let resumeReading = connection.responseEnded(close: close, now: now)
        if let tail { context.write(wrapOutboundOut(tail), promise: nil) }
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
