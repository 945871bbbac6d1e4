import BackstopCore
import BackstopTransport
import NIOCore
import Testing

@testable import BackstopServer

/// Every transition of `ExchangeStateMachine`, as a table: each row drives a fresh machine through events and
/// compares every returned action whole (as async-http-client's `HTTPRequestStateMachineTests` do). No sockets, no
/// transport, no sleeps: time is a `Duration` the row moves; randomness is `ScriptedRandom`.
@Suite("Exchange state machine")
struct ExchangeStateMachineTests {
    typealias Machine = ExchangeStateMachine
    typealias Action = Machine.Action
    static let t0 = Duration.seconds(100)
    static func at(_ milliseconds: Int) -> Duration { t0 + .milliseconds(milliseconds) }

    /// GET without a body to an upstream retrying 503/reset/timeout/connect failures, backoff constant 100 ms
    /// without jitter, so every wait is exact.
    static func configuration(
        method: String = "GET", hasBody: Bool = false, declaredLength: Int? = nil, retryBuffer: Int = 1024,
        maxRequestBody: Int = 1 << 20,
        timeouts: Timeouts = Timeouts(
            connect: .seconds(1), perTry: .seconds(2), total: .seconds(10), idle: .seconds(5)),
        credential: Machine.CredentialKind = .none, attempts: Int = 3, retryable: Bool = true,
        bodyMustBeKept: Bool = false
    ) -> Machine.Configuration {
        let retry = RetryConfig(
            attempts: attempts,
            backoff: BackoffConfig(strategy: .constant, base: .milliseconds(100), max: .seconds(1), jitter: .none))
        return Machine.Configuration(
            method: method, hasBody: hasBody, declaredLength: declaredLength, retryBuffer: retryBuffer,
            maxRequestBody: maxRequestBody, timeouts: timeouts, hasIdempotencyKey: false, credential: credential,
            retry: retryable ? RetryPolicy(config: retry, timeouts: timeouts) : nil, bodyMustBeKept: bodyMustBeKept)
    }

    static func head(_ status: Int, contentLength: Int? = 2) -> UpstreamResponseHead {
        UpstreamResponseHead(status: status, contentLength: contentLength)
    }
    static let ok = ByteBuffer(string: "ok")
    static let token1 = ManagedToken(value: "t1", generation: 1, expiry: nil)
    static let token2 = ManagedToken(value: "t2", generation: 2, expiry: nil)
    static let reset = TransportFailure.reset(detail: "connection reset")

    // MARK: the table's vocabulary

    /// One event fed to the machine, at `Self.at(ms)`.
    enum Event {
        case start(ms: Int = 0)
        case body(Int, ms: Int = 0)
        case bufferDenied
        case streamingBegan
        /// The executor kept the streamed body in the spool.
        case spooledStreamingBegan
        case spoolFailed
        case bodyEnded(ms: Int = 0)
        case credential(Machine.Credential?, ms: Int = 0)
        case head(UpstreamResponseHead, generation: Int = 1, ms: Int = 0)
        case responseBody(ByteBuffer, generation: Int = 1, ms: Int = 0)
        case end(generation: Int = 1)
        case failure(TransportFailure, generation: Int = 1, ms: Int = 0)
        case permit(Bool, ms: Int = 0)
        /// The answer to `.requestRetryPermit` when no endpoint may take the retry (every one ejected).
        case noEndpoint(ms: Int = 0)
        case refreshed(ManagedToken?, ms: Int = 0)
        case timer(ms: Int)
        case writable(ms: Int)
        case framingBroken(Machine.AbortCause)
        case stalled
        case gone
        /// The endpoint set's answer to `.chooseEndpoint`.
        case endpoint(EndpointVerdict, ms: Int = 0)
        /// The host's network changed.
        case network(ms: Int)
    }

    /// `@unchecked Sendable`, safe because: rows hold machine values not declared `Sendable`, but only as `let`s
    /// (values, and a `RetryPolicy` that is itself immutable) built once in the static `rows` array and only read by
    /// the one test invocation that receives each; nothing mutates a row after creation.
    struct Row: CustomTestStringConvertible, @unchecked Sendable {
        let name: String
        let configuration: Machine.Configuration
        let steps: [(Event, Action)]
        /// The deadline after the last step.
        var deadline: Duration?? = .none
        var testDescription: String { name }
    }

    static func start(
        _ generation: Int = 1, attempt: Int? = nil, credential: Machine.Credential = .none, mayResend: Bool = true,
        replacing: Int? = nil
    ) -> Action {
        let attempt = attempt ?? generation
        return .startAttempt(
            Machine.Start(
                generation: generation, attempt: attempt, credential: credential, mayResend: mayResend,
                countsAsRequest: attempt == 1, replacing: replacing))
    }

    static func deliver(
        _ head: UpstreamResponseHead, generation: Int = 1, attempts: Int = 1, error: ProxyErrorReason? = nil,
        reported: Bool = true, replay: [TransportEvent] = []
    ) -> Action {
        .deliverHead(
            head,
            Machine.Delivery(
                generation: generation, error: error, attempts: attempts,
                report: reported ? .response(status: head.status, version: "1.1") : nil, replay: replay))
    }

    static func record(
        _ status: Int, attempts: Int = 1, retries: [RetryCondition] = [], giveUp: GiveUpReason? = nil,
        condition: RetryCondition? = nil, failure: TransportFailure? = nil, headError: ProxyErrorReason? = nil,
        complete: Bool = true, message: String? = nil
    ) -> Machine.Record {
        var record = Machine.Record(
            status: status, attempts: attempts, retries: retries, giveUp: giveUp, giveUpCondition: condition,
            lastFailure: failure, headError: headError, requestComplete: complete)
        record.message = message
        return record
    }

    /// `record` with attempts that were in flight when the exchange ended, let go unanswered (counted as such).
    static func unanswered(_ record: Machine.Record, settled: Bool = true, copies: Int = 0) -> Machine.Record {
        var record = record
        record.unanswered = Machine.UnansweredAttempts(settled: settled, copies: copies)
        return record
    }

    static func report(_ status: Int) -> Machine.AttemptReport { .response(status: status, version: "1.1") }

    static func retry(
        _ reason: RetryCondition, attempt: Int = 1, generation: Int? = nil, disposal: Machine.Disposal,
        failure: TransportFailure? = nil, after: Duration = .milliseconds(100)
    ) -> Action {
        .retry(
            Machine.Retry(
                attempt: attempt, after: after, reason: reason, generation: generation ?? attempt, disposal: disposal,
                failure: failure))
    }

    // MARK: the table

    static let rows: [Row] = [
        // receivingBody
        Row(
            name: "no body: the attempt starts at once, its response is relayed to its end",
            configuration: configuration(),
            steps: [
                (.start(), start()),
                (.head(head(200), ms: 5), deliver(head(200))),
                (.responseBody(ok, ms: 6), .relayBody(ok)),
                (.end(), .end(.completed(requestComplete: true), record(200), report: nil)),
            ], deadline: .some(nil)),
        Row(
            name: "a kept body: stored part by part, the attempt starts at its end",
            configuration: configuration(method: "PUT", hasBody: true, declaredLength: 20),
            steps: [
                (.start(), .none), (.body(10), .storeBody), (.body(10), .storeBody),
                (.bodyEnded(ms: 1), start()),
            ]),
        Row(
            name: "a declared length above retry_buffer streams at once; the attempt starts when the stream exists",
            configuration: configuration(method: "PUT", hasBody: true, declaredLength: 2000),
            steps: [
                (.start(), .beginStreaming), (.streamingBegan, start()), (.body(1000), .storeBody),
                (.bodyEnded(), .finishBodyStream),
            ]),
        Row(
            name: "a spooled body is sent again after a reset, even before its last byte arrived",
            configuration: configuration(method: "PUT", hasBody: true, declaredLength: 2000),
            steps: [
                (.start(), .beginStreaming), (.spooledStreamingBegan, start()), (.body(1000), .storeBody),
                (.failure(reset), .requestRetryPermit(report: .failed(reset))),
                (.permit(true), retry(.reset, disposal: .none, failure: reset)),
                (.timer(ms: 100), start(2)), (.body(1000), .storeBody), (.bodyEnded(ms: 100), .finishBodyStream),
                (.failure(reset, generation: 2, ms: 100), .requestRetryPermit(report: .failed(reset))),
                (.permit(true, ms: 100), retry(.reset, attempt: 2, disposal: .none, failure: reset)),
                (.timer(ms: 200), start(3)),
                (.head(head(200), generation: 3, ms: 200), deliver(head(200), generation: 3, attempts: 3)),
            ]),
        Row(
            name: "a spool that fails (its disk full) before a response: 507 spool-full, the attempt let go",
            configuration: configuration(method: "PUT", hasBody: true, declaredLength: 2000),
            steps: [
                (.start(), .beginStreaming), (.spooledStreamingBegan, start()), (.body(1000), .storeBody),
                (
                    .spoolFailed,
                    .end(
                        .failedLocally(.spoolFull, requestComplete: false),
                        unanswered(record(507, complete: false)), report: nil)
                ),
                (.spoolFailed, .none), (.body(1000), .none),
            ]),
        Row(
            name: "a spool that fails while the response is relayed: the body is no longer kept",
            configuration: configuration(method: "PUT", hasBody: true, declaredLength: 2000),
            steps: [
                (.start(), .beginStreaming), (.spooledStreamingBegan, start()),
                (.head(head(200)), deliver(head(200))), (.spoolFailed, .none),
                (
                    .failure(reset),
                    .end(.aborted(.upstreamBrokeMidResponse), record(200, failure: reset, complete: false), report: nil)
                ),
            ]),
        Row(
            name: "a chunked body crossing retry_buffer turns into a stream with its part",
            configuration: configuration(method: "PUT", hasBody: true),
            steps: [
                (.start(), .none), (.body(1000), .storeBody), (.body(100), .storeBodyAndBeginStreaming),
                (.streamingBegan, start()),
            ]),
        Row(
            name: "no room in buffer_memory: the body streams",
            configuration: configuration(method: "PUT", hasBody: true),
            steps: [(.start(), .none), (.body(10), .storeBody), (.bufferDenied, .beginStreaming)]),
        Row(
            name: "a body that must be kept is refused 413 instead of streamed (declared, grown, denied)",
            configuration: configuration(
                method: "PUT", hasBody: true, declaredLength: 2000, credential: .staticValue, bodyMustBeKept: true),
            steps: [
                (
                    .start(),
                    .end(
                        .failedLocally(.bodyTooLarge, requestComplete: false),
                        record(413, attempts: 0, complete: false, message: Machine.signedBodyPastRetryBuffer),
                        report: nil)
                )
            ]),
        Row(
            name: "a kept body denied buffer_memory when it must be kept: 413",
            configuration: configuration(method: "PUT", hasBody: true, credential: .staticValue, bodyMustBeKept: true),
            steps: [
                (.start(), .none), (.body(10), .storeBody),
                (
                    .bufferDenied,
                    .end(
                        .failedLocally(.bodyTooLarge, requestComplete: false),
                        record(
                            413, attempts: 0, complete: false,
                            message: "the request body must be kept whole to be signed (aws_sigv4 payload: signed) "
                                + "and limits.buffer_memory has no room for it now"),
                        report: nil)
                ),
            ]),
        Row(
            name: "a body past max_request_body: 413",
            configuration: configuration(method: "PUT", hasBody: true, maxRequestBody: 100),
            steps: [
                (.start(), .none), (.body(100), .storeBody),
                (
                    .body(1),
                    .end(
                        .failedLocally(.bodyTooLarge, requestComplete: false),
                        record(413, attempts: 0, complete: false),
                        report: nil)
                ),
            ]),
        Row(
            name: "a kept body trickling past timeouts.total: 408",
            configuration: configuration(method: "PUT", hasBody: true),
            steps: [
                (.start(), .none), (.timer(ms: 9_999), .none),
                (
                    .timer(ms: 10_000),
                    .end(
                        .failedLocally(.requestTimeout, requestComplete: false),
                        record(408, attempts: 0, complete: false), report: nil)
                ),
            ]),
        // acquiringCredential
        Row(
            name: "a static credential is read for the attempt",
            configuration: configuration(credential: .staticValue),
            steps: [(.start(), .acquireCredential), (.credential(.value("k")), start(credential: .value("k")))],
            deadline: .some(at(2_000))),
        Row(
            name: "no credential: 502 token-unavailable",
            configuration: configuration(credential: .staticValue),
            steps: [
                (.start(), .acquireCredential),
                (
                    .credential(nil),
                    .end(
                        .failedLocally(.tokenUnavailable, requestComplete: true), record(502, attempts: 0), report: nil)
                ),
            ]),
        Row(
            name: "a token fetch outliving timeouts.total: 502 token-unavailable; its late answer is stale",
            configuration: configuration(credential: .oauth2(refreshOn: [401])),
            steps: [
                (.start(), .acquireCredential),
                (
                    .timer(ms: 10_000),
                    .end(
                        .failedLocally(.tokenUnavailable, requestComplete: true), record(502, attempts: 0), report: nil)
                ),
                (.credential(.token(token1)), .none),
            ]),
        // attempting: stale events
        Row(
            name: "events of a generation that is not in flight are stale: ignored",
            configuration: configuration(),
            steps: [
                (.start(), start()), (.head(head(200), generation: 7), .none), (.head(head(200), generation: 0), .none),
                (.responseBody(ok, generation: 7), .none), (.end(generation: 7), .none),
                (.failure(reset, generation: 7), .none), (.refreshed(token2), .none), (.permit(true), .none),
                (.head(head(200)), deliver(head(200))),
            ]),
        // attempting → awaitingRetryPermit → backingOff → attempting
        Row(
            name: "a small 503 asks the budget, is left to finish, and the next attempt starts after the backoff",
            configuration: configuration(),
            steps: [
                (.start(), start()), (.head(head(503), ms: 10), .requestRetryPermit(report: report(503))),
                (.permit(true, ms: 10), retry(.status(503), disposal: .abandon(within: .seconds(5)))),
                (.timer(ms: 109), .none), (.timer(ms: 110), start(2)),
                (.head(head(503), generation: 1), .none),
                (.head(head(200), generation: 2), deliver(head(200), generation: 2, attempts: 2)),
                (
                    .end(generation: 2),
                    .end(
                        .completed(requestComplete: true), record(200, attempts: 2, retries: [.status(503)]),
                        report: nil)
                ),
            ]),
        Row(
            name: "a large or unframed retried response is cancelled",
            configuration: configuration(),
            steps: [
                (.start(), start()), (.head(head(503, contentLength: nil)), .requestRetryPermit(report: report(503))),
                (.permit(true), retry(.status(503), disposal: .cancel)),
            ]),
        Row(
            name: "the budget says no: the 503 is delivered as it is",
            configuration: configuration(),
            steps: [
                (.start(), start()), (.head(head(503)), .requestRetryPermit(report: report(503))),
                (.permit(false), deliver(head(503), reported: false)),
                (
                    .end(),
                    .end(
                        .completed(requestComplete: true),
                        record(503, giveUp: .budgetExhausted, condition: .status(503)), report: nil)
                ),
            ]),
        Row(
            name: "events that come while the permit is asked are held, and replayed after a refused retry's head",
            configuration: configuration(),
            steps: [
                (.start(), start()), (.head(head(503)), .requestRetryPermit(report: report(503))),
                (.responseBody(ok), .none), (.end(), .none),
                (.permit(false), deliver(head(503), reported: false, replay: [.body(ok), .end])),
            ]),
        Row(
            name: "the last attempt's 503 is delivered (attempts exhausted)",
            configuration: configuration(attempts: 1),
            steps: [
                (.start(), start()), (.head(head(503)), deliver(head(503))),
                (
                    .end(),
                    .end(
                        .completed(requestComplete: true),
                        record(503, giveUp: .attemptsExhausted, condition: .status(503)), report: nil)
                ),
            ]),
        Row(
            name: "a reset is retried; its transfer already ended",
            configuration: configuration(),
            steps: [
                (.start(), start()), (.failure(reset), .requestRetryPermit(report: .failed(reset))),
                (.permit(true), retry(.reset, disposal: .none, failure: reset)),
            ]),
        Row(
            name: "a reset the budget refuses: 502 upstream-unreachable",
            configuration: configuration(),
            steps: [
                (.start(), start()), (.failure(reset), .requestRetryPermit(report: .failed(reset))),
                (
                    .permit(false),
                    .end(
                        .failedLocally(.upstreamUnreachable, requestComplete: true),
                        record(502, giveUp: .budgetExhausted, condition: .reset, failure: reset), report: nil)
                ),
            ]),
        Row(
            name: "a reset of a POST is not retried (method-not-retryable); libcurl may not resend it",
            configuration: configuration(method: "POST"),
            steps: [
                (.start(), start(mayResend: false)),
                (
                    .failure(reset),
                    .end(
                        .failedLocally(.upstreamUnreachable, requestComplete: true),
                        record(502, giveUp: .methodNotRetryable, condition: .reset, failure: reset),
                        report: .failed(reset))
                ),
            ]),
        Row(
            name: "a connect failure is retried for any method",
            configuration: configuration(method: "POST"),
            steps: [
                (.start(), start(mayResend: false)),
                (
                    .failure(.connectFailure(detail: "refused")),
                    .requestRetryPermit(report: .failed(.connectFailure(detail: "refused")))
                ),
            ]),
        Row(
            name: "a failure that is never retried maps to its error, with no rule noted",
            configuration: configuration(),
            steps: [
                (.start(), start()),
                (
                    .failure(.loopDetected(detail: "own listener")),
                    .end(
                        .failedLocally(.loopDetected, requestComplete: true),
                        record(508, failure: .loopDetected(detail: "own listener")),
                        report: .failed(.loopDetected(detail: "own listener")))
                ),
            ]),
        Row(
            name: "passthrough: a reset is not retried (no policy)",
            configuration: configuration(retryable: false),
            steps: [
                (
                    .start(),
                    .startAttempt(
                        Machine.Start(
                            generation: 1, attempt: 1, credential: .none, mayResend: true, countsAsRequest: false,
                            replacing: nil))
                ),
                (
                    .failure(reset),
                    .end(
                        .failedLocally(.upstreamUnreachable, requestComplete: true),
                        record(502, giveUp: .notRetryableCondition, condition: .reset, failure: reset),
                        report: .failed(reset))
                ),
            ]),
        Row(
            name: "a 101 nobody asked for is a bad response, retried as a reset (its transfer cancelled)",
            configuration: configuration(),
            steps: [
                (.start(), start()), (.head(head(101)), .requestRetryPermit(report: report(101))),
                (
                    .permit(true),
                    retry(
                        .reset, disposal: .cancel,
                        failure: .badResponse(detail: "101 Switching Protocols to a request that asked for no upgrade"))
                ),
            ]),
        Row(
            name: "per_try passes: the attempt is cancelled and retried",
            configuration: configuration(),
            steps: [
                (.start(), start()), (.timer(ms: 1_999), .none),
                (.timer(ms: 2_000), .requestRetryPermit(report: .failed(.timeout(detail: "per_try timeout")))),
                (
                    .permit(true, ms: 2_000),
                    retry(.timeout, disposal: .cancel, failure: .timeout(detail: "per_try timeout"))
                ),
            ], deadline: .some(at(2_100))),
        Row(
            name: "what is left of total is shorter than per_try: its end is 504 upstream-timeout",
            configuration: configuration(),
            steps: [
                (.start(ms: 8_500), start()),
                (
                    .timer(ms: 10_000),
                    .end(
                        .failedLocally(.upstreamTimeout, requestComplete: true), record(504),
                        report: .failed(.timeout(detail: "total timeout")))
                ),
            ]),
        // awaitingRefresh
        Row(
            name: "a 401 is held while the token refreshes, replayed once; a second 401 is delivered",
            configuration: configuration(credential: .oauth2(refreshOn: [401])),
            steps: [
                (.start(), .acquireCredential), (.credential(.token(token1)), start(credential: .token(token1))),
                (.head(head(401)), .refreshCredential(rejected: token1, report: report(401))),
                (.responseBody(ok), .none),
                (.refreshed(token2), start(2, credential: .token(token2), replacing: 1)),
                (.head(head(401), generation: 2), deliver(head(401), generation: 2, attempts: 2)),
            ]),
        Row(
            name: "a failed refresh delivers the held response with token-refresh-failed, its events after it",
            configuration: configuration(credential: .oauth2(refreshOn: [401])),
            steps: [
                (.start(), .acquireCredential), (.credential(.token(token1)), start(credential: .token(token1))),
                (.head(head(401)), .refreshCredential(rejected: token1, report: report(401))),
                (.responseBody(ok), .none), (.end(), .none),
                (
                    .refreshed(nil),
                    deliver(head(401), error: .tokenRefreshFailed, reported: false, replay: [.body(ok), .end])
                ),
                (
                    .end(),
                    .end(.completed(requestComplete: true), record(401, headError: .tokenRefreshFailed), report: nil)
                ),
            ]),
        Row(
            name: "a refresh outliving total delivers the held response",
            configuration: configuration(credential: .oauth2(refreshOn: [401])),
            steps: [
                (.start(), .acquireCredential), (.credential(.token(token1)), start(credential: .token(token1))),
                (.head(head(401)), .refreshCredential(rejected: token1, report: report(401))),
                (.timer(ms: 10_000), deliver(head(401), error: .tokenRefreshFailed, reported: false)),
                (.refreshed(token2), .none),
            ]),
        // relaying
        Row(
            name: "the upstream breaking mid-response aborts it",
            configuration: configuration(),
            steps: [
                (.start(), start()), (.head(head(200)), deliver(head(200))),
                (
                    .failure(reset),
                    .end(.aborted(.upstreamBrokeMidResponse), record(200, failure: reset), report: nil)
                ),
            ]),
        Row(
            name: "a response body idle for timeouts.idle is aborted; the client taking bytes is progress",
            configuration: configuration(),
            steps: [
                (.start(), start()), (.head(head(200)), deliver(head(200))), (.writable(ms: 4_000), .none),
                (.timer(ms: 5_000), .none),
                (.timer(ms: 9_000), .end(.aborted(.responseBodyIdle), record(200), report: nil)),
            ]),
        Row(
            name: "the framing counter finding the body longer or shorter than announced aborts it",
            configuration: configuration(),
            steps: [
                (.start(), start()), (.framingBroken(.bodyLongerThanAnnounced), .none),
                (.head(head(200)), deliver(head(200))),
                (
                    .framingBroken(.bodyLongerThanAnnounced),
                    .end(.aborted(.bodyLongerThanAnnounced), record(200), report: nil)
                ),
            ]),
        Row(
            name: "a client stalling its body after the head: the response is cut",
            configuration: configuration(method: "PUT", hasBody: true, declaredLength: 5000),
            steps: [
                (.start(), .beginStreaming), (.streamingBegan, start()),
                (.head(head(200)), deliver(head(200))),
                (.stalled, .end(.aborted(.requestBodyStalled), record(200, complete: false), report: nil)),
            ]),
        Row(
            name: "a client stalling its body before a head: 408",
            configuration: configuration(method: "PUT", hasBody: true),
            steps: [
                (.start(), .none),
                (
                    .stalled,
                    .end(
                        .failedLocally(.requestTimeout, requestComplete: false),
                        record(408, attempts: 0, complete: false), report: nil)
                ),
                (.stalled, .none),
            ]),
        Row(
            name: "a streamed body growing past max_request_body while relaying: the response is cut",
            configuration: configuration(method: "PUT", hasBody: true, declaredLength: 5000, maxRequestBody: 6000),
            steps: [
                (.start(), .beginStreaming), (.streamingBegan, start()),
                (.head(head(200)), deliver(head(200))),
                (.body(6001), .end(.aborted(.requestBodyTooLarge), record(200, complete: false), report: nil)),
            ]),
        Row(
            name: "the client going away ends every state; later events are stale",
            configuration: configuration(),
            steps: [
                (.start(), start()), (.head(head(503)), .requestRetryPermit(report: report(503))),
                (.permit(true), retry(.status(503), disposal: .abandon(within: .seconds(5)))),
                (.gone, .end(.clientClosed, record(499, retries: [.status(503)]), report: nil)),
                (.gone, .none), (.timer(ms: 100), .none), (.head(head(200), generation: 2), .none),
            ], deadline: .some(nil)),
    ]

    @Test(arguments: rows) func transition(_ row: Row) {
        var machine = Machine(configuration: row.configuration, now: Self.t0)
        var random = ScriptedRandom(ScriptedRandom.half)
        for (index, (event, expected)) in row.steps.enumerated() {
            let action = Self.feed(event, to: &machine, random: &random)
            #expect(action == expected, "step \(index + 1)")
        }
        if case .some(let deadline) = row.deadline { #expect(machine.nextDeadline == deadline) }
    }

    static func feed(_ event: Event, to m: inout Machine, random: inout ScriptedRandom) -> Action {
        switch event {
        case .start(let ms): m.start(now: at(ms))
        case .body(let count, let ms): m.bodyReceived(count: count, now: at(ms))
        case .bufferDenied: m.bufferDenied(now: t0)
        case .streamingBegan: m.streamingBegan(now: t0)
        case .spooledStreamingBegan: m.streamingBegan(now: t0, spooled: true)
        case .spoolFailed: m.spoolFailed(now: t0)
        case .bodyEnded(let ms): m.bodyEnded(now: at(ms))
        case .credential(let credential, let ms): m.credentialAcquired(credential, now: at(ms))
        case .head(let head, let generation, let ms):
            m.responseHead(head, generation: generation, now: at(ms), wall: 0, random: &random)
        case .responseBody(let buffer, let generation, let ms):
            m.responseBody(buffer, generation: generation, now: at(ms))
        case .end(let generation): m.responseEnded(generation: generation)
        case .failure(let failure, let generation, let ms):
            m.transportFailed(failure, generation: generation, now: at(ms), wall: 0, random: &random)
        case .permit(let granted, let ms): m.retryPermit(granted: granted, now: at(ms))
        case .noEndpoint(let ms): m.retryPermit(granted: false, endpointOpen: false, now: at(ms))
        case .refreshed(let token, let ms): m.refreshFinished(token, now: at(ms))
        case .timer(let ms): m.timerFired(now: at(ms), wall: 0, random: &random)
        case .writable(let ms): m.clientTookBytesAction(now: at(ms))
        case .framingBroken(let cause): m.framingBroken(cause)
        case .stalled: m.clientStalled()
        case .gone: m.clientGone()
        case .endpoint(let verdict, let ms): m.endpointChosen(verdict, now: at(ms))
        case .network(let ms): m.networkChanged(now: at(ms))
        }
    }

    /// Generations start where the connection says: an earlier request's attempt is stale in this one.
    @Test func generationsContinueAcrossTheConnection() {
        var m = Machine(configuration: Self.configuration(), now: Self.t0, firstGeneration: 5)
        var random = ScriptedRandom(ScriptedRandom.half)
        #expect(m.start(now: Self.t0) == Self.start(5, attempt: 1))
        #expect(m.responseHead(Self.head(200), generation: 4, now: Self.t0, wall: 0, random: &random) == .none)
        #expect(m.nextGeneration == 6)
    }

    /// Every abort cause has a distinct access-line note.
    @Test func abortNotesAreDistinct() {
        let notes = Machine.AbortCause.allCases.map { Machine.Ending.aborted($0).note }
        #expect(Set(notes).count == notes.count)
        #expect(Machine.Ending.clientClosed.note == "client-closed")
        #expect(Machine.Ending.completed(requestComplete: true).note == nil)
    }
}

extension ExchangeStateMachine {
    /// `clientTookBytes` as a table step: it returns nothing.
    fileprivate mutating func clientTookBytesAction(now: Duration) -> Action {
        clientTookBytes(now: now)
        return .none
    }
}

extension ExchangeStateMachine.Action {
    /// `.end` as the rows write it: the attempts that end with the exchange by field (none: nil).
    static func end(
        _ ending: ExchangeStateMachine.Ending, _ record: ExchangeStateMachine.Record,
        report: ExchangeStateMachine.AttemptReport?, endpoint: EndpointReport? = nil,
        letGo: [ExchangeStateMachine.LetGo] = []
    ) -> Self {
        .end(ending, record, .with(report: report, endpoint: endpoint, letGo: letGo))
    }
}
