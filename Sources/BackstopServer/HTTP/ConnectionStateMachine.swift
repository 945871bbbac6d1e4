import BackstopCore
import BackstopTransport
import NIOCore
import NIOHTTP1

/// The decisions of one client connection and of the request it is handling: which request part is handled now and
/// which waits (pipelining), when reads are held, the idle and body-stall deadlines (`limits.client_idle_timeout`),
/// the request's exchange (`ExchangeStateMachine`, nested while the request is active), how its response is framed
/// for the client and whether the upstream keeps to that framing, and when the connection closes
/// (docs/reference/behaviour.md#client-connections, docs/architecture.md#the-request-core). Pure: `ProxyHandler`
/// feeds it events and performs the actions it appends, in order; the handler decides nothing itself.
///
/// States and transitions:
///
///     idle(deadline)   head → active (admitting);  deadline passed → closing
///     active           admitted → an exchange runs, or a local answer is written;  body, end → active;  the
///                      response and the request both ended → idle, then the next queued head, if any;  an answer
///                      that closes, an abort, the client gone → closing;  CONNECT admitted → upgrading
///     upgrading        the tunnel or TLS interception is being set up: reads held, nothing processed, no deadline;
///                      ends when the handler hands the channel over, or when setting up failed and was answered
///                      (`answerLocally`) → closing
///     closing          terminal: nothing more is processed or answered; the connection closes once written
///
/// Requests on one connection are handled one at a time so responses leave in order. Parts of pipelined requests
/// that arrive meanwhile are queued here (not by NIO's pipelining handler, which toggles socket reads around every
/// request); reads are held only when the queue grows past `maxQueuedParts`. The next request waits, too, while the
/// client has not taken what was written to it (its socket unwritable): a client that pipelines requests and reads
/// nothing would otherwise have every response fetched and held in memory.
///
/// Events of the exchange's attempts carry their generation. Generations grow over the connection's whole life, so
/// an event of an attempt that is no longer the exchange's, or of an earlier request's, is stale: it changes
/// nothing and adds no action (`ExchangeStateMachine`).
struct ConnectionStateMachine {
    typealias Exchange = ExchangeStateMachine

    /// What a request's head says about its response.
    struct RequestFacts: Equatable {
        /// The client asked to close after this response (`Connection: close`, or HTTP/1.0 without keep-alive).
        var closeAfterResponse: Bool
        /// The response is written as HTTP/1.0 and cannot be chunked.
        var clientIsHTTP10: Bool
        var isHEAD: Bool

        /// For an answer to no readable request (a parse error, a head that never completed).
        static let unknown = RequestFacts(closeAfterResponse: true, clientIsHTTP10: false, isHEAD: false)
    }

    /// Where the request itself is.
    enum RequestProgress: Equatable {
        /// Its head is being admitted (`.admit`): its further parts wait in the queue.
        case admitting
        /// Body parts go on to the exchange. `lastPart`: when the last one (or the head) arrived, for the stall
        /// deadline; nil once a stall was reported.
        case receiving(lastPart: Duration?)
        /// The rest of it is read and ignored (refused, or answered before its body was read).
        case discarding(lastPart: Duration?)
        case ended

        var lastPart: Duration? {
            switch self {
            case .receiving(let last), .discarding(let last): last
            case .admitting, .ended: nil
            }
        }

        /// The same progress with the stall clock at `time`.
        func withLastPart(_ time: Duration?) -> RequestProgress {
            switch self {
            case .receiving: .receiving(lastPart: time)
            case .discarding: .discarding(lastPart: time)
            case .admitting, .ended: self
            }
        }
    }

    /// Where the response to the client is.
    enum ResponseProgress: Equatable {
        case pending
        /// The head went out; the relay counts what its framing still allows.
        case writing(ResponseRelay)
        case ended
    }

    /// The request being handled and its response: one box per request, changed in place by the machine's
    /// mutators. The connection's state then holds a pointer, so that reading or switching on it copies nothing of
    /// the exchange's record (docs/architecture.md#the-request-core). A machine is never copied (its handler holds
    /// the only one; each test drives its own), so nothing else sees the box change; `==` compares content.
    final class Active: Equatable {
        var facts: RequestFacts
        var request: RequestProgress
        var response: ResponseProgress
        /// The exchange forwarding it; nil for a request Backstop answers itself, and once the exchange ended.
        var exchange: Exchange?
        /// A request to a `delivery: queue` upstream, read whole before it is stored; nil once answered.
        var intake: Intake?

        init(
            facts: RequestFacts, request: RequestProgress, response: ResponseProgress, exchange: Exchange? = nil,
            intake: Intake? = nil
        ) {
            self.facts = facts
            self.request = request
            self.response = response
            self.exchange = exchange
            self.intake = intake
        }

        /// Runs `body` on the exchange in place, if there is one. Every access to it goes through here: reading the
        /// property out of the box would copy the whole machine first.
        func withExchange<R>(_ body: (inout Exchange) -> R) -> R? { Self.inPlace(&exchange, body) }

        var hasExchange: Bool { withExchange { _ in true } ?? false }

        /// Optional chaining reaches the machine in place with one look at the optional's tag (`if case .none`, then
        /// `exchange!`, looked twice: ~40 instructions each for an enum this large, several times a request).
        private static func inPlace<R>(_ exchange: inout Exchange?, _ body: (inout Exchange) -> R) -> R? {
            exchange?.applying(body)
        }

        /// The box of a finished request, made the next one's (`ConnectionStateMachine.spare`).
        func reuse(facts: RequestFacts) {
            self.facts = facts
            request = .admitting
            response = .pending
            exchange = nil
            intake = nil
        }

        static func == (lhs: Active, rhs: Active) -> Bool {
            lhs === rhs
                || (lhs.facts == rhs.facts && lhs.request == rhs.request && lhs.response == rhs.response
                    && lhs.exchange == rhs.exchange && lhs.intake == rhs.intake)
        }
    }

    /// A queued request's body as it is read (docs/reference/behaviour.md#queued-delivery): kept whole, up to
    /// `limits.max_request_body`, then stored; answered `202` only once stored.
    struct Intake: Equatable {
        var received: Int
        let maxBody: Int
        /// The whole request was read and is being stored.
        var storing: Bool
    }

    /// How storing a queued request ended.
    enum IntakeOutcome: Equatable {
        /// Stored durably, under this delivery id.
        case stored(delivery: String)
        case refused(ProxyErrorReason)
    }

    enum State: Equatable {
        case idle(deadline: Duration)
        case active(Active)
        case upgrading
        case closing
    }

    /// How an admitted head is handled: `RequestAdmission`'s decision, with what the exchange needs.
    enum Admission: Equatable {
        /// Answer with this error and ignore the rest of the request; `close` when the rest cannot be trusted.
        /// `message` replaces the reason's usual one-line body; `retryAfter` (whole seconds) for `circuit-open`.
        case reject(ProxyErrorReason, close: Bool, message: String? = nil, retryAfter: Int? = nil)
        /// Forward it with an exchange of this configuration; `expectsContinue`: write `100 Continue` first.
        case forward(Exchange.Configuration, expectsContinue: Bool)
        /// `CONNECT` accepted: the handler sets up a tunnel or interception, or answers (`answerLocally`).
        case upgrade
        /// For a `delivery: queue` upstream: read the whole request (at most `maxBody` bytes of body), store it,
        /// answer `202`; `expectsContinue`: write `100 Continue` first.
        case queue(maxBody: Int, expectsContinue: Bool)
    }

    /// How a response head is written.
    struct HeadWrite: Equatable {
        var framing: ResponseFraming
        var clientIsHTTP10: Bool
        var connection: ResponseHeadWriter.ConnectionField
        var attempts: Int
        var error: ProxyErrorReason?
        /// How the attempt whose head this is ended, recorded as the head is written (as `.attemptEnded` records
        /// one, in the same action: one fewer per response); nil when it was recorded when it ended (a head held for a
        /// token refresh or the retry budget).
        var report: Exchange.AttemptReport? = nil
    }

    /// How a Backstop error is written.
    struct ErrorWrite: Equatable {
        var clientIsHTTP10: Bool
        var connection: ResponseHeadWriter.ConnectionField
        var omitBody: Bool
        /// `X-Backstop-Attempts`, when attempts were made.
        var attempts: Int?
        var message: String?
        /// `Retry-After` (whole seconds), for a 503 `circuit-open`.
        var retryAfter: Int? = nil
        /// The connection closes once the answer is written.
        var close: Bool
    }

    /// What metrics, the access line, logs and the request's span record of a finished exchange.
    struct Finished: Equatable {
        var ending: Exchange.Ending
        var record: Exchange.Record
        /// Body bytes written to the client.
        var bytes: Int
    }

    /// An effect for `ProxyHandler` to perform, in the order appended.
    enum Action: Equatable {
        // The client connection.
        /// A read that was held may be issued now.
        case read
        /// Run `RequestAdmission` on this head and report `headAdmitted`.
        case admit(ClientRequestHead)
        /// `100 Continue`: the client waits for it before it sends its body.
        case writeContinue(clientIsHTTP10: Bool)
        /// Inline: the head is one reference (its fields share one box).
        case writeHead(UpstreamResponseHead, HeadWrite)
        /// Body bytes, framed as an HTTP/1.1 chunk when `chunk` says so.
        case writeBody(ByteBuffer, chunk: ResponseRelay.Chunk?)
        /// The transport batch of attempt `generation` ended while its response is relayed: flush, and tell the
        /// transfer what the client socket took (backpressure).
        case flushBody(generation: Int)
        /// The response is complete: record the exchange as `.requestFinished` does (`finished`, in the same action:
        /// one fewer per response), then write its closing bytes (`lastChunk`) and flush; close after it if `close`.
        case endResponse(lastChunk: ResponseRelay.LastChunk?, close: Bool, Finished)
        case writeError(ProxyErrorReason, ErrorWrite)
        /// `202 Accepted` with `X-Backstop-Delivery`: a queued request was stored (its access line with it).
        case writeAccepted(delivery: String, ErrorWrite)
        /// The access line of a local answer that no exchange records (`detail`: its `reason=`).
        /// `elapsed`: from the request's first byte to the answer, when that is known (a head that timed out).
        case logLocalAnswer(ProxyErrorReason, detail: String?, elapsed: Duration = .zero)
        /// A response whose head went out is cut: flush what was written, then close.
        case abortResponse
        /// Close the connection now (idle too long, or broken).
        case closeConnection
        /// The connection is between requests: the head deadline (`limits.header_timeout`) starts with the next byte.
        case awaitNextHead

        // The request's exchange, performed through its effects (`Exchange`).
        case storeBody(ByteBuffer)
        /// Turn the kept body into a stream and report `streamingBegan`; `then` goes into the stream after it.
        case beginStreaming(then: ByteBuffer?)
        case finishBodyStream
        /// The streamed body will not be read to its end: fail the stream.
        case failBodyStream
        case acquireCredential
        /// Ask the upstream's endpoint set for the next attempt's endpoint and report `endpointChosen`; `copy`: for a
        /// hedged copy (finding none is not a fast failure).
        case chooseEndpoint(avoiding: [Int], copy: Bool = false)
        case refreshCredential(rejected: ManagedToken)
        case startAttempt(Exchange.Start)
        case cancelAttempt(generation: Int)
        case abandonAttempt(generation: Int, within: Duration)
        /// Ask the upstream's retry budget and report `retryPermit`.
        case requestRetryPermit

        // A queued request, performed through its effects (`QueueIntake`).
        /// Keep this part of the body with the request.
        case keepQueuedBody(ByteBuffer)
        /// The request is read whole: store it and report `intakeEnded`.
        case storeQueued
        /// The request will not be stored: let go of what was kept of it.
        case discardQueued
        /// The store ended after the client went away: nobody hears the answer, but the request is recorded (stored
        /// as `delivery`, or not stored: nil) and its intake let go.
        case queuedUnanswered(delivery: String?)

        // What metrics, logs and spans record.
        /// An attempt ended as `report` (`backstop_upstream_attempts_total`).
        case attemptEnded(Exchange.AttemptReport)
        /// Attempt `generation` ended as `report` while others of the request are in flight (a hedge race): recorded
        /// as `attemptEnded` is, and its span ends.
        case attemptLeft(generation: Int, Exchange.AttemptReport)
        /// What an attempt's end means for its endpoint (ejection, probing); `reason` names the failure
        /// (`503`, `connect-failure`) for the `endpoint ejected` line.
        case endpointReport(EndpointReport, reason: String?)
        /// The budget allowed a retry (`backstop_retries_total`, the log line of its failure, its span's end).
        case retryScheduled(Exchange.Retry)
        /// The exchange ended: every transfer still held is let go; metrics, the access line, the spans.
        case requestFinished(Finished)
    }

    static let maxQueuedParts = 64
    /// Reads are held once the queued parts take this much memory too: 64 heads of 60 KiB each read ahead from a
    /// client that reads nothing held ~2.5 MiB per connection (docs/reference/behaviour.md#request-forms).
    static let maxQueuedBytes = 64 << 10

    let idleTimeout: Duration
    private(set) var state: State
    private var queued = CircularBuffer<ClientRequestPart>()
    /// What the queued parts take in memory (`queuedSize(of:)`).
    private var queuedBytes = 0
    private var uploadHold = false
    private var queueHold = false
    /// The client socket is not writable (what was written to it is not taken yet): no next request starts.
    private var clientBacklogged = false
    private var pendingRead = false
    /// A queued request was being stored when the client went away: the store's end still ends its intake.
    private var storeOutlivedClient = false
    /// What the client sent after its last complete request could not be read: refused (and the connection closed)
    /// once every request before it is answered, in order.
    private var refusalAfterQueue: ProxyErrorReason?
    /// The generation the next exchange's first attempt gets: above every attempt this connection started.
    private var nextGeneration = 1
    /// The last finished request's box, which the next request takes when nothing else holds it: one allocation
    /// per connection rather than per request (docs/performance.md). Not state: no decision reads it.
    private var spare: Active?

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

    /// The active request, if any.
    var active: Active? {
        if case .active(let active) = state { return active }
        return nil
    }

    var isClosing: Bool { if case .closing = state { true } else { false } }
}

// MARK: - request parts

extension ConnectionStateMachine {
    /// A request part was decoded.
    mutating func partArrived(_ part: ClientRequestPart, now: Duration, into actions: inout [Action]) {
        switch state {
        case .closing, .upgrading:
            return
        case .active(let active) where active.request == .admitting || active.request == .ended || !queued.isEmpty:
            enqueue(part)
        case .idle where clientBacklogged:
            enqueue(part)
        case .idle, .active:
            process(part, now: now, into: &actions)
        }
    }

    /// Keeps `part` for later; reads are held once the queue is full.
    private mutating func enqueue(_ part: ClientRequestPart) {
        queued.append(part)
        queuedBytes += Self.queuedSize(of: part)
        if queued.count >= Self.maxQueuedParts || queuedBytes >= Self.maxQueuedBytes { queueHold = true }
    }

    private mutating func dequeue() -> ClientRequestPart {
        let part = queued.removeFirst()
        queuedBytes -= Self.queuedSize(of: part)
        return part
    }

    private mutating func clearQueue() {
        queued.removeAll()
        queuedBytes = 0
    }

    /// What a queued part takes in memory, near enough: a head's target and fields, a body part's bytes.
    static func queuedSize(of part: ClientRequestPart) -> Int {
        switch part {
        case .head(let head): 64 + head.uri.utf8.count + head.headers.storedBytes
        case .body(let buffer): buffer.readableBytes
        case .end: 0
        }
    }

    /// A box for a new request: the spare one when no earlier state value still holds it.
    private mutating func activeBox(_ facts: RequestFacts) -> Active {
        guard var box = spare else {
            return Active(facts: facts, request: .admitting, response: .pending, exchange: nil)
        }
        spare = nil
        guard isKnownUniquelyReferenced(&box) else {
            return Active(facts: facts, request: .admitting, response: .pending, exchange: nil)
        }
        box.reuse(facts: facts)
        return box
    }

    private mutating func process(_ part: ClientRequestPart, now: Duration, into actions: inout [Action]) {
        switch part {
        case .head(let head):
            // Matched, not compared: `HTTPMethod`'s `==` compares the methods' names.
            let method = head.method
            let isConnect = if case .CONNECT = method { true } else { false }
            let isHEAD = if case .HEAD = method { true } else { false }
            let facts = RequestFacts(
                closeAfterResponse: !head.isKeepAlive,
                // A `CONNECT` is answered as HTTP/1.1 whatever it said: its answer is a tunnel's, not a resource's.
                clientIsHTTP10: !isConnect && head.version.major == 1 && head.version.minor == 0,
                isHEAD: isHEAD)
            state = .active(activeBox(facts))
            actions.append(.admit(head))
        case .body(let buffer):
            bodyArrived(buffer, now: now, into: &actions)
        case .end:
            endArrived(now: now, into: &actions)
        }
    }

    /// The handler decided what the head just given in `.admit` gets. Only ever the answer to that `.admit`.
    mutating func headAdmitted(_ admission: Admission, now: Duration, into actions: inout [Action]) {
        guard case .active(let active) = state, active.request == .admitting else {
            // The connection closed while the handler was admitting: nothing is left to answer.
            guard case .closing = state else { preconditionFailure("an admission nobody asked for") }
            return
        }
        switch admission {
        case .reject(let reason, let close, let message, let retryAfter):
            active.request = .discarding(lastPart: now)
            answer(
                reason, close: close || active.facts.closeAfterResponse, attempts: nil, message: message,
                retryAfter: retryAfter, now: now, into: &actions)
        case .upgrade:
            state = .upgrading
            clearQueue()
        case .queue(let maxBody, let expectsContinue):
            active.request = .receiving(lastPart: now)
            active.intake = Intake(received: 0, maxBody: maxBody, storing: false)
            if expectsContinue { actions.append(.writeContinue(clientIsHTTP10: active.facts.clientIsHTTP10)) }
        case .forward(let configuration, let expectsContinue):
            active.request = .receiving(lastPart: now)
            active.exchange = Exchange(configuration: configuration, now: now, firstGeneration: nextGeneration)
            let first = active.withExchange { $0.start(now: now) }!
            if expectsContinue { actions.append(.writeContinue(clientIsHTTP10: active.facts.clientIsHTTP10)) }
            perform(first, body: nil, now: now, into: &actions)
        }
        drainQueue(now: now, into: &actions)
    }

    private mutating func bodyArrived(_ buffer: ByteBuffer, now: Duration, into actions: inout [Action]) {
        guard case .active(let active) = state else { return }
        if active.request.lastPart != nil { active.request = active.request.withLastPart(now) }
        if case .receiving = active.request, var intake = active.intake {
            intake.received += buffer.readableBytes
            guard intake.received <= intake.maxBody else {
                // What is left of the body is not read: the connection closes after the answer.
                active.intake = nil
                active.request = .discarding(lastPart: now)
                actions.append(.discardQueued)
                answer(.bodyTooLarge, close: true, attempts: nil, message: nil, now: now, into: &actions)
                return
            }
            active.intake = intake
            actions.append(.keepQueuedBody(buffer))
            return
        }
        guard case .receiving = active.request,
            let action = active.withExchange({ $0.bodyReceived(count: buffer.readableBytes, now: now) })
        else { return }
        perform(action, body: buffer, now: now, into: &actions)
    }

    private mutating func endArrived(now: Duration, into actions: inout [Action]) {
        guard case .active(let active) = state else { return }
        let forwarded: Bool = if case .receiving = active.request { true } else { false }
        active.request = .ended
        if forwarded, active.intake != nil {
            active.intake?.storing = true
            actions.append(.storeQueued)
            return
        }
        if forwarded, let action = active.withExchange({ $0.bodyEnded(now: now) }) {
            perform(action, body: nil, now: now, into: &actions)
        }
        requestMayBeDone(now: now, into: &actions)
    }

    /// The executor turned the body into a stream (after `.beginStreaming`); `spooled`: kept in the spool as it
    /// streams, so it can be sent again.
    mutating func streamingBegan(now: Duration, spooled: Bool = false, into actions: inout [Action]) {
        withExchange(now: now, into: &actions) { $0.streamingBegan(now: now, spooled: spooled) }
    }

    /// The spool could not keep the body any more: it streams on, not retried.
    mutating func spoolFailed(now: Duration, into actions: inout [Action]) {
        withExchange(now: now, into: &actions) { $0.spoolFailed(now: now) }
    }

    /// `part`, asked to be kept (`.storeBody`), does not fit `limits.buffer_memory`: the body streams instead,
    /// `part` after what was kept.
    mutating func bufferDenied(_ part: ByteBuffer, now: Duration, into actions: inout [Action]) {
        guard case .active(let active) = state, let action = active.withExchange({ $0.bufferDenied(now: now) }) else {
            return
        }
        perform(action, body: part, now: now, into: &actions)
    }

    /// The body stream is above its high-water mark: stop reading from the client (and the stall clock).
    mutating func holdUploads() { uploadHold = true }

    /// The body stream drained: held reads resume. The stall clock restarts: the client could not send meanwhile.
    mutating func releaseUploads(now: Duration, into actions: inout [Action]) {
        guard uploadHold else { return }
        uploadHold = false
        if case .active(let active) = state, active.request.lastPart != nil {
            active.request = active.request.withLastPart(now)
        }
        resumeReadsIfHeld(into: &actions)
    }
}

// MARK: - a queued request's store

extension ConnectionStateMachine {
    /// Storing the queued request (after `.storeQueued`) ended: `202` once stored, else the refusal; a refusal can
    /// also come while the body is read (`limits.buffer_memory` spent). A store that ends after the client went away
    /// answers nobody (what was stored is delivered all the same), but still ends the intake.
    mutating func intakeEnded(_ outcome: IntakeOutcome, now: Duration, into actions: inout [Action]) {
        guard case .active(let active) = state, let intake = active.intake else {
            guard storeOutlivedClient else { return }
            storeOutlivedClient = false
            let delivery: String? =
                switch outcome {
                case .stored(let delivery): delivery
                case .refused: nil
                }
            actions.append(.queuedUnanswered(delivery: delivery))
            return
        }
        let facts = active.facts
        switch outcome {
        case .stored(let delivery):
            guard intake.storing else { preconditionFailure("stored before the request was read whole") }
            active.intake = nil
            let close = facts.closeAfterResponse
            let write = ErrorWrite(
                clientIsHTTP10: facts.clientIsHTTP10,
                connection: close ? .close : (facts.clientIsHTTP10 ? .keepAlive : .none), omitBody: facts.isHEAD,
                attempts: nil, message: nil, close: close)
            if close { self.close() }
            actions.append(.writeAccepted(delivery: delivery, write))
            if !close { responseEnded(close: false, now: now, into: &actions) }
        case .refused(let reason):
            active.intake = nil
            actions.append(.discardQueued)
            // Refused while the body still streams in (`limits.buffer_memory` spent): the rest is not read.
            let unread = !intake.storing
            if unread { active.request = .discarding(lastPart: now) }
            answer(
                reason, close: unread || facts.closeAfterResponse, attempts: nil, message: nil, now: now,
                into: &actions)
        }
    }
}

// MARK: - the exchange's events

extension ConnectionStateMachine {
    mutating func credentialAcquired(_ credential: Exchange.Credential?, now: Duration, into actions: inout [Action]) {
        withExchange(now: now, into: &actions) { $0.credentialAcquired(credential, now: now) }
    }

    mutating func refreshFinished(_ replacement: ManagedToken?, now: Duration, into actions: inout [Action]) {
        withExchange(now: now, into: &actions) { $0.refreshFinished(replacement, now: now) }
    }

    mutating func retryPermit(granted: Bool, endpointOpen: Bool = true, now: Duration, into actions: inout [Action]) {
        withExchange(now: now, into: &actions) {
            $0.retryPermit(granted: granted, endpointOpen: endpointOpen, now: now)
        }
    }

    mutating func endpointChosen(_ verdict: EndpointVerdict, now: Duration, into actions: inout [Action]) {
        withExchange(now: now, into: &actions) { $0.endpointChosen(verdict, now: now) }
    }

    /// The host's network changed (docs/reference/behaviour.md#the-network-coming-back).
    mutating func networkChanged(now: Duration, into actions: inout [Action]) {
        withExchange(now: now, into: &actions) { $0.networkChanged(now: now) }
    }

    /// One event of attempt `generation`'s transfer.
    mutating func transportEvent(
        _ event: TransportEvent, generation: Int, now: Duration, wall: Double,
        random: inout some RandomNumberGenerator, into actions: inout [Action]
    ) {
        switch event {
        case .head(let head):
            withExchange(now: now, into: &actions) {
                $0.responseHead(head, generation: generation, now: now, wall: wall, random: &random)
            }
        case .body(let buffer):
            withExchange(now: now, into: &actions) { $0.responseBody(buffer, generation: generation, now: now) }
        case .end:
            // The framing counter is the connection's: a body that ended short of its announced length is cut
            // (the client would wait for the rest, or read the next response as body).
            guard case .active(let active) = state else { return }
            if case .writing(let relay) = active.response, relay.fellShort,
                active.withExchange({ $0.relayingGeneration }) == generation
            {
                withExchange(now: now, into: &actions) { $0.framingBroken(.bodyShorterThanAnnounced) }
            } else {
                withExchange(now: now, into: &actions) { $0.responseEnded(generation: generation) }
            }
        case .failure(let failure):
            withExchange(now: now, into: &actions) {
                $0.transportFailed(failure, generation: generation, now: now, wall: wall, random: &random)
            }
        }
    }

    /// The events of one transport batch of attempt `generation` were all reported.
    mutating func transportBatchEnded(generation: Int, into actions: inout [Action]) {
        guard case .active(let active) = state, active.withExchange({ $0.relayingGeneration }) == generation else {
            return
        }
        actions.append(.flushBody(generation: generation))
    }

    /// The client socket turned unwritable (`writable` false: what was written is not taken yet) or writable again;
    /// a request queued behind a response the client had not taken starts once it is.
    mutating func clientWritabilityChanged(_ writable: Bool, now: Duration, into actions: inout [Action]) {
        clientBacklogged = !writable
        if writable, case .idle = state { drainQueue(now: now, into: &actions) }
    }

    /// The client took bytes of the response (its socket drained, or a batch written under backpressure went into
    /// it): the response is making progress.
    mutating func clientTookBytes(now: Duration) {
        guard case .active(let active) = state else { return }
        active.withExchange { $0.clientTookBytes(now: now) }
    }

    /// Runs `event` on the active request's exchange and performs what it returns.
    private mutating func withExchange(
        now: Duration, into actions: inout [Action], _ event: (inout Exchange) -> Exchange.Action
    ) {
        guard case .active(let active) = state, let action = active.withExchange(event) else { return }
        perform(action, body: nil, now: now, into: &actions)
    }
}

// MARK: - performing the exchange's actions

extension ConnectionStateMachine {
    /// Turns one action of the exchange into the connection's: responses are framed and written, the request's end
    /// and the response's end move the connection on. `body` is the part the action refers to, if any.
    private mutating func perform(
        _ action: consuming Exchange.Action, body: ByteBuffer?, now: Duration, into actions: inout [Action]
    ) {
        switch consume action {
        case .none:
            break
        case .storeBody:
            if let body { actions.append(.storeBody(body)) }
        case .storeBodyAndBeginStreaming:
            actions.append(.beginStreaming(then: body))
        case .beginStreaming:
            actions.append(.beginStreaming(then: body))
        case .finishBodyStream:
            actions.append(.finishBodyStream)
        case .acquireCredential:
            actions.append(.acquireCredential)
        case .chooseEndpoint(let avoiding, let copy):
            actions.append(.chooseEndpoint(avoiding: avoiding, copy: copy))
        case .startAttempt(let start):
            nextGeneration = max(nextGeneration, start.generation + 1)
            if let replaced = start.replacing { actions.append(.cancelAttempt(generation: replaced)) }
            actions.append(.startAttempt(start))
        case .refreshCredential(let rejected, let report, let endpoint):
            attemptEnded(report, endpoint, into: &actions)
            actions.append(.refreshCredential(rejected: rejected))
        case .requestRetryPermit(let report, let endpoint):
            attemptEnded(report, endpoint, into: &actions)
            actions.append(.requestRetryPermit)
        case .retry(let retry):
            switch retry.disposal {
            case .none: break
            case .cancel: actions.append(.cancelAttempt(generation: retry.generation))
            case .abandon(let within): actions.append(.abandonAttempt(generation: retry.generation, within: within))
            }
            actions.append(.retryScheduled(retry))
        case .requestHedgePermit:
            actions.append(.requestRetryPermit)
        case .attemptLeft(let left):
            attemptEnded(left.report, left.endpoint, generation: left.generation, into: &actions)
            switch left.disposal {
            case .none: break
            case .cancel: actions.append(.cancelAttempt(generation: left.generation))
            case .abandon(let within): actions.append(.abandonAttempt(generation: left.generation, within: within))
            }
        case .deliverHead(let head, let delivery):
            // The losers first: what is recorded of the winner then goes to the one attempt left. The winner's own
            // report goes with its head (`HeadWrite.report`).
            letGo(delivery.cancel, cancel: true, into: &actions)
            reportEndpoint(delivery.endpoint, of: delivery.report, into: &actions)
            writeHead(head, delivery, into: &actions)
            replay(delivery.replay, generation: delivery.generation, now: now, into: &actions)
        case .relayBody(let buffer):
            relay(buffer, now: now, into: &actions)
        case .end(let ending, let record, let attempts):
            if let attempts {
                attemptEnded(attempts.report, attempts.endpoint, into: &actions)
                // Their transfers go with the exchange's end (`.requestFinished` or `.endResponse`).
                letGo(attempts.letGo, cancel: false, into: &actions)
            }
            exchangeEnded(ending, record, now: now, into: &actions)
        }
    }

    /// Attempts let go unanswered: their transfers cancelled (`cancel`), their endpoints told nothing was learned.
    private func letGo(_ attempts: [Exchange.LetGo], cancel: Bool, into actions: inout [Action]) {
        for attempt in attempts {
            if cancel {
                // A hedge race's losers: attempts sent, so counted (`backstop_upstream_attempts_total{outcome=
                // "cancelled"}`) and their spans ended as such, then their transfers cancelled.
                actions.append(.attemptLeft(generation: attempt.generation, .failed(.cancelled)))
                actions.append(.cancelAttempt(generation: attempt.generation))
            }
            if let endpoint = attempt.endpoint { actions.append(.endpointReport(endpoint, reason: nil)) }
        }
    }

    /// An attempt ended as `report` (nil: let go unanswered), meaning `endpoint` for its endpoint; `generation`: it
    /// left a hedge race that goes on.
    private func attemptEnded(
        _ report: Exchange.AttemptReport?, _ endpoint: EndpointReport?, generation: Int? = nil,
        into actions: inout [Action]
    ) {
        if let report {
            if let generation {
                actions.append(.attemptLeft(generation: generation, report))
            } else {
                actions.append(.attemptEnded(report))
            }
        }
        reportEndpoint(endpoint, of: report, into: &actions)
    }

    /// What the end of an attempt (as `report`) means for its endpoint, if it was given one.
    private func reportEndpoint(
        _ endpoint: EndpointReport?, of report: Exchange.AttemptReport?, into actions: inout [Action]
    ) {
        guard let endpoint else { return }
        // Named only for a failure (the `endpoint ejected` line): a success makes no string.
        guard endpoint.outcome == .failure else {
            actions.append(.endpointReport(endpoint, reason: nil))
            return
        }
        let reason: String? =
            switch report {
            case .response(let status, _)?: String(status)
            case .failed(let failure)?: failure.label
            case nil: nil
            }
        actions.append(.endpointReport(endpoint, reason: reason))
    }

    /// Feeds events held while a refresh or the budget was awaited back in, in order, as the attempt's own.
    private mutating func replay(
        _ events: [TransportEvent], generation: Int, now: Duration, into actions: inout [Action]
    ) {
        guard !events.isEmpty else { return }
        // Failures while relaying end the response: no retry is considered, nothing is drawn.
        var random = SplitMix64(seed: 0)
        for event in events {
            transportEvent(event, generation: generation, now: now, wall: 0, random: &random, into: &actions)
        }
    }

    private mutating func writeHead(
        _ head: UpstreamResponseHead, _ delivery: Exchange.Delivery, into actions: inout [Action]
    ) {
        guard case .active(let active) = state else { return }
        let facts = active.facts
        let framing = ResponseFraming.decide(
            requestIsHEAD: facts.isHEAD, status: head.status, contentLength: head.contentLength,
            clientIsHTTP10: facts.clientIsHTTP10)
        let connection: ResponseHeadWriter.ConnectionField =
            facts.closeAfterResponse || framing.endsConnection ? .close : (facts.clientIsHTTP10 ? .keepAlive : .none)
        active.response = .writing(ResponseRelay(framing: framing))
        actions.append(
            .writeHead(
                head,
                HeadWrite(
                    framing: framing, clientIsHTTP10: facts.clientIsHTTP10, connection: connection,
                    attempts: delivery.attempts, error: delivery.error, report: delivery.report)))
    }

    private mutating func relay(_ buffer: ByteBuffer, now: Duration, into actions: inout [Action]) {
        guard case .active(let active) = state, case .writing(var relay) = active.response else { return }
        let outcome = relay.relay(buffer)
        active.response = .writing(relay)
        switch outcome {
        case .write(let bytes, let chunk):
            if bytes.readableBytes > 0 { actions.append(.writeBody(bytes, chunk: chunk)) }
        case .overran(let allowed):
            if let allowed { actions.append(.writeBody(allowed, chunk: nil)) }
            withExchange(now: now, into: &actions) { $0.framingBroken(.bodyLongerThanAnnounced) }
        }
    }

    /// The exchange is over: its record first (metrics, the access line), then the response ends, is cut, or is an
    /// error.
    private mutating func exchangeEnded(
        _ ending: Exchange.Ending, _ record: Exchange.Record, now: Duration, into actions: inout [Action]
    ) {
        guard case .active(let active) = state else { return }
        active.exchange = nil
        var bytes = 0
        if case .writing(let relay) = active.response { bytes = relay.bytes }
        let finished = Finished(ending: ending, record: record, bytes: bytes)
        switch ending {
        case .completed(let requestComplete):
            guard case .writing(let relay) = active.response else {
                preconditionFailure("a response completed without a head")
            }
            if !requestComplete { actions.append(.failBodyStream) }
            let close = active.facts.closeAfterResponse || relay.framing.endsConnection || !requestComplete
            if !requestComplete { active.request = .discarding(lastPart: active.request.lastPart) }
            active.response = .ended
            actions.append(.endResponse(lastChunk: relay.lastChunk, close: close, finished))
            // The upload no longer matters: reads held for it resume.
            releaseUploadHold(into: &actions)
            responseEnded(close: close, now: now, into: &actions)
        case .aborted:
            if !record.requestComplete { actions.append(.failBodyStream) }
            actions.append(.requestFinished(finished))
            actions.append(.abortResponse)
            close()
        case .failedLocally(let reason, let requestComplete):
            if !requestComplete { actions.append(.failBodyStream) }
            actions.append(.requestFinished(finished))
            releaseUploadHold(into: &actions)
            if !requestComplete { active.request = .discarding(lastPart: active.request.lastPart) }
            active.response = .pending
            answer(
                reason, close: active.facts.closeAfterResponse || !requestComplete,
                attempts: record.attempts > 0 ? record.attempts : nil, message: record.message,
                retryAfter: record.retryAfter,
                now: now, into: &actions)
        case .clientClosed:
            // What follows is the caller's: the connection closed, or an unreadable request is answered.
            if !record.requestComplete { actions.append(.failBodyStream) }
            actions.append(.requestFinished(finished))
        }
    }

    private mutating func releaseUploadHold(into actions: inout [Action]) {
        guard uploadHold else { return }
        uploadHold = false
        resumeReadsIfHeld(into: &actions)
    }
}

// MARK: - answers Backstop writes itself

extension ConnectionStateMachine {
    /// Answers the request with a Backstop error: a `CONNECT` that could not be set up (`message` replaces the usual
    /// body). Ignored once the connection is closing.
    mutating func answerLocally(
        _ reason: ProxyErrorReason, close: Bool, message: String? = nil, now: Duration, into actions: inout [Action]
    ) {
        switch state {
        case .closing, .idle:
            return
        case .upgrading:
            state = .active(
                Active(facts: .unknown, request: .discarding(lastPart: nil), response: .pending, exchange: nil))
        case .active(let active):
            guard !active.hasExchange, active.response == .pending else {
                preconditionFailure("a local answer while the request's exchange answers")
            }
            if active.request != .ended { active.request = .discarding(lastPart: active.request.lastPart) }
        }
        answer(reason, close: close, attempts: nil, message: message, now: now, into: &actions)
    }

    /// A request head did not complete within `limits.header_timeout`: 408, and the connection closes — unless a
    /// response is under way: the client reads it first.
    mutating func headTimedOut(now: Duration, waited: Duration = .zero, into actions: inout [Action]) {
        switch state {
        case .closing: return
        case .active(let active) where active.response != .pending: return
        case .idle, .upgrading, .active: break
        }
        endExchange(into: &actions)
        answerUnreadable(
            .requestTimeout, detail: "request head not complete within limits.header_timeout", elapsed: waited,
            now: now, into: &actions)
    }

    /// The decoder could not parse what the client sent: `reason` (400, or 431 for a head too large), and the
    /// connection closes; a response under way is cut instead. Bytes that follow complete requests (pipelined, or
    /// after a request that closes the connection) do not cost those requests their answers: the refusal waits for
    /// them (docs/reference/behaviour.md#request-syntax), and is never sent when one of them closes the connection.
    mutating func parseFailed(_ reason: ProxyErrorReason, now: Duration, into actions: inout [Action]) {
        if case .active(let active) = state, active.request != .admitting {
            let complete: Bool
            if let last = queued.last {
                if case .end = last { complete = true } else { complete = false }
            } else {
                complete = active.request == .ended
            }
            if complete {
                refusalAfterQueue = reason
                return
            }
            // The rest of the request being read cannot be read: that request is the one answered (400
            // `bad-request`, with its upstream, method and path), once, rather than ended as a client that left
            // and answered again as a request nobody knows (operations.md#logs: one line per request).
            if queued.isEmpty, case .receiving = active.request, active.exchange != nil {
                withExchange(now: now, into: &actions) { $0.requestUnreadable(reason) }
                if case .closing = state { return }
                if case .active(let after) = state, case .discarding = after.request { return }
            }
        }
        endExchange(into: &actions)
        switch state {
        case .closing:
            return
        case .active(let active) where active.response != .pending:
            close()
            actions.append(.closeConnection)
        case .idle, .upgrading, .active:
            answerUnreadable(reason, detail: nil, now: now, into: &actions)
        }
    }

    /// The input ended inside a request (the decoder's `invalidEOFState`). Inside the body of the request being
    /// read, the client left: as a failed connection (`client-closed`, 499; a queued one is not stored), not a
    /// request that could not be read. Anywhere else (a head cut short, a request after the one in progress) it is
    /// what `parseFailed` makes of a request that cannot be read.
    mutating func inputEndedInsideRequest(now: Duration, into actions: inout [Action]) {
        if case .active(let active) = state, queued.isEmpty, case .receiving = active.request {
            connectionFailed(into: &actions)
            return
        }
        parseFailed(.badRequest, now: now, into: &actions)
    }

    /// Answers what could not be read: nothing of the request is known, and the connection closes.
    private mutating func answerUnreadable(
        _ reason: ProxyErrorReason, detail: String?, elapsed: Duration = .zero, now: Duration,
        into actions: inout [Action]
    ) {
        state = .active(Active(facts: .unknown, request: .discarding(lastPart: nil), response: .pending, exchange: nil))
        actions.append(.logLocalAnswer(reason, detail: detail, elapsed: elapsed))
        answer(reason, close: true, attempts: nil, message: nil, now: now, into: &actions)
    }

    /// Writes a Backstop error for the active request, then ends its response.
    private mutating func answer(
        _ reason: ProxyErrorReason, close: Bool, attempts: Int?, message: String?, retryAfter: Int? = nil,
        now: Duration, into actions: inout [Action]
    ) {
        guard case .active(let active) = state else { return }
        let facts = active.facts
        let write = ErrorWrite(
            clientIsHTTP10: facts.clientIsHTTP10,
            connection: close ? .close : (facts.clientIsHTTP10 ? .keepAlive : .none), omitBody: facts.isHEAD,
            attempts: attempts, message: message, retryAfter: retryAfter, close: close)
        // The state changes before the write: a write that completes at once closes the channel at once, and what
        // the decoder reports then must find the connection closing.
        if close {
            self.close()
            actions.append(.writeError(reason, write))
            return
        }
        actions.append(.writeError(reason, write))
        responseEnded(close: false, now: now, into: &actions)
    }

    /// The response went out. With `close`, the connection ends after it; otherwise, once the request's body was
    /// also read, the connection is idle again and the next queued request, if any, starts.
    private mutating func responseEnded(close: Bool, now: Duration, into actions: inout [Action]) {
        if close {
            self.close()
            return
        }
        guard case .active(let active) = state else { return }
        active.response = .ended
        requestMayBeDone(now: now, into: &actions)
    }

    /// When the request and its response have both ended, the connection is idle again.
    private mutating func requestMayBeDone(now: Duration, into actions: inout [Action]) {
        guard case .active(let active) = state, active.request == .ended, active.response == .ended else { return }
        state = .idle(deadline: now + idleTimeout)
        spare = active
        if queued.isEmpty, let reason = refusalAfterQueue {
            refusalAfterQueue = nil
            answerUnreadable(reason, detail: nil, now: now, into: &actions)
            return
        }
        if queueHold && queued.count < Self.maxQueuedParts / 2 && queuedBytes < Self.maxQueuedBytes / 2 {
            queueHold = false
            resumeReadsIfHeld(into: &actions)
        }
        actions.append(.awaitNextHead)
        drainQueue(now: now, into: &actions)
    }

    /// Handles queued parts while the machine can: between requests, and the rest of a request once admitted.
    private mutating func drainQueue(now: Duration, into actions: inout [Action]) {
        while !queued.isEmpty {
            switch state {
            case .closing, .upgrading:
                clearQueue()
                return
            case .active(let active) where active.request == .admitting || active.request == .ended:
                return
            case .idle where clientBacklogged:
                return
            case .idle, .active:
                process(dequeue(), now: now, into: &actions)
            }
        }
    }

    private mutating func close() {
        state = .closing
        clearQueue()
    }
}

// MARK: - reads, time, the client going away

extension ConnectionStateMachine {
    /// NIO asks to read from the socket: true to read now, false when held (the read is remembered).
    mutating func readRequested() -> Bool {
        if readsHeld {
            pendingRead = true
            return false
        }
        return true
    }

    private mutating func resumeReadsIfHeld(into actions: inout [Action]) {
        guard !readsHeld, pendingRead else { return }
        pendingRead = false
        actions.append(.read)
    }

    /// The connection's own deadline (idle between requests, body stall while a body is incomplete, not counted
    /// while Backstop itself holds reads) or the exchange's, whichever comes first.
    var nextDeadline: Duration? {
        switch state {
        case .idle(let deadline):
            return deadline
        case .active(let active):
            let stall = uploadHold ? nil : active.request.lastPart.map { $0 + idleTimeout }
            guard let exchange = active.withExchange({ $0.nextDeadline }) ?? nil else { return stall }
            guard let stall else { return exchange }
            return min(stall, exchange)
        case .upgrading, .closing:
            return nil
        }
    }

    /// The timer fired: the exchange's deadline first, then the connection's own.
    /// `headArriving`: part of the next request's head has arrived (`HeadTimeoutHandler`); an idle connection
    /// running out of time then holds a stalled request, answered 408 `request-timeout` like a stalled body
    /// (docs/reference/behaviour.md#client-connections), not closed silently.
    mutating func timerFired(
        now: Duration, wall: Double, random: inout some RandomNumberGenerator, headArriving: Bool = false,
        into actions: inout [Action]
    ) {
        withExchange(now: now, into: &actions) { $0.timerFired(now: now, wall: wall, random: &random) }
        switch state {
        case .idle(let deadline) where now >= deadline && headArriving:
            answerUnreadable(.requestTimeout, detail: nil, now: now, into: &actions)
        case .idle(let deadline) where now >= deadline:
            close()
            actions.append(.closeConnection)
        case .active(let active) where !uploadHold:
            guard let last = active.request.lastPart, now >= last + idleTimeout else { return }
            active.request = active.request.withLastPart(nil)
            if active.hasExchange {
                withExchange(now: now, into: &actions) { $0.clientStalled() }
            } else if active.response == .pending {
                if active.intake != nil {
                    // The intake's answer records it (its access line names the upstream).
                    active.intake = nil
                    actions.append(.discardQueued)
                } else {
                    actions.append(.logLocalAnswer(.requestTimeout, detail: nil))
                }
                answer(.requestTimeout, close: true, attempts: nil, message: nil, now: now, into: &actions)
            } else {
                close()
                actions.append(.abortResponse)
            }
        default:
            break
        }
    }

    /// The client's connection closed or failed: everything stops, pending retries included.
    mutating func connectionClosed(into actions: inout [Action]) {
        endExchange(into: &actions)
        endIntake(into: &actions)
        close()
    }

    /// The connection failed (not a parse error): the exchange ends, and the connection closes unless it already is.
    mutating func connectionFailed(into actions: inout [Action]) {
        endExchange(into: &actions)
        endIntake(into: &actions)
        guard !isClosing else { return }
        close()
        actions.append(.closeConnection)
    }

    /// The channel was handed to a tunnel or an intercepted TLS session: this machine is done.
    mutating func handedOver() { close() }

    /// The client went away while a queued request was read: it is not stored (recorded as the client's leaving).
    /// One being stored goes on (it is delivered; nobody hears the `202`): `intakeEnded` records it.
    private mutating func endIntake(into actions: inout [Action]) {
        guard case .active(let active) = state, let intake = active.intake else { return }
        guard !intake.storing else {
            storeOutlivedClient = true
            return
        }
        active.intake = nil
        actions.append(.queuedUnanswered(delivery: nil))
    }

    /// Ends the active exchange as the client going away (`client-closed`).
    private mutating func endExchange(into actions: inout [Action]) {
        withExchange(now: .zero, into: &actions) { $0.clientGone() }
    }
}
