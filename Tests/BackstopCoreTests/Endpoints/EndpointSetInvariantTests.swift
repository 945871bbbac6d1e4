import BackstopCore
import Testing

/// Every sequence of up to six calls from a small alphabet, on one, two and three endpoints, checked after each call
/// against the promises of docs/reference/behaviour.md#endpoints-and-ejection: never more than one probe per
/// endpoint, never an ejected endpoint chosen, circuit open only when nothing may be tried, an ejection only after
/// `failures` failures in a row, and ejections in a row each longer than the last (up to the cap).
@Suite("EndpointSet invariants")
struct EndpointSetInvariantTests {
    enum Op: CaseIterable {
        /// A first attempt.
        case choose
        /// A retry or a hedge: avoids the endpoint of the newest outstanding ticket.
        case chooseElsewhere
        /// The oldest outstanding attempt ends.
        case succeed, fail, abandon
        /// Time passes: within an ejection, a permit's lifetime, a whole ejection.
        case wait1, wait5, wait10
    }

    /// What the checks remember besides the set itself.
    struct Model {
        var set: EndpointSet
        var now: Duration = .seconds(100)
        var outstanding: [EndpointTicket] = []
        /// Failures in a row reported for each endpoint while it was healthy.
        var failuresInARow: [Int]
        /// The length of each endpoint's last ejection since it was last restored.
        var lastEjection: [Duration?]
        var ejectionCount: [Int]
    }

    static let policy = EndpointPolicy(
        failures: 2, openFor: .seconds(10), maxOpenFor: .seconds(40),
        maxInflight: 10, probeTimeout: .seconds(5))

    @Test(
        "every short sequence keeps the promises",
        arguments: [
            (1, BalanceMode.failover, 6), (2, BalanceMode.failover, 6), (2, BalanceMode.roundRobin, 6),
            (3, BalanceMode.roundRobin, 5),
        ])
    func everyShortSequence(endpoints: Int, balance: BalanceMode, length: Int) {
        var policy = Self.policy
        policy.balance = balance
        let start = Model(
            set: EndpointSet(endpointCount: endpoints, policy: policy),
            failuresInARow: Array(repeating: 0, count: endpoints),
            lastEjection: Array(repeating: nil, count: endpoints), ejectionCount: Array(repeating: 0, count: endpoints))
        var visited = 0
        var failures: [String] = []
        func explore(_ model: Model, _ path: [Op]) {
            guard path.count < length, failures.count < 5 else { return }
            for op in Op.allCases {
                var next = model
                visited += 1
                if let problem = Self.apply(op, to: &next) {
                    failures.append("\(path + [op]): \(problem)")
                    continue
                }
                explore(next, path + [op])
            }
        }
        explore(start, [])
        #expect(failures.isEmpty, "\(failures)")
        #expect(visited > 1000)
    }

    /// Applies `op` and returns the first broken promise, if any.
    static func apply(_ op: Op, to model: inout Model) -> String? {
        var before = model.set
        _ = before.expirePermits(now: model.now)
        let healthBefore = before.health
        let due = healthBefore.indices.map {
            healthBefore[$0] == .ejected && before.nextProbe(endpoint: $0)! <= model.now
        }
        var events: [EndpointEvent] = []
        switch op {
        case .choose, .chooseElsewhere:
            let avoiding = op == .chooseElsewhere ? model.outstanding.last.map { [$0.endpoint] } ?? [] : []
            let choice = model.set.choose(avoiding: avoiding, now: model.now)
            events = choice.events
            let candidates = healthBefore.indices.filter { healthBefore[$0] == .healthy || due[$0] }
            switch choice.verdict {
            case .attempt(let ticket):
                let e = ticket.endpoint
                if ticket.isProbe {
                    guard due[e] else { return "probe of endpoint \(e) that was not due (\(healthBefore[e]))" }
                } else if healthBefore[e] != .healthy {
                    return "endpoint \(e) chosen while \(healthBefore[e])"
                }
                if avoiding.contains(e), candidates.contains(where: { !avoiding.contains($0) }) {
                    return "endpoint \(e) chosen although avoided and \(candidates) were candidates"
                }
                model.outstanding.append(ticket)
            case .circuitOpen(let retryAfter):
                guard candidates.isEmpty else { return "circuit open with candidates \(candidates)" }
                guard retryAfter >= 1 else { return "Retry-After \(retryAfter)" }
            }
        case .succeed, .fail, .abandon:
            guard !model.outstanding.isEmpty else { return nil }
            let ticket = model.outstanding.removeFirst()
            let outcome: EndpointOutcome = op == .succeed ? .success : op == .fail ? .failure : .abandoned
            events = model.set.report(outcome, ticket: ticket, now: model.now)
            // The shadow count of failures in a row, for reports that count (healthy endpoint, no permit).
            if !ticket.isProbe && healthBefore[ticket.endpoint] == .healthy {
                if outcome == .success { model.failuresInARow[ticket.endpoint] = 0 }
                if outcome == .failure { model.failuresInARow[ticket.endpoint] += 1 }
            }
        case .wait1: model.now += .seconds(1); return nil
        case .wait5: model.now += .seconds(5); return nil
        case .wait10: model.now += .seconds(10); return nil
        }
        let health = model.set.health
        for event in events {
            switch event {
            case .ejected(let e, let openFor, let ejection):
                guard health[e] == .ejected else { return "ejected event but \(health[e])" }
                if healthBefore[e] == .healthy {
                    // Ejected from service: only after `failures` failures in a row.
                    guard model.failuresInARow[e] >= policy.failures else {
                        return "endpoint \(e) ejected after \(model.failuresInARow[e]) failures in a row"
                    }
                }
                if let last = model.lastEjection[e] {
                    guard openFor > last || openFor == policy.maxOpenFor else {
                        return "ejection of \(openFor) after one of \(last)"
                    }
                }
                guard ejection == model.ejectionCount[e] + 1 else { return "ejection number \(ejection)" }
                model.lastEjection[e] = openFor
                model.ejectionCount[e] = ejection
                model.failuresInARow[e] = 0
            case .restored(let e):
                guard health[e] == .healthy, healthBefore[e] == .probing else {
                    return "restored from \(healthBefore[e])"
                }
                model.lastEjection[e] = nil
                model.ejectionCount[e] = 0
                model.failuresInARow[e] = 0
            case .probing(let e):
                guard health[e] == .probing else { return "probing event but \(health[e])" }
            case .probeReleased(let e):
                guard health[e] == .ejected, model.set.nextProbe(endpoint: e) == model.now else {
                    return "released badly"
                }
            }
        }
        // At most one valid permit per endpoint, held by exactly the endpoints that are probing.
        for e in health.indices {
            let permits = model.outstanding.filter { $0.endpoint == e && $0.isProbe }
            let live = permits.filter { ticket in
                var probe = model.set
                // A permit is live when reporting it would be acted on: success would restore.
                return probe.report(.success, ticket: ticket, now: model.now).contains(.restored(endpoint: e))
            }
            guard live.count <= 1 else { return "\(live.count) live probe permits for endpoint \(e)" }
            guard (health[e] == .probing) == (live.count == 1) else {
                return "endpoint \(e) is \(health[e]) with \(live.count) live permits"
            }
        }
        guard model.set.inflight == 0 else { return "inflight moved" }
        return nil
    }
}
