import BackstopCore
import BackstopTracing
import BackstopTransport
import NIOHTTP1

/// The span of an attempt in flight, with what is known of it so far (`facts` only when the trace is recorded).
struct AttemptTrace {
    let generation: Int
    let span: AttemptSpan
    var facts: AttemptFacts?
}

/// The exchange's spans (docs/reference/operations.md#tracing): the server span runs from the exchange's start to
/// `finish`; an attempt's client span from its `.startAttempt` to the action that ends it (`.retryScheduled`,
/// `.refreshCredential`, `.attemptLeft`, a lost hedge race's `.cancelAttempt`, or the end of the exchange). While a
/// request is hedged several are open: `attemptTrace` is the oldest, `hedgeTraces` the others; the actions that end
/// "the" attempt come when only one is left. Each hook is a nil check without `tracing`.
extension Exchange {
    /// The request was routed: continue the client's trace, or start one.
    func traceRequestStarted(now: Duration) {
        guard let tracer = environment.runtime.tracer else { return }
        trace = tracer.startRequest(headers: head.headers, at: now)
    }

    /// An attempt is about to be sent: its span, and the `traceparent` naming that span in `request` (in place of
    /// the client's; `tracestate` goes as the client sent it). A hedged copy's span opens beside the others'.
    func traceAttemptStarted(
        _ request: inout TransportRequest, attempt: Int, generation: Int, hedge: Bool, endpoint: String
    ) {
        guard trace != nil else { return }
        if !hedge {
            // None is open: every attempt's end is traced before the next that is not a copy.
            while attemptTrace != nil { traceAttemptEnded(failure: "cancelled") }
        }
        let now = self.now
        guard let span = trace?.startAttempt(at: now) else { return }
        span.settingTraceparent(in: &request.headers)
        var facts: AttemptFacts?
        if trace?.sampled == true {
            facts = AttemptFacts(
                method: request.method, url: request.url, upstream: destination.name, endpoint: endpoint,
                attempt: attempt, hedge: hedge, outcome: "")
        }
        let opened = AttemptTrace(generation: generation, span: span, facts: facts)
        if attemptTrace == nil { attemptTrace = opened } else { hedgeTraces.append(opened) }
    }

    /// Attempt `generation` left a hedge race that goes on (`.attemptLeft`): its span ends with how it ended.
    func traceAttemptLeft(_ generation: Int, _ report: ExchangeStateMachine.AttemptReport) {
        guard var attempt = takeTrace(generation) else { return }
        switch report {
        case .response(let status, let version):
            attempt.facts?.status = status
            attempt.facts?.protocolVersion = version
            end(attempt, failure: nil)
        case .failed(let failure):
            end(attempt, failure: failure.label)
        }
    }

    /// Attempt `generation`'s transfer was cancelled while another attempt's span is open: it lost a hedge race (a
    /// lone attempt's span is ended by the action that disposes of it: `.retryScheduled`, the exchange's end).
    func traceAttemptCancelled(_ generation: Int) {
        guard !hedgeTraces.isEmpty, let attempt = takeTrace(generation) else { return }
        end(attempt, failure: "cancelled")
    }

    /// Takes attempt `generation`'s open span; the oldest of the others becomes `attemptTrace` in its place.
    private func takeTrace(_ generation: Int) -> AttemptTrace? {
        if let attempt = attemptTrace, attempt.generation == generation {
            attemptTrace = hedgeTraces.isEmpty ? nil : hedgeTraces.removeFirst()
            return attempt
        }
        guard let index = hedgeTraces.firstIndex(where: { $0.generation == generation }) else { return nil }
        return hedgeTraces.remove(at: index)
    }

    /// The attempt's response head arrived.
    func traceAttemptHead(status: Int, version: String) {
        // `trace` first: with tracing off, looking at the attempt's facts copied them (~200 instructions a request).
        guard trace != nil, attemptTrace?.facts != nil else { return }
        attemptTrace?.facts?.status = status
        attemptTrace?.facts?.protocolVersion = version
    }

    /// The attempt in flight ended. Its outcome is its status class when a head came, else `failure`; `retry` is
    /// the `retry.on` condition it is retried for and the wait before the next attempt.
    func traceAttemptEnded(failure: String?, retry: (reason: RetryCondition, after: Duration)? = nil) {
        guard let attempt = attemptTrace else { return }
        attemptTrace = hedgeTraces.isEmpty ? nil : hedgeTraces.removeFirst()
        end(attempt, failure: failure, retry: retry)
    }

    private func end(
        _ attempt: AttemptTrace, failure: String?, retry: (reason: RetryCondition, after: Duration)? = nil
    ) {
        guard var facts = attempt.facts, let trace else { return }
        facts.end(failure: failure, retry: retry)
        trace.endAttempt(attempt.span, facts, at: now)
    }

    /// The machine retries the attempt in flight (`.retryScheduled`): a status in `retry.on`, or a failure below
    /// HTTP.
    func traceRetry(_ retry: ExchangeStateMachine.Retry) {
        guard attemptTrace != nil else { return }
        let failure = retry.reason.isTransportCondition ? retry.failure?.label ?? retry.reason.description : nil
        traceAttemptEnded(failure: failure, retry: (retry.reason, retry.after))
    }

    /// The request waited on a token refresh that another request started: its server span links to it.
    func traceWaited(on refresh: SpanLink?) {
        guard let refresh else { return }
        trace?.waited(on: refresh)
    }

    /// The exchange ended: the open attempt's span (the copies still in a hedge race were let go: cancelled), then
    /// the server span.
    func traceFinished(_ ending: ExchangeStateMachine.Ending, _ record: ExchangeStateMachine.Record) {
        guard trace != nil else { return }
        while let copy = hedgeTraces.popLast() { end(copy, failure: "cancelled") }
        if attemptTrace != nil { traceAttemptEnded(failure: Self.attemptFailure(ending, record)) }
        guard let trace, trace.sampled else { return }
        trace.finish(
            RequestFacts(
                head, self.record, target: target, status: record.status,
                upstream: destination.upstream == nil ? nil : destination.name,
                errorReason: ending.note ?? record.headError?.rawValue, attempts: record.attempts), at: now)
    }

    /// Why the attempt open at the end failed, from the exchange's end: a failure below HTTP by its label, a
    /// timeout as `timeout`, anything else (the response broke off, the client left or stalled) by the end's note.
    static func attemptFailure(
        _ ending: ExchangeStateMachine.Ending, _ record: ExchangeStateMachine.Record
    ) -> String? {
        switch ending {
        case .completed: return nil
        case .failedLocally(.upstreamTimeout, _): return "timeout"
        case .failedLocally(let reason, _)
        where [.upstreamUnreachable, .badUpstreamResponse, .badRequest, .loopDetected, .destinationDenied].contains(
            reason):
            return record.lastFailure?.label ?? reason.rawValue
        case .failedLocally, .aborted, .clientClosed: return ending.note
        }
    }
}

extension AttemptFacts {
    /// How an attempt ended, for its span (exchanges and upgrade handshakes alike): its status class when a head
    /// came, else `failure`; `retry` is the `retry.on` condition it is retried for and the wait before the next.
    mutating func end(failure: String?, retry: (reason: RetryCondition, after: Duration)?) {
        outcome = status.map(ProxyMetrics.statusClassLabel) ?? failure ?? "cancelled"
        self.failure = failure
        if let retry {
            retryReason = retry.reason.description
            backoffMilliseconds = retry.after.nanosecondsClamped / 1_000_000
        }
    }
}

extension RequestFacts {
    /// A client request's facts for its server span, from its head and what its access line records.
    init(
        _ head: ClientRequestHead, _ request: AccessRecord.Request, target: RequestTarget?, status: Int,
        upstream: String?,
        errorReason: String?, attempts: Int
    ) {
        var serverAddress: String?
        var serverPort: Int?
        if case .absolute(let scheme, let host, let port)? = target?.form {
            serverAddress = host
            serverPort = port ?? (scheme == "https" ? 443 : 80)
        } else if let authority = head.headers.first(name: "host"),
            let (host, port) = SpanAttributes.split(authority: Substring(authority))
        {
            serverAddress = host
            serverPort = port
        }
        // `127.0.0.1:53210`, `[::1]:53210`; a unix-socket client has no address.
        let client = SpanAttributes.split(authority: Substring(request.client))?.0
        self.init(
            method: request.method, path: request.path, serverAddress: serverAddress, serverPort: serverPort,
            clientAddress: client == "unix" || client == "-" ? nil : client,
            userAgent: head.headers.first(name: "user-agent"), protocolVersion: head.version.minor == 0 ? "1.0" : "1.1",
            status: status, upstream: upstream, errorReason: errorReason, attempts: attempts)
    }
}
