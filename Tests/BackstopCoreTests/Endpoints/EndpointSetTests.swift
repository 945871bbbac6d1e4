import BackstopCore
import Testing

/// Whole decisions of `EndpointSet`, transition by transition: each case runs a script of calls from a fresh set
/// and compares every call's result and the final states.
@Suite("EndpointSet transitions")
struct EndpointSetTests {
    /// Two failures eject for 10 s (doubling to 5 min); a probe permit lasts 5 s.
    static func policy(
        _ balance: BalanceMode = .failover, failures: Int = 2, maxInflight: Int = 2
    ) -> EndpointPolicy {
        EndpointPolicy(
            balance: balance, failures: failures, openFor: .seconds(10), maxInflight: maxInflight,
            probeTimeout: .seconds(5))
    }

    static func t(_ seconds: Double) -> Duration { .milliseconds(Int64((seconds * 1000).rounded())) }
    static func ticket(_ endpoint: Int, probe: UInt64? = nil) -> EndpointTicket {
        EndpointTicket(endpoint: endpoint, probe: probe)
    }

    /// One call and what it must return.
    enum Step: Sendable, CustomStringConvertible {
        case choose(avoiding: [Int] = [], at: Double, EndpointChoice)
        case report(EndpointOutcome, EndpointTicket, at: Double, [EndpointEvent])
        case expire(at: Double, [EndpointEvent])

        var description: String {
            switch self {
            case .choose(let avoiding, let at, _): "choose(avoiding: \(avoiding)) at \(at)"
            case .report(let outcome, let ticket, let at, _): "report(\(outcome), \(ticket)) at \(at)"
            case .expire(let at, _): "expire at \(at)"
            }
        }
    }

    struct Case: Sendable, CustomTestStringConvertible {
        var name: String
        var endpoints = 2
        var policy = EndpointSetTests.policy()
        var steps: [Step]
        var health: [EndpointHealth]
        var testDescription: String { name }
    }

    static func attempt(_ endpoint: Int, probe: UInt64? = nil, events: [EndpointEvent] = []) -> EndpointChoice {
        EndpointChoice(verdict: .attempt(ticket(endpoint, probe: probe)), events: events)
    }

    static func open(_ seconds: Int, events: [EndpointEvent] = []) -> EndpointChoice {
        EndpointChoice(verdict: .circuitOpen(retryAfter: seconds), events: events)
    }

    static func ejected(_ endpoint: Int, _ seconds: Int, _ ejection: Int) -> EndpointEvent {
        .ejected(endpoint: endpoint, openFor: .seconds(seconds), ejection: ejection)
    }

    /// Endpoint 0 ejected at t=0 after two failures.
    static let ejectFirst: [Step] = [
        .report(.failure, ticket(0), at: 0, []),
        .report(.failure, ticket(0), at: 0, [ejected(0, 10, 1)]),
    ]

    static let cases: [Case] = [
        // choosing among healthy endpoints
        Case(
            name: "failover takes the first healthy endpoint",
            steps: [
                .choose(at: 0, attempt(0)), .choose(at: 0, attempt(0)),
            ], health: [.healthy, .healthy]),
        Case(
            name: "a retry avoids the endpoint that just failed",
            steps: [
                .choose(avoiding: [0], at: 0, attempt(1))
            ], health: [.healthy, .healthy]),
        Case(
            name: "avoiding every candidate falls back to the first of them",
            steps: [
                .choose(avoiding: [1, 0], at: 0, attempt(0))
            ], health: [.healthy, .healthy]),
        Case(
            name: "a single endpoint is chosen again even when avoided", endpoints: 1,
            steps: [
                .choose(avoiding: [0], at: 0, attempt(0))
            ], health: [.healthy]),
        Case(
            name: "round robin takes each endpoint in turn", endpoints: 3, policy: policy(.roundRobin),
            steps: [
                .choose(at: 0, attempt(0)), .choose(at: 0, attempt(1)), .choose(at: 0, attempt(2)),
                .choose(at: 0, attempt(0)),
            ], health: [.healthy, .healthy, .healthy]),
        Case(
            name: "round robin goes on after an avoided endpoint", endpoints: 3, policy: policy(.roundRobin),
            steps: [
                .choose(avoiding: [0], at: 0, attempt(1)), .choose(at: 0, attempt(2)),
                .choose(avoiding: [0, 1], at: 0, attempt(2)),
            ], health: [.healthy, .healthy, .healthy]),
        Case(
            name: "round robin skips an ejected endpoint", endpoints: 3, policy: policy(.roundRobin),
            steps: ejectFirst + [
                .choose(at: 1, attempt(1)), .choose(at: 1, attempt(2)), .choose(at: 1, attempt(1)),
            ], health: [.ejected, .healthy, .healthy]),

        // counting failures while healthy
        Case(
            name: "one failure short of circuit.failures ejects nothing",
            steps: [
                .report(.failure, ticket(0), at: 0, []), .choose(at: 0, attempt(0)),
            ], health: [.healthy, .healthy]),
        Case(
            name: "a success starts the count over",
            steps: [
                .report(.failure, ticket(0), at: 0, []), .report(.success, ticket(0), at: 0, []),
                .report(.failure, ticket(0), at: 0, []), .choose(at: 0, attempt(0)),
            ], health: [.healthy, .healthy]),
        Case(
            name: "an abandoned attempt neither counts nor resets",
            steps: [
                .report(.failure, ticket(0), at: 0, []), .report(.abandoned, ticket(0), at: 0, []),
                .report(.failure, ticket(0), at: 0, [ejected(0, 10, 1)]),
            ], health: [.ejected, .healthy]),
        Case(
            name: "failures of one endpoint do not count against another",
            steps: [
                .report(.failure, ticket(0), at: 0, []), .report(.failure, ticket(1), at: 0, []),
                .report(.success, ticket(1), at: 0, []), .report(.failure, ticket(1), at: 0, []),
            ], health: [.healthy, .healthy]),
        Case(
            name: "failures: 0 never ejects", endpoints: 1, policy: policy(failures: 0),
            steps: Array(repeating: .report(.failure, ticket(0), at: 0, []), count: 50) + [.choose(at: 0, attempt(0))],
            health: [.healthy]),
        Case(
            name: "failures: 1 ejects on the first failure", endpoints: 1, policy: policy(failures: 1),
            steps: [
                .report(.failure, ticket(0), at: 0, [ejected(0, 10, 1)])
            ], health: [.ejected]),

        // ejected
        Case(
            name: "an ejected endpoint is passed over until open_for has passed",
            steps: ejectFirst + [
                .choose(at: 9.999, attempt(1))
            ], health: [.ejected, .healthy]),
        Case(
            name: "reports of attempts that started before the ejection change nothing",
            steps: ejectFirst + [
                .report(.failure, ticket(0), at: 1, []), .report(.success, ticket(0), at: 1, []),
                .choose(at: 1, attempt(1)),
            ], health: [.ejected, .healthy]),
        Case(
            name: "every endpoint ejected: circuit open until the earliest probe, rounded up",
            steps: ejectFirst + [
                .report(.failure, ticket(1), at: 4.5, []),
                .report(.failure, ticket(1), at: 4.5, [ejected(1, 10, 1)]),
                .choose(at: 4.5, open(6)), .choose(at: 9.001, open(1)),
            ], health: [.ejected, .ejected]),
        Case(
            name: "single endpoint: a classic circuit breaker", endpoints: 1,
            steps: ejectFirst + [
                .choose(at: 0, open(10)), .choose(at: 0.5, open(10)), .choose(at: 9, open(1)),
            ], health: [.ejected]),

        // probing
        Case(
            name: "failover probes the first endpoint once its open_for has passed",
            steps: ejectFirst + [
                .choose(at: 10, attempt(0, probe: 1, events: [.probing(endpoint: 0)])),
                .choose(at: 10, attempt(1)),
            ], health: [.probing, .healthy]),
        Case(
            name: "a retry avoiding the due endpoint does not probe it",
            steps: ejectFirst + [
                .choose(avoiding: [0], at: 10, attempt(1))
            ], health: [.ejected, .healthy]),
        Case(
            name: "only one probe at a time", endpoints: 1,
            steps: ejectFirst + [
                .choose(at: 10, attempt(0, probe: 1, events: [.probing(endpoint: 0)])),
                .choose(at: 10, open(1)), .choose(at: 12, open(1)),
            ], health: [.probing]),
        Case(
            name: "a probe that succeeds restores the endpoint and resets the doubling", endpoints: 1,
            steps: ejectFirst + [
                .choose(at: 10, attempt(0, probe: 1, events: [.probing(endpoint: 0)])),
                .report(.success, ticket(0, probe: 1), at: 10.2, [.restored(endpoint: 0)]),
                .choose(at: 10.2, attempt(0)),
                .report(.failure, ticket(0), at: 11, []),
                .report(.failure, ticket(0), at: 11, [ejected(0, 10, 1)]),
            ], health: [.ejected]),
        Case(
            name: "a probe that fails ejects again for twice as long", endpoints: 1,
            steps: ejectFirst + [
                .choose(at: 10, attempt(0, probe: 1, events: [.probing(endpoint: 0)])),
                .report(.failure, ticket(0, probe: 1), at: 10.5, [ejected(0, 20, 2)]),
                .choose(at: 30.4, open(1)),
                .choose(at: 30.5, attempt(0, probe: 2, events: [.probing(endpoint: 0)])),
                .report(.failure, ticket(0, probe: 2), at: 31, [ejected(0, 40, 3)]),
            ], health: [.ejected]),
        Case(
            name: "a cancelled probe leaves the next request to probe at once", endpoints: 1,
            steps: ejectFirst + [
                .choose(at: 10, attempt(0, probe: 1, events: [.probing(endpoint: 0)])),
                .report(.abandoned, ticket(0, probe: 1), at: 11, [.probeReleased(endpoint: 0)]),
                .choose(at: 11, attempt(0, probe: 2, events: [.probing(endpoint: 0)])),
                .report(.failure, ticket(0, probe: 2), at: 12, [ejected(0, 20, 2)]),
            ], health: [.ejected]),
        Case(
            name: "a probe that hangs past per_try fails when the permit expires", endpoints: 1,
            steps: ejectFirst + [
                .choose(at: 10, attempt(0, probe: 1, events: [.probing(endpoint: 0)])),
                .choose(at: 14.999, open(1)),
                .choose(at: 15, open(20, events: [ejected(0, 20, 2)])),
                .report(.success, ticket(0, probe: 1), at: 16, []),
            ], health: [.ejected]),
        Case(
            name: "an expired permit is reclaimed by any call",
            steps: ejectFirst + [
                .choose(at: 10, attempt(0, probe: 1, events: [.probing(endpoint: 0)])),
                .report(.success, ticket(1), at: 15, [ejected(0, 20, 2)]),
                .expire(at: 40, []),
            ], health: [.ejected, .healthy]),
        Case(
            name: "expirePermits on its own",
            steps: ejectFirst + [
                .choose(at: 10, attempt(0, probe: 1, events: [.probing(endpoint: 0)])),
                .expire(at: 14, []), .expire(at: 15, [ejected(0, 20, 2)]),
            ], health: [.ejected, .healthy]),
        Case(
            name: "a report with a stale or foreign permit is ignored", endpoints: 1,
            steps: ejectFirst + [
                .choose(at: 10, attempt(0, probe: 1, events: [.probing(endpoint: 0)])),
                .report(.success, ticket(0, probe: 7), at: 10, []),
                .report(.failure, ticket(0), at: 10, []),
                .report(.success, ticket(0, probe: 1), at: 10, [.restored(endpoint: 0)]),
                .report(.failure, ticket(0, probe: 1), at: 10, []),
            ], health: [.healthy]),
        Case(
            name: "an unknown endpoint index is ignored", endpoints: 1,
            steps: [
                .report(.failure, ticket(3), at: 0, []), .report(.failure, ticket(-1), at: 0, []),
            ], health: [.healthy]),
        Case(
            name: "one endpoint probing, the other ejected: retry in a second",
            steps: ejectFirst + [
                .report(.failure, ticket(1), at: 1, []),
                .report(.failure, ticket(1), at: 1, [ejected(1, 10, 1)]),
                .choose(at: 10, attempt(0, probe: 1, events: [.probing(endpoint: 0)])),
                .choose(at: 10, open(1)),
                .choose(at: 11, attempt(1, probe: 2, events: [.probing(endpoint: 1)])),
            ], health: [.probing, .probing]),
        Case(
            name: "doubling stops at 5 minutes", endpoints: 1,
            steps: ejectFirst + [
                .choose(at: 10, attempt(0, probe: 1, events: [.probing(endpoint: 0)])),
                .report(.failure, ticket(0, probe: 1), at: 10, [ejected(0, 20, 2)]),
                .choose(at: 30, attempt(0, probe: 2, events: [.probing(endpoint: 0)])),
                .report(.failure, ticket(0, probe: 2), at: 30, [ejected(0, 40, 3)]),
                .choose(at: 70, attempt(0, probe: 3, events: [.probing(endpoint: 0)])),
                .report(.failure, ticket(0, probe: 3), at: 70, [ejected(0, 80, 4)]),
                .choose(at: 150, attempt(0, probe: 4, events: [.probing(endpoint: 0)])),
                .report(.failure, ticket(0, probe: 4), at: 150, [ejected(0, 160, 5)]),
                .choose(at: 310, attempt(0, probe: 5, events: [.probing(endpoint: 0)])),
                .report(.failure, ticket(0, probe: 5), at: 310, [ejected(0, 300, 6)]),
                .choose(at: 610, attempt(0, probe: 6, events: [.probing(endpoint: 0)])),
                .report(.failure, ticket(0, probe: 6), at: 610, [ejected(0, 300, 7)]),
            ], health: [.ejected]),
    ]

    @Test("each transition", arguments: cases)
    func transition(_ c: Case) {
        var set = EndpointSet(endpointCount: c.endpoints, policy: c.policy)
        for (index, step) in c.steps.enumerated() {
            switch step {
            case .choose(let avoiding, let at, let expected):
                #expect(set.choose(avoiding: avoiding, now: Self.t(at)) == expected, "step \(index): \(step)")
            case .report(let outcome, let ticket, let at, let expected):
                #expect(set.report(outcome, ticket: ticket, now: Self.t(at)) == expected, "step \(index): \(step)")
            case .expire(let at, let expected):
                #expect(set.expirePermits(now: Self.t(at)) == expected, "step \(index): \(step)")
            }
        }
        #expect(set.health == c.health)
    }

    @Test("open_for doubles per ejection in a row, capped at 5 minutes")
    func openForTable() {
        let set = EndpointSet(endpointCount: 1, policy: Self.policy())
        let table: [(Int, Duration)] = [
            (1, .seconds(10)), (2, .seconds(20)), (3, .seconds(40)), (4, .seconds(80)), (5, .seconds(160)),
            (6, .seconds(300)), (7, .seconds(300)), (1000, .seconds(300)), (.max, .seconds(300)),
        ]
        for (ejection, expected) in table {
            #expect(set.openFor(ejection: ejection) == expected, "ejection \(ejection)")
        }
        let long = EndpointSet(endpointCount: 1, policy: EndpointPolicy(openFor: .seconds(200)))
        #expect([1, 2, 3].map { long.openFor(ejection: $0) } == [.seconds(200), .seconds(300), .seconds(300)])
    }

    @Test("max_inflight: one request beyond it is overloaded until a slot is released")
    func inflight() {
        var set = EndpointSet(endpointCount: 1, policy: Self.policy(maxInflight: 2))
        #expect(
            [set.acquire(now: .zero).0, set.acquire(now: .zero).0, set.acquire(now: .zero).0] == [
                .admitted, .admitted, .overloaded,
            ])
        #expect(set.inflight == 2)
        set.release()
        #expect(set.inflight == 1)
        #expect([set.acquire(now: .zero).0, set.acquire(now: .zero).0] == [.admitted, .overloaded])
        set.release()
        set.release()
        #expect(set.inflight == 0)
    }

    @Test(
        "admission: circuit-open, taking no slot, while every endpoint is ejected or probed; admitted once one is due")
    func admissionWhileEjected() {
        var set = EndpointSet(endpointCount: 2, policy: Self.policy(maxInflight: 1))
        for (endpoint, at) in [(0, 0.0), (0, 0), (1, 0.5), (1, 0.5)] {
            _ = set.report(.failure, ticket: Self.ticket(endpoint), now: Self.t(at))
        }
        #expect(set.health == [.ejected, .ejected])
        // Before the overload check: a full upstream whose endpoints are all ejected says when to come back.
        #expect(set.acquire(now: Self.t(3.2)).0 == .circuitOpen(retryAfter: 7))
        #expect(set.inflight == 0)
        // Endpoint 0 due for its probe: admitted; while the probe is out, endpoint 1 is not due yet.
        #expect(set.acquire(now: Self.t(10)).0 == .admitted)
        #expect(set.choose(now: Self.t(10)) == Self.attempt(0, probe: 1, events: [.probing(endpoint: 0)]))
        #expect(set.acquire(now: Self.t(10)).0 == .circuitOpen(retryAfter: 1))
        #expect(set.acquire(now: Self.t(10.4)).0 == .circuitOpen(retryAfter: 1))
        // Endpoint 1 due as well: the next request is admitted only as far as max_inflight allows.
        #expect(set.acquire(now: Self.t(10.5)).0 == .overloaded)
        set.release()
        #expect(set.acquire(now: Self.t(10.5)).0 == .admitted)
    }

    @Test("admission: a probe past its deadline counts as failed, so an unanswered probe cannot keep the circuit open")
    func admissionExpiresAnUnansweredProbe() {
        var set = EndpointSet(endpointCount: 1, policy: Self.policy())
        for _ in 0..<2 { _ = set.report(.failure, ticket: Self.ticket(0), now: .zero) }
        #expect(set.choose(now: Self.t(10)) == Self.attempt(0, probe: 1, events: [.probing(endpoint: 0)]))
        // The probe is never reported. Until its 5-s deadline the circuit is open, answered "come back in 1 s".
        #expect(set.acquire(now: Self.t(14)).0 == .circuitOpen(retryAfter: 1))
        // At the deadline admission itself ejects it again (doubled), and says when the next probe may go.
        let (admission, events) = set.acquire(now: Self.t(15))
        #expect(events == [Self.ejected(0, 20, 2)])
        #expect(admission == .circuitOpen(retryAfter: 20))
        #expect(set.acquire(now: Self.t(35)).0 == .admitted)
    }

    @Test("the policy comes from the upstream's balance, circuit and per_try")
    func policyFromConfig() {
        let upstream = UpstreamConfig(
            name: "a", match: MatchConfig(hosts: ["a"]),
            endpoints: [UpstreamURL(scheme: "http", host: "a"), UpstreamURL(scheme: "http", host: "b")],
            balance: .roundRobin, circuit: CircuitConfig(failures: 3, openFor: .seconds(7), maxInflight: 9),
            timeouts: Timeouts(perTry: .seconds(4)))
        let set = EndpointSet(upstream: upstream)
        #expect(set.endpointCount == 2)
        #expect(
            set.policy
                == EndpointPolicy(
                    balance: .roundRobin, failures: 3, openFor: .seconds(7),
                    maxOpenFor: .seconds(300), maxInflight: 9, probeTimeout: .seconds(4)))
    }

    @Test("next probe times and counters for the status page")
    func observability() {
        var set = EndpointSet(endpointCount: 2, policy: Self.policy())
        _ = set.report(.failure, ticket: Self.ticket(1), now: .seconds(3))
        #expect(set.failuresInARow(endpoint: 1) == 1)
        _ = set.report(.failure, ticket: Self.ticket(1), now: .seconds(3))
        #expect(set.nextProbe(endpoint: 0) == nil)
        #expect(set.nextProbe(endpoint: 1) == .seconds(13))
        #expect(set.ejections(endpoint: 1) == 1)
        #expect(set.failuresInARow(endpoint: 1) == 0)
        _ = set.choose(avoiding: [0], now: .seconds(13))
        #expect(set.nextProbe(endpoint: 1) == .seconds(18))
        #expect(set.health == [.healthy, .probing])
        #expect(EndpointHealth.allCases.map(\.rawValue) == [0, 1, 2])
    }
}
