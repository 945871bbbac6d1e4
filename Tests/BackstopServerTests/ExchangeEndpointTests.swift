import BackstopCore
import BackstopTransport
import NIOCore
import Testing

@testable import BackstopServer

/// The exchange's endpoint decisions, as rows of the same table (docs/reference/behaviour.md#when-an-upstream-is-down):
/// each attempt asks for its endpoint (`.chooseEndpoint`, answered by `endpointChosen`), every attempt that ends says
/// what that means for its endpoint, every endpoint ejected ends the request with 503 `circuit-open`, and a backoff
/// after a failure for want of a network ends at the next network change.
extension ExchangeStateMachineTests {
    static func routed(attempts: Int = 3, networkReturn: Bool = true) -> Machine.Configuration {
        var configuration = configuration(attempts: attempts)
        configuration.choosesEndpoint = true
        configuration.networkReturn = networkReturn
        return configuration
    }

    static func ticket(_ endpoint: Int, probe: UInt64? = nil) -> EndpointTicket {
        EndpointTicket(endpoint: endpoint, probe: probe)
    }

    /// `start(generation)` sent to endpoint `endpoint`.
    static func startAt(_ endpoint: Int, _ generation: Int = 1) -> Action {
        guard case .startAttempt(var start) = start(generation) else { return .none }
        start.endpoint = endpoint
        return .startAttempt(start)
    }

    static func ended(_ endpoint: Int, _ outcome: EndpointOutcome, probe: UInt64? = nil) -> EndpointReport {
        EndpointReport(ticket: ticket(endpoint, probe: probe), outcome: outcome)
    }

    static func deliverFrom(
        _ endpoint: Int, _ head: UpstreamResponseHead, generation: Int = 1, attempts: Int = 1
    ) -> Action {
        guard case .deliverHead(let head, var delivery) = deliver(head, generation: generation, attempts: attempts)
        else { return .none }
        delivery.endpoint = ended(endpoint, .success)
        return .deliverHead(head, delivery)
    }

    static func routedRecord(
        _ status: Int, attempts: Int = 1, retries: [RetryCondition] = [], giveUp: GiveUpReason? = nil,
        condition: RetryCondition? = nil, failure: TransportFailure? = nil, endpoint: Int?, retryAfter: Int? = nil
    ) -> Machine.Record {
        var record = record(
            status, attempts: attempts, retries: retries, giveUp: giveUp, condition: condition, failure: failure)
        record.endpoint = endpoint
        record.retryAfter = retryAfter
        return record
    }

    static func waking(_ failure: TransportFailure) -> Action {
        guard case .retry(var retry) = retry(.connectFailure, disposal: .none, failure: failure) else { return .none }
        retry.wakesOnNetworkChange = true
        return .retry(retry)
    }

    static let unreachable = TransportFailure.connectFailure(detail: "no route", network: .hostUnreachable)
    static let refused = TransportFailure.connectFailure(detail: "refused")

    static let endpointRows: [Row] = [
        Row(
            name: "the attempt asks for its endpoint first, goes there, and its success is reported for it",
            configuration: routed(),
            steps: [
                (.start(), .chooseEndpoint(avoiding: [])),
                (.endpoint(.attempt(ticket(1))), startAt(1)),
                (.head(head(200), ms: 5), deliverFrom(1, head(200))),
                (.end(), .end(.completed(requestComplete: true), routedRecord(200, endpoint: 1), report: nil)),
            ], deadline: .some(nil)),
        Row(
            name: "a retry passes over the endpoint that just failed; each outcome is reported for its endpoint",
            configuration: routed(),
            steps: [
                (.start(), .chooseEndpoint(avoiding: [])),
                (.endpoint(.attempt(ticket(0))), startAt(0)),
                (.head(head(503)), .requestRetryPermit(report: report(503), endpoint: ended(0, .failure))),
                (.permit(true), retry(.status(503), disposal: .abandon(within: .seconds(5)))),
                (.timer(ms: 100), .chooseEndpoint(avoiding: [0])),
                (.endpoint(.attempt(ticket(1)), ms: 100), startAt(1, 2)),
                (.head(head(200), generation: 2, ms: 105), deliverFrom(1, head(200), generation: 2, attempts: 2)),
            ]),
        Row(
            name: "a status outside retry.on is a success for its endpoint, even a 500",
            configuration: routed(),
            steps: [
                (.start(), .chooseEndpoint(avoiding: [])),
                (.endpoint(.attempt(ticket(0, probe: 3))), startAt(0)),
                (
                    .head(head(500)),
                    {
                        guard case .deliverHead(let head, var delivery) = deliver(head(500)) else { return .none }
                        delivery.endpoint = ended(0, .success, probe: 3)
                        return .deliverHead(head, delivery)
                    }()
                ),
            ]),
        Row(
            name: "every endpoint ejected before the first attempt: 503 circuit-open with Retry-After, no attempt",
            configuration: routed(),
            steps: [
                (.start(), .chooseEndpoint(avoiding: [])),
                (
                    .endpoint(.circuitOpen(retryAfter: 7)),
                    .end(
                        .failedLocally(.circuitOpen, requestComplete: true),
                        routedRecord(503, attempts: 0, endpoint: nil, retryAfter: 7), report: nil)
                ),
                (.endpoint(.attempt(ticket(0))), .none),
            ], deadline: .some(nil)),
        Row(
            name: "the failure ejected the last endpoint: no retry, 502 as the attempt failed (not circuit-open)",
            configuration: routed(),
            steps: [
                (.start(), .chooseEndpoint(avoiding: [])),
                (.endpoint(.attempt(ticket(0))), startAt(0)),
                (.failure(refused), .requestRetryPermit(report: .failed(refused), endpoint: ended(0, .failure))),
                (
                    .noEndpoint(),
                    .end(
                        .failedLocally(.upstreamUnreachable, requestComplete: true),
                        routedRecord(
                            502, giveUp: .circuitOpen, condition: .connectFailure, failure: refused, endpoint: 0),
                        report: nil)
                ),
            ], deadline: .some(nil)),
        Row(
            name: "the 503 ejected the last endpoint: the upstream's 503 is delivered, with what came meanwhile",
            configuration: routed(),
            steps: [
                (.start(), .chooseEndpoint(avoiding: [])),
                (.endpoint(.attempt(ticket(0))), startAt(0)),
                (.head(head(503)), .requestRetryPermit(report: report(503), endpoint: ended(0, .failure))),
                (.responseBody(ok), .none),
                (.noEndpoint(), deliver(head(503), reported: false, replay: [.body(ok)])),
                (
                    .end(),
                    .end(
                        .completed(requestComplete: true),
                        routedRecord(503, giveUp: .circuitOpen, condition: .status(503), endpoint: 0), report: nil)
                ),
            ]),
        Row(
            name: "every endpoint ejected during the retry's backoff: it ends as the failed attempt did",
            configuration: routed(),
            steps: [
                (.start(), .chooseEndpoint(avoiding: [])),
                (.endpoint(.attempt(ticket(0, probe: 4))), startAt(0)),
                (
                    .failure(refused),
                    .requestRetryPermit(report: .failed(refused), endpoint: ended(0, .failure, probe: 4))
                ),
                (.permit(true), retry(.connectFailure, disposal: .none, failure: refused)),
                (.timer(ms: 100), .chooseEndpoint(avoiding: [0])),
                (
                    .endpoint(.circuitOpen(retryAfter: 2), ms: 100),
                    .end(
                        .failedLocally(.upstreamUnreachable, requestComplete: true),
                        routedRecord(
                            502, retries: [.connectFailure], giveUp: .circuitOpen, condition: .connectFailure,
                            failure: refused, endpoint: 0),
                        report: nil)
                ),
            ]),
        Row(
            name:
                "a failure, then a retried 503, then every endpoint ejected in the backoff: circuit-open (the 503 is gone)",
            configuration: routed(),
            steps: [
                (.start(), .chooseEndpoint(avoiding: [])),
                (.endpoint(.attempt(ticket(0))), startAt(0)),
                (.failure(refused), .requestRetryPermit(report: .failed(refused), endpoint: ended(0, .failure))),
                (.permit(true), retry(.connectFailure, disposal: .none, failure: refused)),
                (.timer(ms: 100), .chooseEndpoint(avoiding: [0])),
                (.endpoint(.attempt(ticket(1)), ms: 100), startAt(1, 2)),
                (
                    .head(head(503), generation: 2, ms: 110),
                    .requestRetryPermit(report: report(503), endpoint: ended(1, .failure))
                ),
                (.permit(true, ms: 110), retry(.status(503), attempt: 2, disposal: .abandon(within: .seconds(5)))),
                (.timer(ms: 210), .chooseEndpoint(avoiding: [1])),
                (
                    .endpoint(.circuitOpen(retryAfter: 3), ms: 210),
                    .end(
                        .failedLocally(.circuitOpen, requestComplete: true),
                        routedRecord(
                            503, attempts: 2, retries: [.connectFailure, .status(503)], failure: refused,
                            endpoint: 1, retryAfter: 3),
                        report: nil)
                ),
            ]),
        Row(
            name: "the client leaves while an attempt is in flight: its endpoint learns nothing (abandoned)",
            configuration: routed(),
            steps: [
                (.start(), .chooseEndpoint(avoiding: [])),
                (.endpoint(.attempt(ticket(0, probe: 1))), startAt(0)),
                (
                    .gone,
                    .end(
                        .clientClosed, unanswered(routedRecord(499, endpoint: 0)), report: nil,
                        endpoint: ended(0, .abandoned, probe: 1))
                ),
            ]),
        Row(
            name: "the client leaves while the endpoint is asked for: nothing to report, the late answer is stale",
            configuration: routed(),
            steps: [
                (.start(), .chooseEndpoint(avoiding: [])),
                (.gone, .end(.clientClosed, routedRecord(499, attempts: 0, endpoint: nil), report: nil)),
                (.endpoint(.attempt(ticket(0))), .none),
            ]),
        Row(
            name: "per_try runs out on the last attempt: a failure (timeout) for its endpoint",
            configuration: routed(attempts: 1),
            steps: [
                (.start(), .chooseEndpoint(avoiding: [])),
                (.endpoint(.attempt(ticket(0))), startAt(0)),
                (
                    .timer(ms: 2000),
                    .end(
                        .failedLocally(.upstreamTimeout, requestComplete: true),
                        routedRecord(
                            504, giveUp: .attemptsExhausted, condition: .timeout,
                            failure: .timeout(detail: "per_try timeout"), endpoint: 0),
                        report: .failed(.timeout(detail: "per_try timeout")), endpoint: ended(0, .failure))
                ),
            ]),
        Row(
            name: "no usable network: the backoff ends at the first network change, the next one changes nothing",
            configuration: routed(),
            steps: [
                (.start(), .chooseEndpoint(avoiding: [])),
                (.endpoint(.attempt(ticket(0))), startAt(0)),
                (
                    .failure(unreachable),
                    .requestRetryPermit(report: .failed(unreachable), endpoint: ended(0, .failure))
                ),
                (.permit(true), waking(unreachable)),
                (.network(ms: 40), .chooseEndpoint(avoiding: [0])),
                (.network(ms: 41), .none),
            ]),
        Row(
            name: "a refused connection is not a missing network: a network change leaves its backoff alone",
            configuration: routed(),
            steps: [
                (.start(), .chooseEndpoint(avoiding: [])),
                (.endpoint(.attempt(ticket(0))), startAt(0)),
                (.failure(refused), .requestRetryPermit(report: .failed(refused), endpoint: ended(0, .failure))),
                (.permit(true), retry(.connectFailure, disposal: .none, failure: refused)),
                (.network(ms: 40), .none),
                (.timer(ms: 100), .chooseEndpoint(avoiding: [0])),
            ]),
        Row(
            name: "on_network_change: false: the backoff is waited out",
            configuration: routed(networkReturn: false),
            steps: [
                (.start(), .chooseEndpoint(avoiding: [])),
                (.endpoint(.attempt(ticket(0))), startAt(0)),
                (
                    .failure(unreachable),
                    .requestRetryPermit(report: .failed(unreachable), endpoint: ended(0, .failure))
                ),
                (.permit(true), retry(.connectFailure, disposal: .none, failure: unreachable)),
                (.network(ms: 40), .none),
            ], deadline: .some(at(100))),
        Row(
            name: "a token replay after a rejected token asks for an endpoint again, avoiding none",
            configuration: {
                var c = configuration(credential: .oauth2(refreshOn: [401]))
                c.choosesEndpoint = true
                return c
            }(),
            steps: [
                (.start(), .acquireCredential),
                (.credential(.token(token1)), .chooseEndpoint(avoiding: [])),
                (
                    .endpoint(.attempt(ticket(0))),
                    {
                        guard case .startAttempt(var s) = start(credential: .token(token1)) else { return .none }
                        s.endpoint = 0
                        return .startAttempt(s)
                    }()
                ),
                (
                    .head(head(401)),
                    .refreshCredential(rejected: token1, report: report(401), endpoint: ended(0, .success))
                ),
                (.refreshed(token2), .chooseEndpoint(avoiding: [])),
            ]),
    ]

    @Test(arguments: endpointRows) func endpointTransition(_ row: Row) {
        transition(row)
    }
}
