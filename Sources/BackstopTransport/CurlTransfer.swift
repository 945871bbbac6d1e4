import BackstopCore
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
public final class CurlTransfer: TransferHandle, @unchecked Sendable {
    /// Pause the upstream read when this many body bytes are delivered but not yet written to the client.
    static let highWater = 1 << 20
    /// Resume once the client side has caught up to this.
    static let lowWater = 256 << 10

    let request: TransportRequest
    let eventLoop: EventLoop
    let sink: @Sendable ([TransportEvent]) -> Void
    unowned let transport: CurlMultiTransport

    /// The transport's debug check, with `transport` read only inside `assert`: a release build does not touch the
    /// unowned reference (each touch is a strong retain and release) on every callback.
    @inline(__always)
    private func assertOnTransportThread(_ what: StaticString = #function) {
        assert(transport.isTransportThread, "\(what) must run on the transport thread")
    }

    // Transport-thread state, `@exclusivity(unchecked)`: the run-time exclusivity check costs ~60 instructions per
    // access, and these are touched on every header line and body chunk. A conflict needs two overlapping accesses:
    // all of these happen on the transport thread only (see above), and none spans a call that could reach the same
    // property again (the mutations are assignments, appends and the head parser's `consume`, a value type's method
    // that knows nothing of the transfer). The attribute turns the check off in debug builds too, so this holds by
    // review: keep the list short and the accesses simple.
    @exclusivity(unchecked) var easy: UnsafeMutableRawPointer?
    @exclusivity(unchecked) var headerList: CurlHeaderList?
    @exclusivity(unchecked) var bufferedBody: ByteBuffer?
    @exclusivity(unchecked) var pending: [TransportEvent] = []
    @exclusivity(unchecked) var isDirty = false
    @exclusivity(unchecked) var headParser = UpstreamHeadParser()
    var headDelivered: Bool { headParser.finished }
    @exclusivity(unchecked) var finished = false
    var cancelledByUser = false
    /// Why the transfer was stopped from one of its own callbacks (a refused head or destination), reported in
    /// place of the error curl returns for the abort.
    @exclusivity(unchecked) var refusal: TransportFailure?
    /// Sent once more on a new connection after its reused one turned out closed (`StaleConnection`).
    var resent = false
    /// The address of the last connection curl opened for this transfer (for failure causes).
    var lastAddress: String?

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

    /// The requester no longer wants the events but lets the transfer finish (so curl can keep its connection);
    /// it is cancelled if it has not finished within `limit`.
    public func abandon(within limit: Duration) {
        transport.submit(.abandon(self, deadlineMS: bs_monotonic_ms() + limit.millisecondsRoundedUp))
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
        assertOnTransportThread()
        if case .body(var incoming) = event, case .body(var last)? = pending.last {
            pending.removeLast()
            last.writeBuffer(&incoming)
            pending.append(.body(last))
        } else {
            // A batch is usually head, body and end: room for them at once rather than growing 1 → 2 → 4.
            if pending.isEmpty { pending.reserveCapacity(4) }
            pending.append(event)
        }
        if !isDirty {
            isDirty = true
            transport.markDirty(self)
        }
    }

    func flush() {
        assertOnTransportThread()
        isDirty = false
        guard !pending.isEmpty else { return }
        let events = pending
        pending = []
        let sink = self.sink
        eventLoop.execute { sink(events) }
    }

    /// Header callback: one line at a time, including the status line and the blank line ending the head.
    /// Returns false to abort the transfer: a head whose framing cannot be trusted is never delivered.
    func onHeaderLine(_ line: UnsafeRawBufferPointer) -> Bool {
        assertOnTransportThread()
        guard let head = headParser.consume(line) else { return true }
        if let problem = head.framingProblem {
            refusal = .badResponse(detail: "untrustworthy response framing: \(problem)")
            return false
        }
        emit(.head(head))
        return true
    }

    /// Write callback: returns the number of bytes taken, or `nil` to pause.
    func onBody(_ data: UnsafeRawBufferPointer) -> Bool {
        assertOnTransportThread()
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
        assertOnTransportThread()
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

    /// Rewinds a buffered body (curl asks when it must resend on a fresh connection). Refused for a request that
    /// may not reach the upstream twice: curl then fails the transfer, and the retry policy decides.
    func rewindBody() -> Bool {
        assertOnTransportThread()
        guard request.mayResend else { return false }
        switch request.body {
        case .empty: return true
        case .buffered(let original):
            bufferedBody = original
            return true
        case .streaming: return false
        }
    }
}
