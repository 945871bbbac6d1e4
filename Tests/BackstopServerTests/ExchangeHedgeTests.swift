import BackstopCore
import BackstopTransport
import NIOCore
import Testing

@testable import BackstopServer

/// The exchange's hedging decisions, as rows of the same table (docs/reference/behaviour.md#hedging): a request
/// without a head `hedge.after` after its attempt was sent gets a copy (the budget, a credential and an endpoint asked
/// in turn, as for a retry), the first head that is not a `retry.on` condition wins and the others are let go, an
/// attempt that ends otherwise while others run leaves the set, and only the last one's outcome is decided on.
extension ExchangeStateMachineTests {
    /// GET, `hedge: {after: 50ms, max}`, `retry.attempts`, per_try 2 s, total 10 s; `routed`: with endpoints.
    static func hedged(
        max: Int = 1, attempts: Int = 3, routed: Bool = false, method: String = "GET", hasBody: Bool = false,
        declaredLength: Int? = nil, credential: Machine.CredentialKind = .none
    ) -> Machine.Configuration {
        var configuration = configuration(
            method: method, hasBody: hasBody, declaredLength: declaredLength, credential: credential,
            attempts: attempts)
        configuration.choosesEndpoint = routed
        configuration.hedge = Machine.HedgePlan(after: .milliseconds(50), max: max)
        return configuration
    }

    /// Attempt `generation` (number `attempt`) sent as a hedged copy, at `endpoint` when routed.
    static func copy(
        _ generation: Int, attempt: Int? = nil, endpoint: Int? = nil, credential: Machine.Credential = .none
    ) -> Action {
        .startAttempt(
            Machine.Start(
                generation: generation, attempt: attempt ?? generation, credential: credential, mayResend: true,
                countsAsRequest: false, replacing: nil, endpoint: endpoint, hedge: true))
    }

    /// The head of attempt `generation` wins; `cancel`: the others let go.
    static func wins(
        _ head: UpstreamResponseHead, generation: Int, attempts: Int, endpoint: Int? = nil,
        cancel: [Machine.LetGo] = []
    ) -> Action {
        .deliverHead(
            head,
            Machine.Delivery(
                generation: generation, error: nil, attempts: attempts,
                report: .response(status: head.status, version: "1.1"),
                endpoint: endpoint.map { ended($0, .success) }, cancel: cancel))
    }

    static func left(
        _ generation: Int, _ report: Machine.AttemptReport, endpoint: EndpointReport? = nil,
        disposal: Machine.Disposal = .none
    ) -> Action {
        .attemptLeft(
            Machine.AttemptLeft(generation: generation, report: report, endpoint: endpoint, disposal: disposal))
    }

    static func hedgedRecord(
        _ status: Int, attempts: Int, won: UInt8 = 0, lost: UInt8 = 0, cancelled: UInt8 = 0,
        failure: TransportFailure? = nil, endpoint: Int? = nil
    ) -> Machine.Record {
        var record = record(status, attempts: attempts, failure: failure)
        record.endpoint = endpoint
        record.hedges = Machine.HedgeTally(won: won, lost: lost, cancelled: cancelled)
        return record
    }

    static var completed: Machine.Ending { .completed(requestComplete: true) }

    /// A GET without a head 50 ms after its attempt was sent: copy 2 is sent beside attempt 1.
    static var race: [(Event, Action)] {
        [(.start(), start()), (.timer(ms: 50), .requestHedgePermit), (.permit(true, ms: 50), copy(2))]
    }

    /// `race` to an upstream with endpoints: attempt 1 at endpoint 0, copy 2 at endpoint 1.
    static func routedRace() -> [(Event, Action)] {
        [
            (.start(), .chooseEndpoint(avoiding: [])),
            (.endpoint(.attempt(ticket(0))), startAt(0)),
            (.timer(ms: 50), .requestHedgePermit),
            (.permit(true, ms: 50), .chooseEndpoint(avoiding: [0], copy: true)),
            (.endpoint(.attempt(ticket(1)), ms: 50), copy(2, endpoint: 1)),
        ]
    }

    static let hedgeRows: [Row] = [
        Row(
            name: "the hedge timer is the attempt's next deadline",
            configuration: hedged(),
            steps: [(.start(), start())], deadline: .some(at(50))),
        Row(
            name: "a head before hedge.after: no copy, and no hedge timer left",
            configuration: hedged(),
            steps: [
                (.start(), start()),
                (.head(head(200), ms: 49), deliver(head(200))),
                (.timer(ms: 50), .none),
                (.end(), .end(completed, record(200), report: nil)),
            ], deadline: .some(nil)),
        Row(
            name: "no head after hedge.after: a copy on another endpoint; its head wins, the first is let go",
            configuration: hedged(routed: true),
            steps: [
                (.start(), .chooseEndpoint(avoiding: [])),
                (.endpoint(.attempt(ticket(0))), startAt(0)),
                (.timer(ms: 49), .none),
                (.timer(ms: 50), .requestHedgePermit),
                (.permit(true, ms: 50), .chooseEndpoint(avoiding: [0], copy: true)),
                (.endpoint(.attempt(ticket(1)), ms: 50), copy(2, endpoint: 1)),
                (
                    .head(head(200), generation: 2, ms: 60),
                    wins(
                        head(200), generation: 2, attempts: 2, endpoint: 1,
                        cancel: [Machine.LetGo(generation: 1, endpoint: ended(0, .abandoned))])
                ),
                (.head(head(200), generation: 1, ms: 61), .none),
                (
                    .end(generation: 2),
                    .end(completed, hedgedRecord(200, attempts: 2, won: 1, endpoint: 1), report: nil)
                ),
            ], deadline: .some(nil)),
        Row(
            name: "the first attempt's head comes before the copy's: the copy is let go, counted as cancelled",
            configuration: hedged(routed: true),
            steps: [
                (.start(), .chooseEndpoint(avoiding: [])),
                (.endpoint(.attempt(ticket(0))), startAt(0)),
                (.timer(ms: 50), .requestHedgePermit),
                (.permit(true, ms: 50), .chooseEndpoint(avoiding: [0], copy: true)),
                (.endpoint(.attempt(ticket(1, probe: 9)), ms: 50), copy(2, endpoint: 1)),
                (
                    .head(head(200), ms: 70),
                    wins(
                        head(200), generation: 1, attempts: 2, endpoint: 0,
                        cancel: [Machine.LetGo(generation: 2, endpoint: ended(1, .abandoned, probe: 9))])
                ),
                (
                    .end(),
                    .end(completed, hedgedRecord(200, attempts: 2, cancelled: 1, endpoint: 0), report: nil)
                ),
            ]),
        Row(
            name: "one endpoint: the copy goes to the same one (the endpoint set falls back to it)",
            configuration: hedged(routed: true),
            steps: [
                (.start(), .chooseEndpoint(avoiding: [])),
                (.endpoint(.attempt(ticket(0))), startAt(0)),
                (.timer(ms: 50), .requestHedgePermit),
                (.permit(true, ms: 50), .chooseEndpoint(avoiding: [0], copy: true)),
                (.endpoint(.attempt(ticket(0)), ms: 50), copy(2, endpoint: 0)),
            ]),
        Row(
            name: "no endpoint for the copy (every other ejected or probed): the first goes on alone",
            configuration: hedged(routed: true),
            steps: [
                (.start(), .chooseEndpoint(avoiding: [])),
                (.endpoint(.attempt(ticket(0, probe: 2))), startAt(0)),
                (.timer(ms: 50), .requestHedgePermit),
                (.permit(true, ms: 50), .chooseEndpoint(avoiding: [0], copy: true)),
                (.endpoint(.circuitOpen(retryAfter: 1), ms: 50), .none),
                (.timer(ms: 100), .none),
            ], deadline: .some(at(2000))),
        Row(
            name: "the budget refuses the copy: the first attempt goes on alone, no copy later",
            configuration: hedged(),
            steps: [
                (.start(), start()),
                (.timer(ms: 50), .requestHedgePermit),
                (.permit(false, ms: 50), .none),
                (.head(head(200), ms: 900), deliver(head(200))),
            ]),
        Row(
            name: "after the budget refused a copy, none is asked for again, not when a place opens nor after a retry",
            configuration: hedged(max: 2, attempts: 5),
            steps: race + [
                (.timer(ms: 100), .requestHedgePermit),
                (.permit(false, ms: 100), .none),
                (.failure(reset, generation: 2, ms: 110), left(2, .failed(reset))),
                (.timer(ms: 160), .none),
                (.timer(ms: 500), .none),
            ], deadline: .some(at(2000))),
        Row(
            name: "the budget's late answer after the head won is stale",
            configuration: hedged(),
            steps: [
                (.start(), start()),
                (.timer(ms: 50), .requestHedgePermit),
                (.head(head(200), ms: 50), deliver(head(200))),
                (.permit(true, ms: 50), .none),
            ]),
        Row(
            name: "an upstream with credentials: the copy asks for its own after the budget; none to be had, no copy",
            configuration: hedged(credential: .staticValue),
            steps: [
                (.start(), .acquireCredential),
                (.credential(.value("k")), start(credential: .value("k"))),
                (.timer(ms: 50), .requestHedgePermit),
                (.permit(true, ms: 50), .acquireCredential),
                (.credential(.value("k2"), ms: 50), copy(2, credential: .value("k2"))),
                (.timer(ms: 100), .none),
            ]),
        Row(
            name: "no credential for the copy: the first goes on alone",
            configuration: hedged(credential: .staticValue),
            steps: [
                (.start(), .acquireCredential),
                (.credential(.value("k")), start(credential: .value("k"))),
                (.timer(ms: 50), .requestHedgePermit),
                (.permit(true, ms: 50), .acquireCredential),
                (.credential(nil, ms: 50), .none),
            ], deadline: .some(at(2000))),
        Row(
            name: "hedge.max 2: a second copy another hedge.after later, then none (attempts spent)",
            configuration: hedged(max: 2),
            steps: race + [
                (.timer(ms: 100), .requestHedgePermit), (.permit(true, ms: 100), copy(3)),
                (
                    .head(head(200), generation: 3, ms: 120),
                    wins(
                        head(200), generation: 3, attempts: 3,
                        cancel: [Machine.LetGo(generation: 1), Machine.LetGo(generation: 2)])
                ),
                (
                    .end(generation: 3),
                    .end(completed, hedgedRecord(200, attempts: 3, won: 1, cancelled: 1), report: nil)
                ),
            ]),
        Row(
            name: "hedge.max 1: one copy in flight at once, so no second while both run",
            configuration: hedged(max: 1, attempts: 4),
            steps: race + [], deadline: .some(at(2000))),
        Row(
            name: "a copy that fails while the first runs leaves the set: no retry; a place for another copy opens",
            configuration: hedged(),
            steps: race + [
                (.failure(reset, generation: 2, ms: 55), left(2, .failed(reset))),
                (.timer(ms: 104), .none),
                (.timer(ms: 105), .requestHedgePermit), (.permit(true, ms: 105), copy(3)),
                (
                    .head(head(200), ms: 130),
                    wins(head(200), generation: 1, attempts: 3, cancel: [Machine.LetGo(generation: 3)])
                ),
                (
                    .end(),
                    .end(completed, hedgedRecord(200, attempts: 3, lost: 1, cancelled: 1, failure: reset), report: nil)
                ),
            ]),
        Row(
            name: "a retry.on status does not win the race: it leaves (its small response abandoned), the other wins",
            configuration: hedged(routed: true),
            steps: routedRace() + [
                (
                    .head(head(503), generation: 2, ms: 60),
                    left(2, report(503), endpoint: ended(1, .failure), disposal: .abandon(within: .seconds(5)))
                ),
                (.head(head(200), ms: 70), wins(head(200), generation: 1, attempts: 2, endpoint: 0)),
                (.end(), .end(completed, hedgedRecord(200, attempts: 2, lost: 1, endpoint: 0), report: nil)),
            ]),
        Row(
            name: "every attempt fails: only the last one's failure is decided on, and retried as a lone one's is",
            configuration: hedged(),
            steps: race + [
                (.failure(reset, ms: 60), left(1, .failed(reset))),
                (.failure(reset, generation: 2, ms: 70), .requestRetryPermit(report: .failed(reset))),
                (
                    .permit(true, ms: 70),
                    retry(.reset, attempt: 2, generation: 2, disposal: .none, failure: reset)
                ),
                // The third attempt spends retry.attempts: it gets no copy.
                (.timer(ms: 170), start(3)),
            ], deadline: .some(at(2170))),
        Row(
            name: "per_try runs out on the first while the copy runs: it leaves, cancelled; the copy wins later",
            configuration: hedged(),
            steps: race + [
                (
                    .timer(ms: 2000),
                    left(1, .failed(.timeout(detail: "per_try timeout")), disposal: .cancel)
                ),
                (.head(head(200), generation: 2, ms: 2010), wins(head(200), generation: 2, attempts: 2)),
                (
                    .end(generation: 2),
                    {
                        var record = hedgedRecord(200, attempts: 2, won: 1)
                        record.lastFailure = .timeout(detail: "per_try timeout")
                        return .end(completed, record, report: nil)
                    }()
                ),
            ]),
        Row(
            name:
                "a copy's token is refused: it leaves, no further copy goes out with that token; the last one refreshes",
            configuration: hedged(max: 2, attempts: 5, credential: .oauth2(refreshOn: [401])),
            steps: [
                (.start(), .acquireCredential), (.credential(.token(token1)), start(credential: .token(token1))),
                (.timer(ms: 50), .requestHedgePermit),
                (.permit(true, ms: 50), .acquireCredential),
                (.credential(.token(token1), ms: 50), copy(2, credential: .token(token1))),
                (.head(head(401), generation: 2, ms: 60), left(2, report(401), disposal: .cancel)),
                // The copy that was due at 100 ms is not asked for.
                (.timer(ms: 100), .none),
                (.timer(ms: 150), .none),
                (.head(head(401), ms: 170), .refreshCredential(rejected: token1, report: report(401))),
            ], deadline: .some(at(10_000))),
        Row(
            name: "the client leaves during a race: every attempt's endpoint learns nothing, the copy is cancelled",
            configuration: hedged(routed: true),
            steps: routedRace() + [
                (
                    .gone,
                    .end(
                        .clientClosed,
                        unanswered(hedgedRecord(499, attempts: 2, cancelled: 1, endpoint: 1), copies: 1), report: nil,
                        endpoint: ended(0, .abandoned),
                        letGo: [Machine.LetGo(generation: 2, endpoint: ended(1, .abandoned))])
                ),
                (.head(head(200), generation: 2), .none),
            ], deadline: .some(nil)),
        Row(
            name: "a kept body is replayable: the copy sends it too",
            configuration: hedged(method: "PUT", hasBody: true, declaredLength: 10),
            steps: [
                (.start(), .none), (.body(10), .storeBody), (.bodyEnded(ms: 5), start()),
                (.timer(ms: 55), .requestHedgePermit), (.permit(true, ms: 55), copy(2)),
            ]),
        Row(
            name: "a body that turned into a stream is sent once: never hedged",
            configuration: hedged(method: "PUT", hasBody: true),
            steps: [
                (.start(), .none), (.body(1000), .storeBody), (.body(100), .storeBodyAndBeginStreaming),
                (.streamingBegan, start()),
                (.timer(ms: 50), .none),
            ], deadline: .some(at(2000))),
        Row(
            name: "a chunked body that went to the spool is replayable by a retry, but never hedged",
            configuration: hedged(method: "PUT", hasBody: true),
            steps: [
                (.start(), .none), (.body(1000), .storeBody), (.body(100), .storeBodyAndBeginStreaming),
                (.spooledStreamingBegan, start()), (.bodyEnded(ms: 5), .finishBodyStream),
                (.timer(ms: 50), .none),
            ], deadline: .some(at(2000))),
        Row(
            name: "retry.attempts 1 leaves no attempt for a copy",
            configuration: hedged(attempts: 1),
            steps: [(.start(), start())], deadline: .some(at(2000))),
    ]

    @Test(arguments: hedgeRows) func hedgeTransition(_ row: Row) {
        transition(row)
    }
}
