import CCurl
import NIOCore
import Synchronization

/// One upstream attempt in flight: an easy handle, its callbacks' state, and the handle the exchange uses to
/// cancel it or report consumed body bytes (backpressure).
///
/// `@unchecked Sendable` because of the `var`s below: every one of them is read and written only on the
/// transport thread (curl callbacks run there, and so do `start`/`finish`, called from the transport loop).
/// What other threads may call — `cancel()` and `consumed(_:)` — touches only the atomics and the transport's
/// locked command queue.
public final class CurlTransfer: @unchecked Sendable {
    /// Pause the upstream read when this many body bytes are delivered but not yet written to the client.
    static let highWater = 1 << 20
    /// Resume once the client side has caught up to this.
    static let lowWater = 256 << 10

    let request: TransportRequest
    let eventLoop: EventLoop
    let sink: @Sendable ([TransportEvent]) -> Void
    unowned let transport: CurlMultiTransport

    // Transport-thread state.
    var easy: UnsafeMutableRawPointer?
    var headerList: UnsafeMutablePointer<curl_slist>?
    var bufferedBody: ByteBuffer?
    var pending: [TransportEvent] = []
    var isDirty = false
    var headStatus = 0
    var headVersion = ""
    var headHeaders: [(name: String, value: String)] = []
    var headDelivered = false
    var finished = false
    var cancelledByUser = false

    // Cross-thread state.
    let unconsumedBytes = Atomic<Int>(0)
    let receivePaused = Atomic<Bool>(false)
    let cancelRequested = Atomic<Bool>(false)

    init(request: TransportRequest, eventLoop: EventLoop, transport: CurlMultiTransport,
         sink: @escaping @Sendable ([TransportEvent]) -> Void) {
        self.request = request
        self.eventLoop = eventLoop
        self.transport = transport
        self.sink = sink
        if case .buffered(let buffer) = request.body { self.bufferedBody = buffer }
    }

    /// Stops the attempt; a `.failure(.cancelled)` event follows unless it already ended.
    public func cancel() {
        if cancelRequested.exchange(true, ordering: .acquiringAndReleasing) { return }
        transport.submit(.cancel(self))
    }

    /// The exchange wrote `bytes` of delivered body to the client; may resume a paused upstream read.
    public func consumed(_ bytes: Int) {
        let now = unconsumedBytes.subtract(bytes, ordering: .acquiringAndReleasing).newValue
        if now < Self.lowWater,
            receivePaused.compareExchange(expected: true, desired: false, ordering: .acquiringAndReleasing).exchanged
        {
            transport.submit(.resumeReceive(self))
        }
    }

    // MARK: transport thread

    func emit(_ event: TransportEvent) {
        if case .body(var incoming) = event, case .body(var last)? = pending.last {
            pending.removeLast()
            last.writeBuffer(&incoming)
            pending.append(.body(last))
        } else {
            pending.append(event)
        }
        if !isDirty {
            isDirty = true
            transport.markDirty(self)
        }
    }

    func flush() {
        isDirty = false
        guard !pending.isEmpty else { return }
        let events = pending
        pending = []
        let sink = self.sink
        eventLoop.execute { sink(events) }
    }

    /// Header callback: one line at a time, including the status line and the blank line ending the head.
    func onHeaderLine(_ line: UnsafeRawBufferPointer) {
        var end = line.count
        while end > 0, line[end - 1] == 0x0A || line[end - 1] == 0x0D { end -= 1 }
        if end == 0 {
            // End of a head. 1xx interim heads (100 Continue, 103 Early Hints) are not forwarded.
            if headStatus >= 200 || headStatus == 101 {
                if !headDelivered {
                    headDelivered = true
                    emit(.head(TransportResponseHead(status: headStatus, httpVersion: headVersion, headers: headHeaders)))
                }
            }
            headHeaders = []
            return
        }
        // Parsed on the bytes: this runs for every header line of every response.
        if end > 5, line[0] == 0x48, line[1] == 0x54, line[2] == 0x54, line[3] == 0x50, line[4] == 0x2F {  // "HTTP/"
            // Status line: "HTTP/1.1 200 OK" or "HTTP/2 200".
            var space = 5
            while space < end, line[space] != 0x20 { space += 1 }
            headVersion = String(decoding: UnsafeRawBufferPointer(rebasing: line[0..<space]), as: UTF8.self)
            var status = 0
            var i = space + 1
            var digits = 0
            while i < end, line[i] >= 0x30, line[i] <= 0x39, digits < 3 {
                status = status * 10 + Int(line[i] - 0x30)
                i += 1
                digits += 1
            }
            headStatus = digits == 3 ? status : 0
            headHeaders = []
            return
        }
        if line[0] == 0x20 || line[0] == 0x09 {
            // Obsolete line folding from the upstream: join with a space (RFC 9112 §5.2).
            guard !headHeaders.isEmpty else { return }
            let (start, stop) = Self.trimmed(line, 0, end)
            let folded = String(decoding: UnsafeRawBufferPointer(rebasing: line[start..<stop]), as: UTF8.self)
            headHeaders[headHeaders.count - 1].value += " " + folded
            return
        }
        var colon = 0
        while colon < end, line[colon] != 0x3A { colon += 1 }
        guard colon < end else { return }
        let name = String(decoding: UnsafeRawBufferPointer(rebasing: line[0..<colon]), as: UTF8.self)
        let (start, stop) = Self.trimmed(line, colon + 1, end)
        let value = String(decoding: UnsafeRawBufferPointer(rebasing: line[start..<stop]), as: UTF8.self)
        headHeaders.append((name: name, value: value))
    }

    /// The range `from..<to` of `line` without leading and trailing spaces and tabs.
    private static func trimmed(_ line: UnsafeRawBufferPointer, _ from: Int, _ to: Int) -> (Int, Int) {
        var start = from
        var stop = to
        while start < stop, line[start] == 0x20 || line[start] == 0x09 { start += 1 }
        while stop > start, line[stop - 1] == 0x20 || line[stop - 1] == 0x09 { stop -= 1 }
        return (start, stop)
    }

    /// Write callback: returns the number of bytes taken, or `nil` to pause.
    func onBody(_ data: UnsafeRawBufferPointer) -> Bool {
        if unconsumedBytes.load(ordering: .acquiring) >= Self.highWater {
            receivePaused.store(true, ordering: .sequentiallyConsistent)
            // The client may have caught up in between; if it took the flag back, keep going ourselves.
            if unconsumedBytes.load(ordering: .sequentiallyConsistent) < Self.lowWater,
                receivePaused.compareExchange(expected: true, desired: false, ordering: .sequentiallyConsistent)
                    .exchanged
            {
                // fall through and take the data
            } else {
                return false
            }
        }
        var buffer = transport.allocator.buffer(capacity: data.count)
        buffer.writeBytes(data)
        unconsumedBytes.add(data.count, ordering: .acquiringAndReleasing)
        emit(.body(buffer))
        return true
    }

    func readBody(into destination: UnsafeMutableRawBufferPointer) -> RequestBodyStream.ReadResult {
        switch request.body {
        case .empty:
            return .end
        case .buffered:
            guard var body = bufferedBody, body.readableBytes > 0 else { return .end }
            let n = min(destination.count, body.readableBytes)
            body.withUnsafeReadableBytes { src in
                destination.copyMemory(from: UnsafeRawBufferPointer(rebasing: src[0..<n]))
            }
            body.moveReaderIndex(forwardBy: n)
            bufferedBody = body
            return .bytes(n)
        case .streaming(let stream):
            return stream.read(into: destination)
        }
    }

    /// Rewinds a buffered body (curl asks when it must resend on a fresh connection).
    func rewindBody() -> Bool {
        switch request.body {
        case .empty: return true
        case .buffered(let original):
            bufferedBody = original
            return true
        case .streaming: return false
        }
    }
}

extension Substring {
    func trimmingASCIIWhitespace() -> String {
        var s = self[...]
        while let f = s.first, f == " " || f == "\t" { s = s.dropFirst() }
        while let l = s.last, l == " " || l == "\t" { s = s.dropLast() }
        return String(s)
    }
}

extension String {
    func trimmingASCIIWhitespace() -> String { self[...].trimmingASCIIWhitespace() }
}
