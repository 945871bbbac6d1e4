import BackstopCore
import BackstopQueue
import BackstopTracing
import NIOCore
import NIOHTTP1

/// The effects of one request to a `delivery: queue` upstream on a client connection
/// (docs/reference/behaviour.md#queued-delivery): the body kept while it is read (its bytes count in
/// `limits.buffer_memory`), storing the whole request, and its access line. It decides nothing: the connection
/// machine says when to keep, store or let go (`.keepQueuedBody`, `.storeQueued`, `.discardQueued`), and hears how
/// storing ended (`intakeEnded`).
final class QueueIntake {
    let upstream: String
    let record: AccessRecord.Request
    let started: Duration
    private let method: String
    private let target: String
    private let headers: [QueuedRequest.Header]
    private let runtime: ProxyRuntime
    private let bufferMemory: Int
    private var body: ByteBuffer?
    /// Bytes of `limits.buffer_memory` this request holds.
    private var reserved = 0
    private var finished = false
    /// The request's server span, begun as its head was read and ended with its answer (a refused or queued request
    /// is a request too: docs/reference/operations.md#tracing); nil without tracing.
    private let trace: (span: RequestTrace, facts: RequestFacts)?

    init(
        head: ClientRequestHead, upstream: String, record: AccessRecord.Request, runtime: ProxyRuntime,
        bufferMemory: Int, now: Duration
    ) {
        self.upstream = upstream
        self.record = record
        self.started = now
        self.method = head.method.rawValue
        self.target = head.uri
        // Hop-by-hop fields (those a `Connection` field lists too, as for a forwarded request) and the client's proxy
        // credentials are never stored; the body is stored whole.
        var listed = Set<String>()
        for (name, value) in head.headers where name.caseInsensitiveEquals("connection") {
            Array(value.utf8).withUnsafeBytes { HeaderName.appendTokens(of: $0, to: &listed) }
        }
        self.headers = head.headers.compactMap { name, value in
            let lower = name.lowercased()
            return LoopbackDeliverySender.droppedHeaders.contains(lower) || listed.contains(lower)
                ? nil : QueuedRequest.Header(name, value)
        }
        self.runtime = runtime
        self.bufferMemory = bufferMemory
        trace = runtime.tracer.map { tracer in
            (
                tracer.startRequest(headers: head.headers, at: now),
                RequestFacts(
                    head, record, target: RequestTarget.parse(head.uri), status: 0, upstream: upstream,
                    errorReason: nil, attempts: 0)
            )
        }
        runtime.requestStarted()
    }

    /// Ends the request's server span with its answer: `202`, or why it was not stored.
    func answered(status: Int, error: String?, at now: Duration) {
        guard let trace else { return }
        var facts = trace.facts
        facts.status = status
        facts.errorReason = error
        trace.span.finish(facts, at: now)
    }

    /// Keeps `part`; false when it does not fit `limits.buffer_memory` (nothing of it is kept then).
    func keep(_ part: ByteBuffer) -> Bool {
        guard runtime.reserveBodyMemory(part.readableBytes, limit: bufferMemory) else { return false }
        reserved += part.readableBytes
        if body == nil {
            body = part
        } else {
            body!.writeImmutableBuffer(part)
        }
        return true
    }

    /// Stores the request; `then` gets how it ended, on any thread.
    func store(
        in deliverer: QueueDeliverer,
        then: @escaping @Sendable (ConnectionStateMachine.IntakeOutcome) -> Void
    ) {
        let request = QueuedRequest(
            method: method, target: target, headers: headers, body: body.map { Array($0.readableBytesView) } ?? [])
        release()
        let upstream = self.upstream
        let logger = runtime.logger
        // Straight from the event loop to the store's thread and back (`then` hops to the loop): no task
        // (docs/performance.md#queued-delivery).
        deliverer.accept(upstream: upstream, request) { result in
            switch result {
            case .success(let id):
                then(.stored(delivery: id.text))
            // No room is what `spool-full` says; the store failing otherwise is that too for the client (it
            // was not stored), and an operator must see it.
            case .failure(.closed):
                then(.refused(.shuttingDown))
            case .failure(.budgetExhausted), .failure(.diskFull):
                then(.refused(.spoolFull))
            case .failure(let error):
                logger.error(
                    "cannot store a queued request",
                    metadata: ["upstream": .string(upstream), "error": .string(error.description)])
                then(.refused(.spoolFull))
            }
        }
    }

    /// The request ended (answered, refused or abandoned): what it held is let go.
    func finish() {
        release()
        guard !finished else { return }
        finished = true
        runtime.requestFinished()
    }

    private func release() {
        body = nil
        runtime.releaseBodyMemory(reserved)
        reserved = 0
    }
}
