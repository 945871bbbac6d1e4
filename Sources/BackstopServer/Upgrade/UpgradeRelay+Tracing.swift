import BackstopCore
import BackstopTracing
import BackstopTransport

/// An upgrade request's spans (docs/reference/operations.md#tracing), as any request's: a server span from the
/// handshake's start to its answer (the `101`, a relayed answer once it is through, or a local error), and a client
/// span per attempt, from its start to its head (or its failure), whose id the attempt's `traceparent` names. The
/// relay after a `101` is not a span: it can last hours, and its `upgrade` log line says how it went. Each hook is
/// a nil check without `tracing`.
extension UpgradeRelay {
    /// The handshake began: continue the client's trace, or start one.
    func traceRequestStarted(at start: Duration) {
        guard let tracer = runtime.tracer else { return }
        trace = tracer.startRequest(headers: request.head.headers, at: start)
    }

    /// Attempt `attempt` is about to be sent: its span, and the `traceparent` naming it in `built` (in place of the
    /// client's; `tracestate` goes as the client sent it).
    func traceAttemptStarted(_ built: inout TransportRequest, attempt: Int) {
        guard trace != nil else { return }
        traceAttemptEnded(failure: "cancelled")  // none is open: every attempt's end is traced before the next
        guard let span = trace?.startAttempt(at: now) else { return }
        span.settingTraceparent(in: &built.headers)
        attemptSpan = span
        if trace?.sampled == true {
            attemptFacts = AttemptFacts(
                method: built.method, url: built.url, upstream: request.upstream.config.name,
                endpoint: request.upstream.origin, attempt: attempt, outcome: "")
        }
    }

    /// The attempt's span was opened but nothing was sent: it is not recorded.
    func traceAttemptDropped() {
        attemptSpan = nil
        attemptFacts = nil
    }

    /// The attempt's response head arrived.
    func traceAttemptHead(status: Int, version: String) {
        guard attemptFacts != nil else { return }
        attemptFacts?.status = status
        attemptFacts?.protocolVersion = version
    }

    /// The attempt in flight ended: its outcome is its status class when a head came, else `failure`; `retry` is the
    /// `retry.on` condition it is retried for and the wait before the next attempt.
    func traceAttemptEnded(failure: String?, retry: (reason: RetryCondition, after: Duration)? = nil) {
        guard let span = attemptSpan else { return }
        attemptSpan = nil
        guard var facts = attemptFacts, let trace else { return }
        attemptFacts = nil
        facts.end(failure: failure, retry: retry)
        trace.endAttempt(span, facts, at: now)
    }

    /// The handshake waited on a token refresh that another request started: its server span links to it.
    func traceWaited(on refresh: SpanLink?) {
        guard let refresh else { return }
        trace?.waited(on: refresh)
    }

    /// The handshake was answered (`status`; `error` the local error or `client-closed`): the open attempt's span,
    /// then the server span.
    func traceFinished(status: Int, error: String?, attempts: Int) {
        guard trace != nil else { return }
        traceAttemptEnded(failure: error)
        guard let trace, trace.sampled else { return }
        trace.finish(
            RequestFacts(
                request.head, request.record, target: request.target, status: status,
                upstream: request.upstream.config.name, errorReason: error, attempts: attempts),
            at: now)
    }
}
