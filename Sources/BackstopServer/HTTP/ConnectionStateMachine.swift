import BackstopCore
import NIOCore
import NIOHTTP1

/// The decisions of one client connection: which request part is handled now and which waits (pipelining), when
/// reads are held, the idle and body-stall deadlines (`limits.client_idle_timeout`), and when the connection closes.
/// Pure: `ProxyHandler` feeds it events and performs what it returns (docs/reference/behaviour.md#client-connections).
///
/// States and transitions:
///
///     idle(deadline)   head → active;  deadline passed → (close the connection)
///     active(request)  body, end → active;  response ended and request ended → idle, or active for the next
///                      queued request;  an answer that closes → closing;  body stalled → (408, then closing)
///     active(request)  CONNECT accepted → upgrading
///     upgrading        the tunnel or TLS interception is being set up: reads held, nothing processed, no deadline;
///                      ends when the handler hands the channel over (and leaves the pipeline) → (gone), or when
///                      setting up failed and was answered → closing
///     closing          terminal: nothing more is processed or answered; the connection closes once written
///
/// Requests on one connection are handled one at a time so responses leave in order. Parts of pipelined requests
/// that arrive meanwhile are queued here (not by NIO's pipelining handler, which toggles socket reads around every
/// request); reads are held only when the queue grows past `maxQueuedParts`.
struct ConnectionStateMachine {
    /// The request being handled.
    struct Request: Equatable {
        var requestEnded = false
        var responseEnded = false
        /// The rest of the request is ignored (it was refused, or answered before its body was read).
        var discarding = false
        /// While the body is incomplete: when its last byte (or the head) arrived.
        var bodyProgress: Duration?
        /// A response is being written (its head went out, its end not yet).
        var responseInProgress = false
    }

    enum State: Equatable {
        case idle(deadline: Duration)
        case active(Request)
        case upgrading
        case closing
    }

    /// What to do with a part that just arrived.
    enum PartDisposition: Equatable {
        case process
        /// Queued behind the request in flight (reads may now be held).
        case queued
        /// The connection is closing: dropped.
        case dropped
    }

    /// What the connection's timer found.
    enum TimerOutcome: Equatable {
        /// Nothing due; check again at `next` (nil: no connection deadline pending).
        case wait(next: Duration?)
        /// No request head arrived in time: close.
        case closeIdle
        /// A request body stopped arriving: answer 408 (or close if a response is under way).
        case requestStalled
    }

    static let maxQueuedParts = 64

    let idleTimeout: Duration
    private(set) var state: State
    private var queued = CircularBuffer<HTTPServerRequestPart>()
    private var uploadHold = false
    private var queueHold = false
    private var pendingRead = false

    init(idleTimeout: Duration, now: Duration) {
        self.idleTimeout = idleTimeout
        self.state = .idle(deadline: now + idleTimeout)
    }

    var readsHeld: Bool {
        if uploadHold || queueHold { return true }
        if case .upgrading = state { return true }
        return false
    }
    var queuedParts: Int { queued.count }

    /// The request in flight, if any.
    var request: Request? {
        if case .active(let request) = state { return request }
        return nil
    }

    // MARK: parts

    /// A request part was decoded.
    mutating func partArrived(_ part: HTTPServerRequestPart) -> PartDisposition {
        switch state {
        case .closing, .upgrading:
            return .dropped
        case .active(let request) where request.requestEnded || !queued.isEmpty:
            queued.append(part)
            if queued.count >= Self.maxQueuedParts { queueHold = true }
            return .queued
        case .idle, .active:
            return .process
        }
    }

    /// The next queued part to handle now: only between requests, or the rest of the request that just started.
    mutating func nextQueuedPart() -> HTTPServerRequestPart? {
        guard !queued.isEmpty else { return nil }
        switch state {
        case .closing, .upgrading:
            queued.removeAll()
            return nil
        case .active(let request) where request.requestEnded:
            return nil
        case .idle, .active:
            return queued.removeFirst()
        }
    }

    /// A request head is being handled.
    mutating func headArrived(now: Duration) {
        switch state {
        case .closing, .upgrading: return
        case .idle, .active: state = .active(Request(bodyProgress: now))
        }
    }

    /// A body part arrived; returns whether it goes to the exchange (false: the request is being discarded).
    mutating func bodyArrived(now: Duration) -> Bool {
        guard case .active(var request) = state else { return false }
        if request.bodyProgress != nil { request.bodyProgress = now }
        state = .active(request)
        return !request.discarding
    }

    /// The request's end arrived; returns whether it goes to the exchange.
    mutating func endArrived() -> Bool {
        guard case .active(var request) = state else { return false }
        request.requestEnded = true
        request.bodyProgress = nil
        state = .active(request)
        return !request.discarding
    }

    /// The rest of the current request is to be ignored.
    mutating func discardRequest() {
        guard case .active(var request) = state else { return }
        request.discarding = true
        state = .active(request)
    }

    // MARK: responses

    mutating func responseStarted() {
        guard case .active(var request) = state else { return }
        request.responseInProgress = true
        state = .active(request)
    }

    var responseInProgress: Bool { request?.responseInProgress ?? false }

    /// The response went out. With `close`, the connection ends after it; otherwise, once the request's body was
    /// also consumed, the connection is idle again (or handles the next queued request). Returns whether held
    /// reads may resume.
    mutating func responseEnded(close: Bool, now: Duration) -> Bool {
        if close {
            state = .closing
            queued.removeAll()
            return false
        }
        guard case .active(var request) = state else { return false }
        request.responseEnded = true
        request.responseInProgress = false
        state = .active(request)
        return requestMayBeDone(now: now)
    }

    /// The request's end or its response's end arrived: when both did, the connection is idle again.
    mutating func requestMayBeDone(now: Duration) -> Bool {
        guard case .active(let request) = state, request.requestEnded, request.responseEnded else { return false }
        state = .idle(deadline: now + idleTimeout)
        if queueHold && queued.count < Self.maxQueuedParts / 2 {
            queueHold = false
            return takePendingRead()
        }
        return false
    }

    /// A `CONNECT` was accepted: until the channel is handed over, nothing is read or processed and no deadline of
    /// the connection's own runs (the tunnel's connect timeout bounds the wait).
    mutating func beginUpgrade() {
        guard case .active = state else { return }
        state = .upgrading
        queued.removeAll()
    }

    /// The connection must close (an abort, an error): nothing more is processed.
    mutating func close() {
        state = .closing
        queued.removeAll()
    }

    // MARK: reads

    /// NIO asks to read from the socket: true to read now, false when held (the read is remembered).
    mutating func readRequested() -> Bool {
        if readsHeld {
            pendingRead = true
            return false
        }
        return true
    }

    /// A streamed upload is above its high-water mark: stop reading from the client.
    mutating func holdUploads() { uploadHold = true }

    /// The upload drained; returns whether a held read must be issued now. Body progress restarts: the client
    /// could not send while reads were held.
    mutating func releaseUploads(now: Duration) -> Bool {
        guard uploadHold else { return false }
        uploadHold = false
        if case .active(var request) = state, request.bodyProgress != nil {
            request.bodyProgress = now
            state = .active(request)
        }
        return takePendingRead()
    }

    private mutating func takePendingRead() -> Bool {
        guard !readsHeld, pendingRead else { return false }
        pendingRead = false
        return true
    }

    // MARK: time

    /// The connection's own deadline: the idle deadline between requests, the body-stall deadline while a body is
    /// incomplete (not counted while Backstop itself holds reads).
    var nextDeadline: Duration? {
        switch state {
        case .idle(let deadline): deadline
        case .active(let request): uploadHold ? nil : request.bodyProgress.map { $0 + idleTimeout }
        case .upgrading, .closing: nil
        }
    }

    mutating func timerFired(now: Duration) -> TimerOutcome {
        switch state {
        case .idle(let deadline) where now >= deadline:
            state = .closing
            return .closeIdle
        case .active(var request) where !uploadHold:
            guard let progress = request.bodyProgress, now >= progress + idleTimeout else { break }
            request.bodyProgress = nil
            state = .active(request)
            return .requestStalled
        default:
            break
        }
        return .wait(next: nextDeadline)
    }
}
