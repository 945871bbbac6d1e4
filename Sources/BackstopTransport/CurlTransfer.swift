import BackstopCore
import CCurl
import NIOCore
import Synchronization

/// One upstream attempt in flight: an easy handle, its callbacks' state, and the handle the exchange uses to
/// cancel it or report consumed body bytes (backpressure).
///
/// `@unchecked Sendable` because of the `var`s below: every one of them is read and written only on the
/// transport thread (curl's callbacks run there, and so does the transport when it begins and finishes a transfer).
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
    /// The same transport, for the transport thread's own use (`markDirty`, `allocator`): reading an `unowned`
    /// reference takes a strong reference and drops it (two atomic operations), once per response for `markDirty`.
    /// `unowned(unsafe)` is sound here because it is read only on the transport thread, and all code there runs
    /// inside the transport's `run()` (its loop and the curl callbacks it triggers), which holds the transport.
    /// Other threads (`cancel`, `abandon`, `consumed`) use `transport`, which traps rather than reading freed
    /// memory if the transport is gone.
    private unowned(unsafe) let transportOnItsThread: CurlMultiTransport

    /// The transport's debug check, with `transport` read only inside `assert`: a release build does not touch the
    /// unowned reference (each touch is a strong retain and release) on every callback.
    @inline(__always)
    private func assertOnTransportThread(_ what: StaticString = #function) {
        assert(transport.isTransportThread, "\(what) must run on the transport thread")
    }

    // Transport-thread state. Where the transfer stands (queued, active, abandoned, finished) is not here: the
    // transport's `TransferTable` holds that, and only the transport changes it.
    /// The handle curl runs the transfer on, from `begin` until it finishes (then recycled).
    var easy: CurlEasy?
    var bufferedBody: ByteBuffer?
    /// Events not yet handed to the requester; non-empty exactly while the transfer is on the transport's list of
    /// transfers to flush at the end of the loop turn.
    var pending: [TransportEvent] = []
    /// Made on the first header line: a transfer on the raw HTTP/1.1 path never needs one.
    var headParser: UpstreamHeadParser?
    var headDelivered: Bool { headParser?.finished ?? false }
    /// Why the transfer was stopped from one of its own callbacks (a refused head or destination), reported in
    /// place of the error curl returns for the abort.
    var refusal: TransportFailure?
    /// The address of the last connection curl opened for this transfer (for failure causes).
    var lastAddress: String?
    /// The raw HTTP/1.1 path's view of the URL (docs/performance.md#libcurl-as-the-connection); nil: curl's HTTP
    /// layer runs this transfer.
    let http1URL: HTTP1URL?
    /// The raw connection serving the transfer (`HTTP1Connections`), while it has one.
    var connection: HTTP1Connection?

    // Cross-thread state.
    let unconsumedBytes = Atomic<Int>(0)
    let receivePaused = Atomic<Bool>(false)
    let cancelRequested = Atomic<Bool>(false)

    init(
        request: TransportRequest, eventLoop: EventLoop, transport: CurlMultiTransport, rawHTTP1: Bool,
        sink: @escaping @Sendable ([TransportEvent]) -> Void
    ) {
        self.http1URL = rawHTTP1 && !request.tls.http2 ? HTTP1URL(request.url) : nil
        self.eventLoop = eventLoop
        self.transport = transport
        self.transportOnItsThread = transport
        self.sink = sink
        if case .buffered(let buffer) = request.body { self.bufferedBody = buffer }
        self.request = request  // last: moved in, not copied
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

    /// Taken, not borrowed: the event moves into `pending` (a copy would retain every field of a head).
    /// The checks look at the event and at the last pending one in place (`pending.last` and binding a payload
    /// each copied it).
    func emit(_ event: consuming TransportEvent) {
        assertOnTransportThread()
        guard case .body = event, let lastIndex = pending.indices.last, case .body = pending[lastIndex] else {
            enqueue(event)
            return
        }
        // Body after body in one turn: one buffer (rare for small responses, which fit in one read).
        guard case .body(var incoming) = consume event, case .body(var last) = pending.removeLast() else {
            preconditionFailure("checked above")
        }
        last.writeBuffer(&incoming)
        pending.append(.body(last))
    }

    private func enqueue(_ event: consuming TransportEvent) {
        if pending.isEmpty {
            // A batch is usually head, body and end: room for them at once rather than growing 1 → 2 → 4.
            pending.reserveCapacity(4)
            transportOnItsThread.markDirty(self)
        }
        pending.append(event)
    }

    /// One turn's events of a transfer and where they go, run on the requester's event loop.
    struct Delivery: Sendable {
        let sink: @Sendable ([TransportEvent]) -> Void
        let events: [TransportEvent]

        func hand() { sink(events) }
    }

    /// Takes the pending events for the transport to hand over (it batches them per event loop). Swapped out
    /// rather than copied and then emptied: no retain and release of the array.
    func takePending() -> [TransportEvent] {
        assertOnTransportThread()
        var events: [TransportEvent] = []
        swap(&events, &pending)
        return events
    }

    /// Header callback: one line at a time, including the status line and the blank line ending the head.
    /// Returns false to abort the transfer: a head whose framing cannot be trusted is never delivered.
    func onHeaderLine(_ line: UnsafeRawBufferPointer) -> Bool {
        assertOnTransportThread()
        if headParser == nil { headParser = UpstreamHeadParser() }
        guard let head = headParser!.consume(line) else { return true }
        if let problem = head.framingProblem {
            refusal = .badResponse(detail: "untrustworthy response framing: \(problem)")
            return false
        }
        emit(.head(head))
        return true
    }

    /// Write callback: false to pause (the requester has `highWater` bytes it has not written yet).
    func onBody(_ data: UnsafeRawBufferPointer) -> Bool {
        assertOnTransportThread()
        if shouldPauseReceiving() { return false }
        var buffer = transportOnItsThread.allocator.buffer(capacity: data.count)
        buffer.writeBytes(data)
        unconsumedBytes.add(data.count, ordering: .acquiringAndReleasing)
        // `consume`: handed over, not copied (see `HTTP1Connections.emitBody`).
        emit(.body(consume buffer))
        return true
    }

    /// Whether to stop reading the response: the requester has `highWater` bytes it has not written yet. Sets
    /// `receivePaused`, so that `consumed` asks for the read to resume.
    func shouldPauseReceiving() -> Bool {
        guard unconsumedBytes.load(ordering: .acquiring) >= Self.highWater else { return false }
        receivePaused.store(true, ordering: .sequentiallyConsistent)
        // The client may have caught up in between; if it took the flag back, keep going ourselves.
        return
            !(unconsumedBytes.load(ordering: .sequentiallyConsistent) < Self.lowWater
            && receivePaused.compareExchange(expected: true, desired: false, ordering: .sequentiallyConsistent)
                .exchanged)
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

    /// Whether `rewindBody` would succeed: the request may reach the upstream twice and its body is not a stream.
    var mayRewindBody: Bool {
        guard request.mayResend else { return false }
        if case .streaming = request.body { return false }
        return true
    }

    /// Rewinds a buffered body (curl asks when it must resend on a fresh connection). Refused for a request that
    /// may not reach the upstream twice: curl then fails the transfer, and the retry policy decides.
    func rewindBody() -> Bool {
        assertOnTransportThread()
        guard mayRewindBody else { return false }
        if case .buffered(let original) = request.body { bufferedBody = original }
        return true
    }
}

/// A transfer as the transport's `TransferTable` knows it: by identity. Holds the transfer, so an entry never
/// outlives the object it names.
struct TransferKey: Hashable {
    let transfer: CurlTransfer

    init(_ transfer: CurlTransfer) { self.transfer = transfer }

    static func == (a: TransferKey, b: TransferKey) -> Bool { a.transfer === b.transfer }
    func hash(into hasher: inout Hasher) { hasher.combine(ObjectIdentifier(transfer)) }
    /// The address mixed with the seed by MurmurHash3's 64-bit finaliser (~10 instructions), not SipHash: the keys
    /// are the transport's own objects, never chosen by a peer, so the seeded hash's flooding resistance buys
    /// nothing here, and the table hashes three times per request (~100 instructions each through `Hasher`,
    /// docs/performance.md#smaller-per-request-costs). Every bit of the address reaches the low
    /// bits `Dictionary` indexes by.
    func _rawHashValue(seed: Int) -> Int {
        var x = UInt64(UInt(bitPattern: ObjectIdentifier(transfer))) ^ UInt64(UInt(bitPattern: seed))
        x ^= x >> 33
        x &*= 0xff51_afd7_ed55_8ccd
        x ^= x >> 33
        x &*= 0xc4ce_b9fe_1a85_ec53
        x ^= x >> 33
        return Int(truncatingIfNeeded: x)
    }
}
