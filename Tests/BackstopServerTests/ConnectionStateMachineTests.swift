import BackstopCore
import BackstopTransport
import NIOCore
import NIOHTTP1
import Testing

@testable import BackstopServer

/// Every transition of `ConnectionStateMachine` as a table comparing whole action lists, and every short sequence of
/// events keeping its invariants (no crash on stale or late events). The executor's side of the contract —
/// answering `.admit`, `.beginStreaming` and `.requestRetryPermit` at once — is played by `Driver`.
@Suite("Connection state machine")
struct ConnectionStateMachineTests {
    typealias Machine = ConnectionStateMachine
    typealias Action = Machine.Action
    static let t0 = Duration.seconds(50)
    static let idle = Duration.seconds(60)
    static func at(_ milliseconds: Int) -> Duration { t0 + .milliseconds(milliseconds) }

    static func request(
        _ method: HTTPMethod = .GET, _ uri: String = "/a", version: HTTPVersion = .http1_1, close: Bool = false,
        contentLength: Int? = nil
    ) -> ClientRequestHead {
        var headers = HeaderFields()
        if close { headers.append(name: "connection", value: "close") }
        if let contentLength { headers.append(name: "content-length", value: String(contentLength)) }
        return ClientRequestHead(version: version, method: method, uri: uri, headers: headers)
    }

    static let get = request()
    static let ok = ByteBuffer(string: "ok")
    static func configuration(
        method: String = "GET", hasBody: Bool = false, declaredLength: Int? = nil, perTry: Duration = .seconds(20),
        total: Duration = .seconds(100)
    ) -> ExchangeStateMachine.Configuration {
        ExchangeStateMachineTests.configuration(
            method: method, hasBody: hasBody, declaredLength: declaredLength,
            timeouts: Timeouts(connect: .seconds(1), perTry: perTry, total: total, idle: .seconds(5)))
    }
    static let forward = Machine.Admission.forward(configuration(), expectsContinue: false)
    static func upstream(_ status: Int, contentLength: Int? = 2) -> UpstreamResponseHead {
        UpstreamResponseHead(status: status, contentLength: contentLength)
    }

    static func start(_ generation: Int = 1, attempt: Int? = nil, mayResend: Bool = true) -> Action {
        let attempt = attempt ?? generation
        return .startAttempt(
            ExchangeStateMachine.Start(
                generation: generation, attempt: attempt, credential: .none, mayResend: mayResend,
                countsAsRequest: attempt == 1, replacing: nil))
    }

    static func headWrite(
        _ framing: ResponseFraming, http10: Bool = false, connection: ResponseHeadWriter.ConnectionField = .none,
        attempts: Int = 1, error: ProxyErrorReason? = nil,
        report: ExchangeStateMachine.AttemptReport? = .response(status: 200, version: "1.1")
    ) -> Machine.HeadWrite {
        Machine.HeadWrite(
            framing: framing, clientIsHTTP10: http10, connection: connection, attempts: attempts, error: error,
            report: report)
    }

    static func errorWrite(
        close: Bool, http10: Bool = false, omitBody: Bool = false, attempts: Int? = nil, message: String? = nil,
        retryAfter: Int? = nil
    ) -> Machine.ErrorWrite {
        Machine.ErrorWrite(
            clientIsHTTP10: http10, connection: close ? .close : (http10 ? .keepAlive : .none), omitBody: omitBody,
            attempts: attempts, message: message, retryAfter: retryAfter, close: close)
    }

    static func finished(
        _ ending: ExchangeStateMachine.Ending, _ record: ExchangeStateMachine.Record, bytes: Int = 0
    ) -> Action {
        .requestFinished(Machine.Finished(ending: ending, record: record, bytes: bytes))
    }

    /// A response that completed, its exchange recorded with its end.
    static func completed(
        lastChunk: ResponseRelay.LastChunk? = nil, close: Bool = false, bytes: Int = 0,
        record: ExchangeStateMachine.Record = record200
    ) -> Action {
        .endResponse(
            lastChunk: lastChunk, close: close,
            Machine.Finished(ending: .completed(requestComplete: true), record: record, bytes: bytes))
    }

    static let record200 = ExchangeStateMachineTests.record(200)

    // MARK: the table

    /// One event fed to the machine.
    enum Event {
        case part(ClientRequestPart, ms: Int = 0)
        case admitted(Machine.Admission, ms: Int = 0)
        case streamingBegan
        case bufferDenied(ByteBuffer)
        case hold
        case readRequested
        case release(ms: Int = 0)
        case transport(TransportEvent, generation: Int = 1, ms: Int = 0)
        case batchEnded(generation: Int = 1)
        /// The client socket turned unwritable (false) or writable again (true).
        case writable(Bool, ms: Int = 0)
        case permit(Bool)
        case refreshed(ManagedToken?)
        case timer(ms: Int)
        /// The timer fires while part of the next head has arrived (`HeadTimeoutHandler.isReceivingHead`).
        case timerWithHeadArriving(ms: Int)
        case headTimedOut
        case parseFailed(ProxyErrorReason)
        /// The input ended inside a request (`invalidEOFState`).
        case inputEnded
        case closed
        case failed
        case answer(ProxyErrorReason, message: String?)
        case intakeEnded(Machine.IntakeOutcome)
    }

    /// `@unchecked Sendable`, safe because: `Event` and `Action` carry machine values that are not declared
    /// `Sendable` (the product never moves them across threads), but every row is a `let` built once in the static
    /// `rows` array and only read, by the one test invocation that receives it; nothing mutates it after creation.
    struct Row: CustomTestStringConvertible, @unchecked Sendable {
        let name: String
        let steps: [(Event, [Action])]
        /// The state after the last step, when the row says.
        var state: Machine.State? = nil
        var deadline: Duration?? = .none
        var readsHeld: Bool? = nil
        var testDescription: String { name }
    }

    static let post = request(.POST, "/q", contentLength: 4)
    static let hedgedConfiguration: ExchangeStateMachine.Configuration = {
        var hedged = configuration()
        hedged.hedge = ExchangeStateMachine.HedgePlan(after: .milliseconds(50), max: 1)
        return hedged
    }()
    static func hedgeCopy(_ generation: Int) -> Action {
        .startAttempt(
            ExchangeStateMachine.Start(
                generation: generation, attempt: generation, credential: .none, mayResend: true,
                countsAsRequest: false, replacing: nil, hedge: true))
    }
    static func queue(maxBody: Int = 10) -> Machine.Admission { .queue(maxBody: maxBody, expectsContinue: false) }

    static let rows: [Row] = [
        Row(
            name: "a queued request is read whole, stored, then answered 202; the connection is idle again",
            steps: [
                (.part(.head(post)), [.admit(post)]),
                (.admitted(queue()), []),
                (.part(.body(ok)), [.keepQueuedBody(ok)]),
                (.part(.body(ok)), [.keepQueuedBody(ok)]),
                (.part(.end(nil)), [.storeQueued]),
                (.timer(ms: 200_000), []),
                (
                    .intakeEnded(.stored(delivery: "d1")),
                    [.writeAccepted(delivery: "d1", errorWrite(close: false)), .awaitNextHead]
                ),
            ],
            state: .idle(deadline: t0 + idle)),
        Row(
            name: "a queued request answered 202 with Connection: close closes",
            steps: [
                (.part(.head(request(.POST, "/q", close: true))), [.admit(request(.POST, "/q", close: true))]),
                (.admitted(.queue(maxBody: 10, expectsContinue: true)), [.writeContinue(clientIsHTTP10: false)]),
                (.part(.end(nil)), [.storeQueued]),
                (.intakeEnded(.stored(delivery: "d2")), [.writeAccepted(delivery: "d2", errorWrite(close: true))]),
            ],
            state: .closing),
        Row(
            name: "a queued body over max_request_body is refused with 413 and the rest is not read",
            steps: [
                (.part(.head(post)), [.admit(post)]),
                (.admitted(queue(maxBody: 3)), []),
                (.part(.body(ok)), [.keepQueuedBody(ok)]),
                (.part(.body(ok)), [.discardQueued, .writeError(.bodyTooLarge, errorWrite(close: true))]),
                (.part(.end(nil)), []),
                (.intakeEnded(.stored(delivery: "late")), []),
            ],
            state: .closing),
        Row(
            name: "a store refused (spool full) is answered 507; the connection stays",
            steps: [
                (.part(.head(post)), [.admit(post)]),
                (.admitted(queue()), []),
                (.part(.end(nil)), [.storeQueued]),
                (
                    .intakeEnded(.refused(.spoolFull)),
                    [.discardQueued, .writeError(.spoolFull, errorWrite(close: false)), .awaitNextHead]
                ),
            ],
            state: .idle(deadline: t0 + idle)),
        Row(
            name: "buffer memory spent while the body is read: 507, the rest is not read, the connection closes",
            steps: [
                (.part(.head(post)), [.admit(post)]),
                (.admitted(queue()), []),
                (.part(.body(ok)), [.keepQueuedBody(ok)]),
                (
                    .intakeEnded(.refused(.spoolFull)),
                    [.discardQueued, .writeError(.spoolFull, errorWrite(close: true))]
                ),
            ],
            state: .closing),
        Row(
            name: "a queued body that stalls: what was kept is let go, 408 and close (the intake's answer records it)",
            steps: [
                (.part(.head(post)), [.admit(post)]),
                (.admitted(queue()), []),
                (.part(.body(ok)), [.keepQueuedBody(ok)]),
                (.timer(ms: 60_000), [.discardQueued, .writeError(.requestTimeout, errorWrite(close: true))]),
            ],
            state: .closing),
        Row(
            name: "the client gone while its body is read: nothing is stored, the intake ends",
            steps: [
                (.part(.head(post)), [.admit(post)]),
                (.admitted(queue()), []),
                (.part(.body(ok)), [.keepQueuedBody(ok)]),
                (.closed, [.queuedUnanswered(delivery: nil)]),
            ],
            state: .closing),
        Row(
            name: "the input ends inside a queued body: the client left (499), not a bad request; nothing is stored",
            steps: [
                (.part(.head(post)), [.admit(post)]),
                (.admitted(queue()), []),
                (.part(.body(ok)), [.keepQueuedBody(ok)]),
                (.inputEnded, [.queuedUnanswered(delivery: nil), .closeConnection]),
                (.closed, []),
            ],
            state: .closing),
        Row(
            name: "the input ends inside a head: a request that cannot be read, 400",
            steps: [
                (
                    .inputEnded,
                    [
                        .logLocalAnswer(.badRequest, detail: nil, elapsed: .zero),
                        .writeError(.badRequest, errorWrite(close: true)),
                    ]
                )
            ],
            state: .closing),
        Row(
            name: "the client gone while its request is stored: the store goes on, nobody is answered, the intake ends",
            steps: [
                (.part(.head(post)), [.admit(post)]),
                (.admitted(queue()), []),
                (.part(.end(nil)), [.storeQueued]),
                (.closed, []),
                (.intakeEnded(.stored(delivery: "d3")), [.queuedUnanswered(delivery: "d3")]),
            ],
            state: .closing),
        Row(
            name: "the client gone while its request is stored, and the store refused: the intake ends unstored",
            steps: [
                (.part(.head(post)), [.admit(post)]),
                (.admitted(queue()), []),
                (.part(.end(nil)), [.storeQueued]),
                (.closed, []),
                (.intakeEnded(.refused(.spoolFull)), [.queuedUnanswered(delivery: nil)]),
            ],
            state: .closing),
        Row(
            name:
                "a connection whose next head stalled past the idle deadline holds a stalled request: 408, logged, closed (not silently)",
            steps: [
                (.timerWithHeadArriving(ms: 59_999), []),
                (
                    .timerWithHeadArriving(ms: 60_000),
                    [
                        .logLocalAnswer(.requestTimeout, detail: nil),
                        .writeError(.requestTimeout, errorWrite(close: true)),
                    ]
                ),
            ],
            state: .closing),
        Row(
            name: "an idle connection closes at its deadline; nothing reopens it",
            steps: [(.timer(ms: 59_999), []), (.timer(ms: 60_000), [.closeConnection]), (.part(.head(get)), [])],
            state: .closing),
        Row(
            name: "a request forwarded head to end: the response is framed and relayed, the connection idle again",
            steps: [
                (.part(.head(get)), [.admit(get)]),
                (.admitted(forward), [start()]),
                (.part(.end(nil)), []),
                (
                    .transport(.head(upstream(200))),
                    [.writeHead(upstream(200), headWrite(.contentLength(2)))]
                ),
                (.transport(.body(ok)), [.writeBody(ok, chunk: nil)]),
                (.batchEnded(), [.flushBody(generation: 1)]),
                (
                    .transport(.end, ms: 10),
                    [
                        completed(bytes: 2), .awaitNextHead,
                    ]
                ),
            ],
            state: .idle(deadline: at(10) + idle)),
        Row(
            name: "a pipelined request waits while the client has not taken the response before it; then it starts",
            steps: [
                (.part(.head(get)), [.admit(get)]),
                (.admitted(forward), [start()]),
                (.part(.end(nil)), []),
                (.part(.head(request(.GET, "/b"))), []),
                (.part(.end(nil)), []),
                (
                    .transport(.head(upstream(200))),
                    [.writeHead(upstream(200), headWrite(.contentLength(2)))]
                ),
                (.transport(.body(ok)), [.writeBody(ok, chunk: nil)]),
                (.writable(false), []),
                (.batchEnded(), [.flushBody(generation: 1)]),
                (.transport(.end, ms: 10), [completed(bytes: 2), .awaitNextHead]),
                // Another request arriving meanwhile waits too.
                (.part(.head(request(.GET, "/c")), ms: 20), []),
                (.writable(true, ms: 30), [.admit(request(.GET, "/b"))]),
            ],
            readsHeld: false),
        Row(
            name: "an idle connection whose client is backlogged queues a new head; writable again, it is admitted",
            steps: [
                (.writable(false), []),
                (.part(.head(get)), []),
                (.part(.end(nil)), []),
                (.writable(true), [.admit(get)]),
                (.writable(false), []),
                (.writable(true), []),
            ]),
        Row(
            name: "an unframed response to HTTP/1.1 is chunked",
            steps: [
                (.part(.head(get)), [.admit(get)]), (.admitted(forward), [start()]), (.part(.end(nil)), []),
                (
                    .transport(.head(upstream(200, contentLength: nil))),
                    [.writeHead(upstream(200, contentLength: nil), headWrite(.chunked))]
                ),
                (.transport(.body(ok)), [.writeBody(ok, chunk: ResponseRelay.Chunk(first: true))]),
                (.transport(.body(ok)), [.writeBody(ok, chunk: ResponseRelay.Chunk(first: false))]),
                (
                    .transport(.end),
                    [
                        completed(lastChunk: ResponseRelay.LastChunk(afterChunks: true), bytes: 4),
                        .awaitNextHead,
                    ]
                ),
            ]),
        Row(
            name: "an unframed response to HTTP/1.0 ends by closing",
            steps: [
                (.part(.head(request(version: .http1_0))), [.admit(request(version: .http1_0))]),
                (.admitted(forward), [start()]), (.part(.end(nil)), []),
                (
                    .transport(.head(upstream(200, contentLength: nil))),
                    [
                        .writeHead(
                            upstream(200, contentLength: nil),
                            headWrite(.closeDelimited, http10: true, connection: .close))
                    ]
                ),
                (
                    .transport(.end),
                    [
                        completed(close: true)
                    ]
                ),
            ],
            state: .closing),
        Row(
            name: "a body longer than its Content-Length: exactly the announced bytes, then the connection is cut",
            steps: [
                (.part(.head(get)), [.admit(get)]), (.admitted(forward), [start()]), (.part(.end(nil)), []),
                (
                    .transport(.head(upstream(200))),
                    [.writeHead(upstream(200), headWrite(.contentLength(2)))]
                ),
                (
                    .transport(.body(ByteBuffer(string: "okk"))),
                    [
                        .writeBody(ok, chunk: nil),
                        finished(.aborted(.bodyLongerThanAnnounced), record200, bytes: 2), .abortResponse,
                    ]
                ),
                (.transport(.end), []),
            ],
            state: .closing),
        Row(
            name: "a body shorter than its Content-Length is cut at its end",
            steps: [
                (.part(.head(get)), [.admit(get)]), (.admitted(forward), [start()]), (.part(.end(nil)), []),
                (
                    .transport(.head(upstream(200, contentLength: 5))),
                    [.writeHead(upstream(200, contentLength: 5), headWrite(.contentLength(5)))]
                ),
                (.transport(.body(ok)), [.writeBody(ok, chunk: nil)]),
                (
                    .transport(.end),
                    [finished(.aborted(.bodyShorterThanAnnounced), record200, bytes: 2), .abortResponse]
                ),
            ],
            state: .closing),
        Row(
            name: "a HEAD's response is bodyless whatever its length",
            steps: [
                (.part(.head(request(.HEAD))), [.admit(request(.HEAD))]), (.admitted(forward), [start()]),
                (.transport(.head(upstream(200))), [.writeHead(upstream(200), headWrite(.bodyless))]),
                (.transport(.body(ok)), []),
            ]),
        Row(
            name: "a refused head is answered, its end read, and the next queued request admitted",
            steps: [
                (.part(.head(get)), [.admit(get)]),
                (.part(.end(nil)), []),
                (.part(.head(request(.GET, "/b"))), []),
                (
                    .admitted(.reject(.noRoute, close: false)),
                    [.writeError(.noRoute, errorWrite(close: false)), .awaitNextHead, .admit(request(.GET, "/b"))]
                ),
            ]),
        Row(
            name: "a refusal that closes ends the connection; later parts are dropped",
            steps: [
                (.part(.head(request(.POST, contentLength: 5))), [.admit(request(.POST, contentLength: 5))]),
                (.admitted(.reject(.clientDenied, close: true)), [.writeError(.clientDenied, errorWrite(close: true))]),
                (.part(.body(ok)), []), (.part(.end(nil)), []),
            ],
            state: .closing),
        Row(
            name: "a circuit-open refusal carries its Retry-After; the connection stays usable",
            steps: [
                (.part(.head(get)), [.admit(get)]),
                (.part(.end(nil)), []),
                (
                    .admitted(.reject(.circuitOpen, close: false, retryAfter: 7)),
                    [.writeError(.circuitOpen, errorWrite(close: false, retryAfter: 7)), .awaitNextHead]
                ),
            ]),
        Row(
            name: "a client asking to close is answered with Connection: close",
            steps: [
                (.part(.head(request(close: true))), [.admit(request(close: true))]),
                (.admitted(.reject(.noRoute, close: false)), [.writeError(.noRoute, errorWrite(close: true))]),
            ],
            state: .closing),
        Row(
            name: "an exchange failing locally answers with its attempts; the connection stays usable",
            steps: [
                (.part(.head(get)), [.admit(get)]), (.admitted(forward), [start()]), (.part(.end(nil)), []),
                (
                    .transport(.failure(.loopDetected(detail: "x"))),
                    [
                        .attemptEnded(.failed(.loopDetected(detail: "x"))),
                        finished(
                            .failedLocally(.loopDetected, requestComplete: true),
                            ExchangeStateMachineTests.record(508, failure: .loopDetected(detail: "x"))),
                        .writeError(.loopDetected, errorWrite(close: false, attempts: 1)), .awaitNextHead,
                    ]
                ),
            ]),
        Row(
            name: "100-continue is written before the exchange starts; a kept body starts it at its end",
            steps: [
                (.part(.head(request(.PUT, contentLength: 2))), [.admit(request(.PUT, contentLength: 2))]),
                (
                    .admitted(
                        .forward(
                            configuration(method: "PUT", hasBody: true, declaredLength: 2), expectsContinue: true)),
                    [.writeContinue(clientIsHTTP10: false)]
                ),
                (.part(.body(ok)), [.storeBody(ok)]),
                (.bufferDenied(ok), [.beginStreaming(then: ok)]),
                (.streamingBegan, [start()]),
                (.part(.end(nil)), [.finishBodyStream]),
            ]),
        Row(
            name: "a body that stops arriving: 408, the stream failed, the connection closed",
            steps: [
                (.part(.head(request(.PUT, contentLength: 2))), [.admit(request(.PUT, contentLength: 2))]),
                (
                    .admitted(
                        .forward(configuration(method: "PUT", hasBody: true, declaredLength: 2), expectsContinue: false)
                    ), []
                ),
                (.part(.body(ByteBuffer(string: "o")), ms: 30_000), [.storeBody(ByteBuffer(string: "o"))]),
                (.timer(ms: 89_999), []),
                (
                    .timer(ms: 90_000),
                    [
                        .failBodyStream,
                        finished(
                            .failedLocally(.requestTimeout, requestComplete: false),
                            ExchangeStateMachineTests.record(408, attempts: 0, complete: false)),
                        .writeError(.requestTimeout, errorWrite(close: true)),
                    ]
                ),
            ],
            state: .closing),
        Row(
            name: "an upload hold stops reads and the stall clock; its release resumes a held read",
            steps: [
                (.part(.head(request(.PUT, contentLength: 5000))), [.admit(request(.PUT, contentLength: 5000))]),
                (
                    .admitted(
                        .forward(
                            configuration(
                                method: "PUT", hasBody: true, declaredLength: 5000, perTry: .seconds(1000),
                                total: .seconds(1000)), expectsContinue: false)),
                    [.beginStreaming(then: nil)]
                ),
                (.streamingBegan, [start()]),
                (.hold, []), (.readRequested, []), (.timer(ms: 600_000), []),
                (.release(ms: 600_000), [.read]),
            ],
            deadline: .some(at(600_000) + idle), readsHeld: false),
        Row(
            name: "a 503 asks the budget; the retry abandons the small response, then the next attempt starts",
            steps: [
                (.part(.head(get)), [.admit(get)]), (.admitted(forward), [start()]), (.part(.end(nil)), []),
                (
                    .transport(.head(upstream(503))),
                    [.attemptEnded(.response(status: 503, version: "1.1")), .requestRetryPermit]
                ),
                (
                    .permit(true),
                    [
                        .abandonAttempt(generation: 1, within: .seconds(5)),
                        .retryScheduled(
                            ExchangeStateMachine.Retry(
                                attempt: 1, after: .milliseconds(100), reason: .status(503), generation: 1,
                                disposal: .abandon(within: .seconds(5)), failure: nil)),
                    ]
                ),
                (.timer(ms: 100), [start(2)]),
                (.transport(.head(upstream(200)), generation: 1), []),
            ]),
        Row(
            name:
                "a hedge race: the copy asks the budget; the first's head wins, the copy is recorded as cancelled and cancelled",
            steps: [
                (.part(.head(get)), [.admit(get)]),
                (.admitted(.forward(hedgedConfiguration, expectsContinue: false)), [start()]),
                (.part(.end(nil)), []),
                (.timer(ms: 50), [.requestRetryPermit]),
                (.permit(true), [hedgeCopy(2)]),
                (
                    .transport(.failure(.reset(detail: "r")), generation: 2),
                    [.attemptLeft(generation: 2, .failed(.reset(detail: "r")))]
                ),
                (.timer(ms: 100), [.requestRetryPermit]),
                (.permit(true), [hedgeCopy(3)]),
                (
                    .transport(.head(upstream(200))),
                    [
                        .attemptLeft(generation: 3, .failed(.cancelled)), .cancelAttempt(generation: 3),
                        .writeHead(upstream(200), headWrite(.contentLength(2), attempts: 3)),
                    ]
                ),
                (.transport(.body(ok), generation: 3), []),
            ]),
        Row(
            name: "an upstream with credentials: the exchange asks for one first",
            steps: [
                (.part(.head(get)), [.admit(get)]),
                (
                    .admitted(
                        .forward(
                            ExchangeStateMachineTests.configuration(credential: .oauth2(refreshOn: [401])),
                            expectsContinue: false)), [.acquireCredential]
                ),
            ]),
        Row(
            name: "an earlier request's attempt is stale in the next request",
            steps: [
                (.part(.head(get)), [.admit(get)]), (.admitted(forward), [start()]), (.part(.end(nil)), []),
                (
                    .transport(.head(upstream(200))),
                    [.writeHead(upstream(200), headWrite(.contentLength(2)))]
                ),
                (.transport(.body(ok)), [.writeBody(ok, chunk: nil)]),
                (
                    .transport(.end),
                    [
                        completed(bytes: 2), .awaitNextHead,
                    ]
                ),
                (.part(.head(get)), [.admit(get)]), (.admitted(forward), [start(2, attempt: 1)]),
                (.transport(.head(upstream(200)), generation: 1), []),
                (.batchEnded(generation: 1), []),
            ]),
        Row(
            name:
                "an accepted CONNECT holds reads, drops parts, has no deadline; a failed setup is answered and closes",
            steps: [
                (
                    .part(.head(request(.CONNECT, "a.test:443"))),
                    [.admit(request(.CONNECT, "a.test:443"))]
                ),
                (.admitted(.upgrade), []), (.part(.end(nil)), []), (.timer(ms: 600_000), []),
                (
                    .answer(.tunnelUnreachable, message: "no"),
                    [.writeError(.tunnelUnreachable, errorWrite(close: true, message: "no"))]
                ),
            ],
            state: .closing),
        Row(
            name: "a head not complete in time between requests: 408 with what is unknown, and close",
            steps: [
                (
                    .headTimedOut,
                    [
                        .logLocalAnswer(
                            .requestTimeout, detail: "request head not complete within limits.header_timeout",
                            elapsed: .seconds(10)),
                        .writeError(.requestTimeout, errorWrite(close: true)),
                    ]
                ),
                (.headTimedOut, []), (.parseFailed(.badRequest), []),
            ],
            state: .closing),
        Row(
            name: "a head timing out while a response is written is left alone; so is a parse error after its end",
            steps: [
                (.part(.head(get)), [.admit(get)]), (.admitted(forward), [start()]), (.part(.end(nil)), []),
                (
                    .transport(.head(upstream(200))),
                    [.writeHead(upstream(200), headWrite(.contentLength(2)))]
                ),
                (.headTimedOut, []),
                // Bytes after the complete request that are no request: refused once its response is whole.
                (.parseFailed(.badRequest), []),
                (.transport(.body(ok)), [.writeBody(ok, chunk: nil)]),
                (
                    .transport(.end, ms: 10),
                    [
                        completed(bytes: 2), .logLocalAnswer(.badRequest, detail: nil),
                        .writeError(.badRequest, errorWrite(close: true)),
                    ]
                ),
            ],
            state: .closing),
        Row(
            name:
                "a parse error before the request's end is its own: its exchange ends (bad-request, not a client that left), the response is cut",
            steps: [
                (.part(.head(get)), [.admit(get)]), (.admitted(forward), [start()]),
                (
                    .transport(.head(upstream(200))),
                    [.writeHead(upstream(200), headWrite(.contentLength(2)))]
                ),
                (
                    .parseFailed(.badRequest),
                    [
                        .failBodyStream,
                        finished(.aborted(.requestUnreadable), ExchangeStateMachineTests.record(200, complete: false)),
                        .abortResponse,
                    ]
                ),
            ],
            state: .closing),
        Row(
            name:
                "a parse error before a response: the request's own answer (its exchange ends with the reason, once), close",
            steps: [
                (.part(.head(get)), [.admit(get)]), (.admitted(forward), [start()]),
                (
                    .parseFailed(.headersTooLarge),
                    [
                        .failBodyStream,
                        finished(
                            .failedLocally(.headersTooLarge, requestComplete: false),
                            ExchangeStateMachineTests.unanswered(ExchangeStateMachineTests.record(431, complete: false))
                        ),
                        .writeError(.headersTooLarge, errorWrite(close: true, attempts: 1)),
                    ]
                ),
            ],
            state: .closing),
        Row(
            name: "the client going away ends the exchange (client-closed) and the connection",
            steps: [
                (.part(.head(get)), [.admit(get)]), (.admitted(forward), [start()]),
                (
                    .closed,
                    [
                        finished(
                            .clientClosed, ExchangeStateMachineTests.unanswered(ExchangeStateMachineTests.record(499)))
                    ]
                ),
                (.transport(.head(upstream(200))), []), (.timer(ms: 100_000), []), (.closed, []), (.failed, []),
            ],
            state: .closing, deadline: .some(nil)),
        Row(
            name: "a broken connection closes once",
            steps: [(.failed, [.closeConnection]), (.failed, [])],
            state: .closing),
    ]

    @Test(arguments: rows) func transition(_ row: Row) {
        var machine = Machine(idleTimeout: Self.idle, now: Self.t0)
        for (index, (event, expected)) in row.steps.enumerated() {
            var actions: [Action] = []
            Self.feed(event, to: &machine, into: &actions)
            #expect(actions == expected, "step \(index + 1)")
        }
        if let state = row.state { #expect(machine.state == state) }
        if case .some(let deadline) = row.deadline { #expect(machine.nextDeadline == deadline) }
        if let readsHeld = row.readsHeld { #expect(machine.readsHeld == readsHeld) }
    }

    static func feed(_ event: Event, to m: inout Machine, into actions: inout [Action]) {
        var random = ScriptedRandom(ScriptedRandom.half)
        switch event {
        case .part(let part, let ms): m.partArrived(part, now: at(ms), into: &actions)
        case .admitted(let admission, let ms): m.headAdmitted(admission, now: at(ms), into: &actions)
        case .streamingBegan: m.streamingBegan(now: t0, into: &actions)
        case .bufferDenied(let part): m.bufferDenied(part, now: t0, into: &actions)
        case .hold: m.holdUploads()
        case .readRequested: _ = m.readRequested()
        case .release(let ms): m.releaseUploads(now: at(ms), into: &actions)
        case .transport(let event, let generation, let ms):
            m.transportEvent(event, generation: generation, now: at(ms), wall: 0, random: &random, into: &actions)
        case .batchEnded(let generation): m.transportBatchEnded(generation: generation, into: &actions)
        case .writable(let writable, let ms): m.clientWritabilityChanged(writable, now: at(ms), into: &actions)
        case .permit(let granted): m.retryPermit(granted: granted, now: t0, into: &actions)
        case .refreshed(let token): m.refreshFinished(token, now: t0, into: &actions)
        case .timer(let ms): m.timerFired(now: at(ms), wall: 0, random: &random, into: &actions)
        case .timerWithHeadArriving(let ms):
            m.timerFired(now: at(ms), wall: 0, random: &random, headArriving: true, into: &actions)
        case .headTimedOut: m.headTimedOut(now: t0, waited: .seconds(10), into: &actions)
        case .parseFailed(let reason): m.parseFailed(reason, now: t0, into: &actions)
        case .inputEnded: m.inputEndedInsideRequest(now: t0, into: &actions)
        case .closed: m.connectionClosed(into: &actions)
        case .failed: m.connectionFailed(into: &actions)
        case .answer(let reason, let message):
            m.answerLocally(reason, close: true, message: message, now: t0, into: &actions)
        case .intakeEnded(let outcome): m.intakeEnded(outcome, now: t0, into: &actions)
        }
    }

    // MARK: queues and holds

    @Test func aLongPipelinedQueueHoldsReadsUntilHalfOfItDrained() {
        var c = Machine(idleTimeout: Self.idle, now: Self.t0)
        var actions: [Action] = []
        c.partArrived(.head(Self.get), now: Self.t0, into: &actions)
        #expect(actions == [.admit(Self.get)])
        // While the head is admitted, its end and 32 pipelined requests (head + end each) wait in the queue.
        c.partArrived(.end(nil), now: Self.t0, into: &actions)
        for _ in 0..<(Machine.maxQueuedParts / 2) {
            c.partArrived(.head(Self.get), now: Self.t0, into: &actions)
            c.partArrived(.end(nil), now: Self.t0, into: &actions)
        }
        #expect(c.queuedParts == Machine.maxQueuedParts + 1)
        #expect(c.readsHeld)
        let readNow = c.readRequested()
        #expect(!readNow, "held: the read is remembered")
        var resumedAfter: Int?
        for answered in 1...40 where resumedAfter == nil {
            actions = []
            c.headAdmitted(.reject(.noRoute, close: false), now: Self.t0, into: &actions)
            if actions.contains(.read) { resumedAfter = answered }
        }
        #expect(resumedAfter == 18, "65 queued parts: below half the limit once 18 requests left")
        #expect(!c.readsHeld)
        let readAfter = c.readRequested()
        #expect(readAfter)
    }

    @Test("pipelined heads are held by their size too: a few large ones hold reads, not only 64 parts")
    func largePipelinedHeadsHoldReads() {
        var c = Machine(idleTimeout: Self.idle, now: Self.t0)
        var actions: [Action] = []
        c.partArrived(.head(Self.get), now: Self.t0, into: &actions)
        c.partArrived(.end(nil), now: Self.t0, into: &actions)
        let padding = String(repeating: "p", count: 40_000)
        var fields = HeaderFields()
        fields.append(name: "Host", value: "a.test")
        fields.append(name: "X-Pad", value: padding)
        let large = ClientRequestHead(version: .http1_1, method: .GET, uri: "/large", headers: fields)
        #expect(Machine.queuedSize(of: .head(large)) > 40_000)
        c.partArrived(.head(large), now: Self.t0, into: &actions)
        c.partArrived(.end(nil), now: Self.t0, into: &actions)
        #expect(!c.readsHeld, "one 40 KB head: under 64 KiB")
        c.partArrived(.head(large), now: Self.t0, into: &actions)
        c.partArrived(.end(nil), now: Self.t0, into: &actions)
        #expect(c.readsHeld, "two: 80 KB of heads: held after 5 parts, not 64")
        #expect(c.queuedParts == 5)
        // Looked at as each request ends: with two large heads queued, then one (40 KB, above half of 64 KiB), still
        // held; once the last has left the queue, below half: the reads resume.
        for _ in 0..<2 {
            actions = []
            c.headAdmitted(.reject(.noRoute, close: false), now: Self.t0, into: &actions)
            #expect(c.readsHeld)
        }
        actions = []
        c.headAdmitted(.reject(.noRoute, close: false), now: Self.t0, into: &actions)
        #expect(!c.readsHeld)
        let readNow = c.readRequested()
        #expect(readNow)
    }

    // MARK: every short sequence

    /// The executor's side of the contract, played at once: `.admit` is answered by the head's path (`/f`
    /// forwarded, `/s` forwarded with a streamed body, `/r` refused, `/q` queued, `CONNECT` upgraded), `.beginStreaming` by
    /// `streamingBegan`, `.requestRetryPermit` by a grant, `.acquireCredential` never asked (no credentials).
    struct Driver {
        var machine = Machine(idleTimeout: .seconds(3), now: .zero)
        var now = Duration.zero
        var generation = 0
        /// A queued request is being stored (`.storeQueued` was asked and not yet answered): only then can the
        /// store report that it stored it, as `ProxyHandler` only reports it after performing `.storeQueued`.
        var storing = false
        var random = ScriptedRandom(ScriptedRandom.half)
        /// Per admitted request: responses written (head or error) and finished records.
        var responses = 0
        var finishes = 0
        /// The decoder's side: between a head and its end (a head never comes before the previous request's end).
        var insideRequest = false
        /// The first broken rule, if any.
        var violation: String?

        /// A GET is hedged after 1 s: a second passing sends a copy, and "stale head" is then the first attempt's
        /// head racing it.
        static func config(_ method: String, streamed: Bool) -> ExchangeStateMachine.Configuration {
            var configuration = ExchangeStateMachineTests.configuration(
                method: method, hasBody: streamed, declaredLength: streamed ? 5000 : nil,
                timeouts: Timeouts(connect: .seconds(1), perTry: .seconds(2), total: .seconds(5), idle: .seconds(2)))
            if !streamed { configuration.hedge = ExchangeStateMachine.HedgePlan(after: .seconds(1), max: 1) }
            return configuration
        }

        mutating func run(_ event: (inout Machine, inout [Action]) -> Void) -> [Action] {
            // Between requests, what is answered next (an unreadable head) is a request of its own.
            if case .idle = machine.state { (responses, finishes) = (0, 0) }
            var actions: [Action] = []
            event(&machine, &actions)
            var index = 0
            while index < actions.count {
                let action = actions[index]
                index += 1
                switch action {
                case .admit(let head):
                    (responses, finishes) = (0, 0)
                    let admission: Machine.Admission
                    switch (head.method, head.uri) {
                    case (.CONNECT, _): admission = .upgrade
                    case (_, "/r"): admission = .reject(.noRoute, close: false)
                    case (_, "/q"): admission = .queue(maxBody: 3, expectsContinue: false)
                    case (_, "/s"): admission = .forward(Self.config("PUT", streamed: true), expectsContinue: false)
                    default: admission = .forward(Self.config("GET", streamed: false), expectsContinue: false)
                    }
                    machine.headAdmitted(admission, now: now, into: &actions)
                case .beginStreaming:
                    machine.streamingBegan(now: now, into: &actions)
                case .requestRetryPermit:
                    machine.retryPermit(granted: true, now: now, into: &actions)
                case .storeQueued:
                    storing = true
                case .startAttempt(let start):
                    if start.generation <= generation { violation = violation ?? "a generation was reused" }
                    generation = start.generation
                case .logLocalAnswer:
                    // What could not be read is answered as a request of its own (after the requests before it).
                    (responses, finishes) = (0, 0)
                case .writeHead, .writeError, .writeAccepted:
                    responses += 1
                    if responses > 1 { violation = violation ?? "two responses to one request" }
                case .requestFinished, .endResponse:
                    finishes += 1
                    if finishes > 1 { violation = violation ?? "two records of one exchange" }
                case .acquireCredential, .refreshCredential:
                    violation = violation ?? "a credential nobody configured"
                default:
                    break
                }
            }
            return actions
        }

        /// An event of the latest attempt's transfer (`stale`: of the one before it).
        mutating func transport(_ event: TransportEvent, stale: Bool = false) -> [Action] {
            let (now, generation) = (self.now, stale ? self.generation - 1 : self.generation)
            var random = self.random
            return run {
                $0.transportEvent(event, generation: generation, now: now, wall: 0, random: &random, into: &$1)
            }
        }

        /// A request part, sent only in an order the decoder can produce.
        mutating func part(_ part: ClientRequestPart) -> [Action] {
            switch part {
            case .head:
                guard !insideRequest else { return [] }
                insideRequest = true
            case .body:
                guard insideRequest else { return [] }
            case .end:
                guard insideRequest else { return [] }
                insideRequest = false
            }
            let now = self.now
            return run { $0.partArrived(part, now: now, into: &$1) }
        }
    }

    /// The events the outside world can send, in any order.
    static let alphabet: [(String, @Sendable (inout Driver) -> [Action])] = [
        ("head /f", { d in d.part(.head(request(.GET, "/f"))) }),
        ("head /s", { d in d.part(.head(request(.PUT, "/s", contentLength: 5000))) }),
        ("head /r", { d in d.part(.head(request(.GET, "/r"))) }),
        ("head /q", { d in d.part(.head(request(.POST, "/q", contentLength: 4))) }),
        (
            "stored",
            { d in
                guard d.storing else { return [] }
                d.storing = false
                return d.run { [now = d.now] in $0.intakeEnded(.stored(delivery: "d"), now: now, into: &$1) }
            }
        ),
        ("refused", { d in d.run { [now = d.now] in $0.intakeEnded(.refused(.spoolFull), now: now, into: &$1) } }),
        ("CONNECT", { d in d.part(.head(request(.CONNECT, "a:443"))) }),
        ("body", { d in d.part(.body(ok)) }),
        ("end", { d in d.part(.end(nil)) }),
        ("upstream head", { d in d.transport(.head(upstream(200))) }),
        ("upstream 503", { d in d.transport(.head(upstream(503))) }),
        ("upstream body", { d in d.transport(.body(ok)) }),
        ("upstream end", { d in d.transport(.end) }),
        ("upstream reset", { d in d.transport(.failure(.reset(detail: "r"))) }),
        ("stale head", { d in d.transport(.head(upstream(200)), stale: true) }),
        (
            "batch end",
            { d in d.run { [generation = d.generation] in $0.transportBatchEnded(generation: generation, into: &$1) } }
        ),
        (
            "1 s passes",
            { d in
                d.now += .seconds(1)
                var random = d.random
                return d.run { [now = d.now] in $0.timerFired(now: now, wall: 0, random: &random, into: &$1) }
            }
        ),
        ("hold", { d in d.run { m, _ in m.holdUploads() } }),
        ("release", { d in d.run { [now = d.now] in $0.releaseUploads(now: now, into: &$1) } }),
        ("writable", { d in d.run { [now = d.now] m, _ in m.clientTookBytes(now: now) } }),
        ("head timeout", { d in d.run { [now = d.now] in $0.headTimedOut(now: now, into: &$1) } }),
        ("parse error", { d in d.run { [now = d.now] in $0.parseFailed(.badRequest, now: now, into: &$1) } }),
        ("closed", { d in d.run { $0.connectionClosed(into: &$1) } }),
        ("late refresh", { d in d.run { [now = d.now] in $0.refreshFinished(nil, now: now, into: &$1) } }),
        ("late permit", { d in d.run { [now = d.now] in $0.retryPermit(granted: false, now: now, into: &$1) } }),
    ]

    /// Every sequence of up to four events keeps the machine's invariants, and none crashes it.
    @Test func everyShortSequenceKeepsTheInvariants() {
        let length = 4
        var sequence = [Int](repeating: 0, count: length)
        var checked = 0
        var failures: [String] = []
        /// The first invariant the machine breaks, if any.
        func brokenInvariant(_ m: Machine) -> String? {
            switch m.state {
            case .closing:
                if m.queuedParts != 0 || m.nextDeadline != nil {
                    return "a closing connection keeps parts or a deadline"
                }
            case .upgrading:
                if m.queuedParts != 0 || !m.readsHeld || m.nextDeadline != nil { return "an upgrade reads or waits" }
            case .idle(let deadline):
                if m.nextDeadline != deadline { return "an idle connection without its idle deadline" }
            case .active(let active):
                if active.request == .admitting { return "an admission left unanswered" }
                if let exchange = active.exchange, exchange.isDone { return "a done exchange kept" }
                if active.exchange != nil, active.intake != nil { return "a request both forwarded and queued" }
                if active.intake != nil, active.response != .pending { return "a queued request answered twice" }
                if case .writing = active.response, active.exchange?.relayingGeneration == nil {
                    return "a response written by no exchange"
                }
            }
            return nil
        }
        // Depth-first over all sequences: each prefix is replayed from a fresh machine.
        func explore(depth: Int) {
            for symbol in Self.alphabet.indices {
                sequence[depth] = symbol
                var driver = Driver()
                var wasClosing = false
                for step in 0...depth {
                    let actions = Self.alphabet[sequence[step]].1(&driver)
                    if wasClosing,
                        actions.contains(where: {
                            switch $0 {
                            case .writeHead, .writeBody, .writeError, .writeAccepted, .endResponse, .admit: true
                            default: false
                            }
                        })
                    {
                        driver.violation = driver.violation ?? "written to once closing"
                    }
                    wasClosing = driver.machine.isClosing
                    if let broken = driver.violation ?? brokenInvariant(driver.machine), failures.count < 5 {
                        failures.append(
                            broken + ": " + sequence[0...step].map { Self.alphabet[$0].0 }.joined(separator: ", "))
                        break
                    }
                }
                checked += 1
                if depth + 1 < length { explore(depth: depth + 1) }
            }
        }
        explore(depth: 0)
        #expect(failures == [])
        #expect(checked > 200_000)
    }
}
