/// The endpoints of one upstream and what is known about their health: which endpoint an attempt goes to, which
/// endpoints are ejected and until when, who may probe an ejected one, and how many requests are in progress
/// (docs/reference/behaviour.md#endpoints-and-ejection).
///
/// Pure: time comes in as `now` (any monotonic reading as a `Duration`, never going backwards), and every
/// mutating method returns what it decided, with the state changes it made (`EndpointEvent`) for metrics and logs.
/// One value per upstream, shared by the upstream's requests behind one lock; the exchange consults it as an input.
///
/// Each endpoint is in one of three states:
///
///     healthy   report(failure) × circuit.failures in a row → ejected (open_for, doubled per consecutive ejection)
///               report(success) → healthy, the count of failures in a row starts over
///     ejected   choose() once `until` has passed → probing (the chosen attempt holds the one probe permit)
///     probing   report(success) on the permit → healthy, doubling reset;  report(failure) → ejected, doubled
///               report(abandoned) on the permit → ejected with its probe due at once (nothing was learned)
///               permit not reported within `probeTimeout` → ejected, doubled (a probe that hangs fails)
///
/// Reports for an endpoint that is not healthy count only through its probe permit: attempts that started before
/// an ejection do not extend or end it. A report with a permit that has expired is ignored.
public struct EndpointSet: Sendable, Equatable {
    /// The settings the decisions follow.
    public let policy: EndpointPolicy
    private var slots: [Slot]
    /// Round robin: the index the next choice starts looking at.
    private var cursor = 0
    private var nextPermit: UInt64 = 1
    /// Requests in progress (`acquire` without its `release`).
    public private(set) var inflight = 0

    private struct Slot: Sendable, Equatable {
        var state: SlotState = .healthy
        /// Failed attempts in a row while healthy.
        var failuresInARow = 0
        /// Ejections in a row with no successful probe between them (0 while in service).
        var ejections = 0
    }

    private enum SlotState: Sendable, Equatable {
        case healthy
        case ejected(until: Duration)
        case probing(permit: UInt64, deadline: Duration)
    }

    /// `endpointCount` endpoints (at least one), all healthy, none in flight.
    public init(endpointCount: Int, policy: EndpointPolicy) {
        precondition(endpointCount > 0, "an upstream has at least one endpoint")
        self.policy = policy
        self.slots = Array(repeating: Slot(), count: endpointCount)
    }

    /// The set for one configured upstream.
    public init(upstream: UpstreamConfig) {
        self.init(endpointCount: upstream.endpoints.count, policy: EndpointPolicy(upstream: upstream))
    }

    public var endpointCount: Int { slots.count }

    // MARK: admission

    /// Takes one of `circuit.max_inflight` slots for a request, before anything else is decided for it (its
    /// credential, its body); every `.admitted` must be followed by exactly one `release()` when the request ends.
    /// With no endpoint that may be tried now the request is `circuitOpen` instead and takes no slot: failing fast
    /// means nothing is sent anywhere, a token endpoint included.
    /// `now` is read only when the first endpoint is not healthy (a request of a healthy upstream reads no clock);
    /// then a probe past its deadline counts as failed first, as in `choose` (the events say so), so that an upstream
    /// whose probe was never answered is not refused for ever.
    public mutating func acquire(now: @autoclosure () -> Duration) -> (EndpointAdmission, [EndpointEvent]) {
        var events: [EndpointEvent] = []
        if slots[0].state != .healthy {
            let now = now()
            events = expirePermits(now: now)
            guard mayBeTried(now: now) else { return (.circuitOpen(retryAfter: retryAfterSeconds(now: now)), events) }
        }
        guard inflight < policy.maxInflight else { return (.overloaded, events) }
        inflight += 1
        return (.admitted, events)
    }

    /// Gives back the slot an `.admitted` request held.
    public mutating func release() {
        assert(inflight > 0, "release without acquire")
        inflight = Swift.max(0, inflight - 1)
    }

    // MARK: choosing

    /// The endpoint for the next attempt of a request, or `circuitOpen` when no endpoint may be tried.
    ///
    /// Candidates are the healthy endpoints and the ejected ones whose `open_for` has passed (choosing one of those
    /// hands the attempt its probe permit). `avoiding` lists endpoints to pass over while another candidate exists:
    /// the one whose attempt just failed, those a hedged request already has in flight. `failover` takes the first
    /// candidate in the order written; `round_robin` the first at or after the one following its last choice.
    public mutating func choose(avoiding: [Int] = [], now: Duration) -> EndpointChoice {
        var events = expirePermits(now: now)
        var pick: Int?
        var fallback: Int?
        let count = slots.count
        let start = policy.balance == .roundRobin ? cursor : 0
        for step in 0..<count {
            let index = start + step < count ? start + step : start + step - count
            guard isCandidate(index, now: now) else { continue }
            if avoiding.contains(index) {
                if fallback == nil { fallback = index }
                continue
            }
            pick = index
            break
        }
        guard let index = pick ?? fallback else {
            return EndpointChoice(verdict: .circuitOpen(retryAfter: retryAfterSeconds(now: now)), events: events)
        }
        if policy.balance == .roundRobin { cursor = index + 1 < count ? index + 1 : 0 }
        guard case .ejected = slots[index].state else {
            return EndpointChoice(verdict: .attempt(EndpointTicket(endpoint: index, probe: nil)), events: events)
        }
        let permit = nextPermit
        nextPermit += 1
        slots[index].state = .probing(permit: permit, deadline: now + policy.probeTimeout)
        events.append(.probing(endpoint: index))
        return EndpointChoice(verdict: .attempt(EndpointTicket(endpoint: index, probe: permit)), events: events)
    }

    /// Whether `choose` would find an endpoint now (a probe past its deadline counts once `expirePermits` ran).
    public func mayBeTried(now: Duration) -> Bool {
        slots.indices.contains { isCandidate($0, now: now) }
    }

    private func isCandidate(_ index: Int, now: Duration) -> Bool {
        switch slots[index].state {
        case .healthy: true
        case .ejected(let until): until <= now
        case .probing: false
        }
    }

    /// Whole seconds, at least 1, until an endpoint may be tried again: the earliest end of an ejection; an
    /// endpoint being probed may be back with the probe's answer, so it counts as 1.
    private func retryAfterSeconds(now: Duration) -> Int {
        var earliest = now + policy.maxOpenFor  // no ejection ends later
        for slot in slots {
            switch slot.state {
            case .ejected(let until): earliest = Swift.min(earliest, until)
            // Never healthy here: a healthy endpoint is always a candidate.
            case .probing, .healthy: earliest = Swift.min(earliest, now + .seconds(1))
            }
        }
        return Self.wholeSecondsRoundedUp(earliest - now)
    }

    static func wholeSecondsRoundedUp(_ duration: Duration) -> Int {
        let (seconds, attoseconds) = duration.secondsAndAttoseconds
        let whole = Int(clamping: seconds) + (attoseconds > 0 ? 1 : 0)
        return Swift.max(1, whole)
    }

    // MARK: outcomes

    /// How the attempt holding `ticket` ended. Returns the state changes this caused.
    public mutating func report(_ outcome: EndpointOutcome, ticket: EndpointTicket, now: Duration) -> [EndpointEvent] {
        var events = expirePermits(now: now)
        let index = ticket.endpoint
        guard slots.indices.contains(index) else { return events }
        switch (slots[index].state, ticket.probe) {
        case (.probing(let permit, _), let probe?) where probe == permit:
            switch outcome {
            case .success:
                slots[index] = Slot()
                events.append(.restored(endpoint: index))
            case .failure:
                events.append(eject(index, now: now))
            case .abandoned:
                slots[index].state = .ejected(until: now)
                events.append(.probeReleased(endpoint: index))
            }
        case (.healthy, nil):
            switch outcome {
            case .success:
                slots[index].failuresInARow = 0
            case .failure:
                slots[index].failuresInARow += 1
                if policy.failures > 0, slots[index].failuresInARow >= policy.failures {
                    events.append(eject(index, now: now))
                }
            case .abandoned:
                break
            }
        default:
            // An attempt that started before the endpoint's ejection, or a probe whose permit expired.
            break
        }
        return events
    }

    private mutating func eject(_ index: Int, now: Duration) -> EndpointEvent {
        let ejection = slots[index].ejections + 1
        let length = openFor(ejection: ejection)
        slots[index].ejections = ejection
        slots[index].failuresInARow = 0
        slots[index].state = .ejected(until: now + length)
        return .ejected(endpoint: index, openFor: length, ejection: ejection)
    }

    /// `open_for` doubled for each ejection in a row after the first, at most `maxOpenFor`.
    public func openFor(ejection: Int) -> Duration {
        var length = policy.openFor
        var doubled = 1
        while doubled < ejection && length < policy.maxOpenFor {
            length = length * 2
            doubled += 1
        }
        return Swift.min(length, policy.maxOpenFor)
    }

    /// Ejects again every endpoint whose probe permit outlived `probeTimeout` unreported: the probe is taken to have
    /// failed, so a permit can never be held for ever. Every other method does this first; call it on its own to
    /// bring `health` up to date (a status page).
    public mutating func expirePermits(now: Duration) -> [EndpointEvent] {
        var events: [EndpointEvent] = []
        for index in slots.indices {
            if case .probing(_, let deadline) = slots[index].state, deadline <= now {
                events.append(eject(index, now: now))
            }
        }
        return events
    }

    // MARK: state

    /// Each endpoint's state for `backstop_endpoint_state`, in endpoint order, as of the last mutating call.
    public var health: [EndpointHealth] {
        slots.map {
            switch $0.state {
            case .healthy: .healthy
            case .ejected: .ejected
            case .probing: .probing
            }
        }
    }

    /// When the endpoint may next be tried: the end of its ejection, the deadline of its probe permit; nil when
    /// healthy.
    public func nextProbe(endpoint: Int) -> Duration? {
        switch slots[endpoint].state {
        case .healthy: nil
        case .ejected(let until): until
        case .probing(_, let deadline): deadline
        }
    }

    /// Failed attempts in a row counted against a healthy endpoint.
    public func failuresInARow(endpoint: Int) -> Int { slots[endpoint].failuresInARow }

    /// Ejections in a row of the endpoint since it was last in service (0 when in service).
    public func ejections(endpoint: Int) -> Int { slots[endpoint].ejections }
}

/// The settings an `EndpointSet` follows (`balance`, `circuit`, `timeouts.per_try`).
public struct EndpointPolicy: Sendable, Equatable {
    public var balance: BalanceMode
    /// Failed attempts in a row that eject an endpoint; 0 never ejects.
    public var failures: Int
    public var openFor: Duration
    public var maxOpenFor: Duration
    public var maxInflight: Int
    /// How long a probe permit lasts unreported: the attempt's own `per_try` bound.
    public var probeTimeout: Duration

    public init(
        balance: BalanceMode = .failover, failures: Int = 5, openFor: Duration = .seconds(30),
        maxOpenFor: Duration = CircuitConfig.maxOpenFor, maxInflight: Int = 1024, probeTimeout: Duration = .seconds(10)
    ) {
        self.balance = balance
        self.failures = failures
        self.openFor = openFor
        self.maxOpenFor = maxOpenFor
        self.maxInflight = maxInflight
        self.probeTimeout = probeTimeout
    }

    public init(upstream: UpstreamConfig) {
        self.init(
            balance: upstream.balance, failures: upstream.circuit.failures, openFor: upstream.circuit.openFor,
            maxInflight: upstream.circuit.maxInflight, probeTimeout: upstream.timeouts.perTry)
    }
}

/// Whether a request may start (`circuit.max_inflight`, and some endpoint not ejected).
public enum EndpointAdmission: Sendable, Equatable {
    case admitted
    /// 503 `upstream-overloaded` at once; not an attempt.
    case overloaded
    /// Every endpoint is ejected or being probed: 503 `circuit-open` at once with `Retry-After: retryAfter`, as
    /// `EndpointVerdict.circuitOpen`; not an attempt.
    case circuitOpen(retryAfter: Int)
}

/// The endpoint an attempt was given, and its probe permit when the attempt is the endpoint's half-open probe.
/// Hand it back to `report` when the attempt ends.
public struct EndpointTicket: Sendable, Equatable, Hashable {
    /// Index into the upstream's `endpoints`.
    public let endpoint: Int
    /// The probe permit's id, when this attempt probes an ejected endpoint.
    public let probe: UInt64?

    public init(endpoint: Int, probe: UInt64?) {
        self.endpoint = endpoint
        self.probe = probe
    }

    public var isProbe: Bool { probe != nil }
}

/// Where the next attempt goes.
public enum EndpointVerdict: Sendable, Equatable {
    case attempt(EndpointTicket)
    /// Every endpoint is ejected (or being probed): 503 `circuit-open` at once with `Retry-After: retryAfter`
    /// (whole seconds, at least 1); nothing is sent and no backoff waited. Not an attempt.
    case circuitOpen(retryAfter: Int)
}

/// `EndpointSet.choose`'s decision and the state changes made on the way.
public struct EndpointChoice: Sendable, Equatable {
    public var verdict: EndpointVerdict
    public var events: [EndpointEvent]

    public init(verdict: EndpointVerdict, events: [EndpointEvent] = []) {
        self.verdict = verdict
        self.events = events
    }
}

/// How one attempt ended, as far as its endpoint's health goes.
public enum EndpointOutcome: Sendable, Equatable {
    /// A response head that is not a `retry.on` condition.
    case success
    /// A `retry.on` condition: a listed status, a connect failure, a reset, a timeout.
    case failure
    /// Ended without telling anything about the endpoint: cancelled (a hedge that lost, a client that left).
    case abandoned
}

/// A change of one endpoint's state, for `backstop_endpoint_state`, `backstop_ejections_total` and the log.
public enum EndpointEvent: Sendable, Equatable {
    /// Ejected for `openFor`; `ejection` counts ejections in a row (1 the first time). Counted in
    /// `backstop_ejections_total`.
    case ejected(endpoint: Int, openFor: Duration, ejection: Int)
    /// An attempt took the endpoint's probe permit.
    case probing(endpoint: Int)
    /// The probe ended without an answer (cancelled): ejected again, the probe due at once, not counted as an
    /// ejection.
    case probeReleased(endpoint: Int)
    /// The probe succeeded: back in service, the doubling reset.
    case restored(endpoint: Int)
}

/// `backstop_endpoint_state`'s values.
public enum EndpointHealth: Int, Sendable, Equatable, CaseIterable {
    case healthy = 0
    case ejected = 1
    case probing = 2
}
