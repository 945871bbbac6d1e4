/// Everything the status page shows, gathered at one moment; `/status` (HTML) and `/status.json` both render this
/// one value, so they always state the same facts (docs/reference/operations.md#status-page). Never holds a secret:
/// token status is presence, expiry and refresh outcome only.
public struct StatusSnapshot: Sendable, Equatable, Encodable {
    /// When it was taken, seconds since the Unix epoch.
    public var generatedAt: Double
    public var version: String
    public var uptimeSeconds: Double
    public var ready: Bool
    public var draining: Bool
    public var inflightRequests: Int
    public var clientConnections: Int
    public var tunnelsOpen: Int
    /// The window the rates and ratios cover, in seconds.
    public var windowSeconds: Int
    public var upstreams: [UpstreamStatus]
    /// The tracing exporter's state; nil without `tracing`.
    public var tracing: TracingStatus?
    /// The last failures, newest first (at most `FailureLog.capacity`).
    public var failures: [FailureRecord]

    public init(
        generatedAt: Double, version: String, uptimeSeconds: Double, ready: Bool, draining: Bool,
        inflightRequests: Int, clientConnections: Int, tunnelsOpen: Int, windowSeconds: Int,
        upstreams: [UpstreamStatus], tracing: TracingStatus? = nil, failures: [FailureRecord]
    ) {
        self.generatedAt = generatedAt
        self.version = version
        self.uptimeSeconds = uptimeSeconds
        self.ready = ready
        self.draining = draining
        self.inflightRequests = inflightRequests
        self.clientConnections = clientConnections
        self.tunnelsOpen = tunnelsOpen
        self.windowSeconds = windowSeconds
        self.upstreams = upstreams
        self.tracing = tracing
        self.failures = failures
    }
}

/// One upstream: its traffic over the window, retry budget, circuit, endpoints and token.
public struct UpstreamStatus: Sendable, Equatable, Encodable {
    public var name: String
    /// Client requests answered per second over the window.
    public var requestsPerSecond: Double
    /// Answers that were not 5xx, over answers; nil when none was answered in the window.
    public var successRatio: Double?
    /// Attempts per answered request over the window; nil when none was answered.
    public var attemptsPerRequest: Double?
    public var retryBudget: RetryBudgetStatus
    /// `closed` while any endpoint takes requests; `open` when every endpoint is ejected (docs/reference/behaviour.md).
    public var circuit: CircuitState
    public var endpoints: [EndpointStatus]
    /// nil for an upstream without managed auth.
    public var token: TokenStatus?

    public init(
        name: String, requestsPerSecond: Double, successRatio: Double?, attemptsPerRequest: Double?,
        retryBudget: RetryBudgetStatus, circuit: CircuitState = .closed, endpoints: [EndpointStatus],
        token: TokenStatus? = nil
    ) {
        self.name = name
        self.requestsPerSecond = requestsPerSecond
        self.successRatio = successRatio
        self.attemptsPerRequest = attemptsPerRequest
        self.retryBudget = retryBudget
        self.circuit = circuit
        self.endpoints = endpoints
        self.token = token
    }
}

/// The circuit of an upstream as a whole.
public enum CircuitState: String, Sendable, Equatable, Encodable {
    case closed
    /// Some endpoint is being probed after an ejection.
    case halfOpen = "half-open"
    /// Every endpoint is ejected: requests fail fast with 503 `circuit-open`.
    case open
}

/// One endpoint of an upstream (today an upstream has one: its `url`).
public struct EndpointStatus: Sendable, Equatable, Encodable {
    public var url: String
    public var state: EndpointState
    /// Consecutive failed attempts counted towards ejection, when the upstream has a circuit.
    public var consecutiveFailures: Int?
    /// Seconds until an ejected endpoint is probed again.
    public var probeInSeconds: Double?

    public init(
        url: String, state: EndpointState = .healthy, consecutiveFailures: Int? = nil, probeInSeconds: Double? = nil
    ) {
        self.url = url
        self.state = state
        self.consecutiveFailures = consecutiveFailures
        self.probeInSeconds = probeInSeconds
    }
}

/// `backstop_endpoint_state`'s values: 0 healthy, 1 ejected, 2 probing.
public enum EndpointState: String, Sendable, Equatable, Encodable {
    case healthy, ejected, probing
}

/// What the retry budget allows now.
public struct RetryBudgetStatus: Sendable, Equatable, Encodable {
    /// Retries that may still be made in the budget's window.
    public var retriesLeft: Int
    public var ratio: Double
    public var minPerSecond: Double
    /// Retries refused for want of budget since start.
    public var exhaustedTotal: Int

    public init(retriesLeft: Int, ratio: Double, minPerSecond: Double, exhaustedTotal: Int) {
        self.retriesLeft = retriesLeft
        self.ratio = ratio
        self.minPerSecond = minPerSecond
        self.exhaustedTotal = exhaustedTotal
    }
}

/// A managed credential's state; never its value.
public struct TokenStatus: Sendable, Equatable, Encodable {
    /// `oauth2` or `static`.
    public var kind: String
    /// Whether a token is held now.
    public var present: Bool
    /// Seconds until it expires (negative: expired); nil when its expiry is unknown.
    public var expiresInSeconds: Double?
    public var lastRefresh: RefreshStatus?

    public init(kind: String, present: Bool, expiresInSeconds: Double? = nil, lastRefresh: RefreshStatus? = nil) {
        self.kind = kind
        self.present = present
        self.expiresInSeconds = expiresInSeconds
        self.lastRefresh = lastRefresh
    }
}

/// The last token refresh: when, and how it ended (`success`, `failure`, `adopted`).
public struct RefreshStatus: Sendable, Equatable, Encodable {
    public var at: Double
    public var outcome: String

    public init(at: Double, outcome: String) {
        self.at = at
        self.outcome = outcome
    }
}

/// The span exporter's counters.
public struct TracingStatus: Sendable, Equatable, Encodable {
    public var endpoint: String
    public var sampleRatio: Double
    public var exported: Int
    public var dropped: Int
    public var queued: Int

    public init(endpoint: String, sampleRatio: Double, exported: Int, dropped: Int, queued: Int) {
        self.endpoint = endpoint
        self.sampleRatio = sampleRatio
        self.exported = exported
        self.dropped = dropped
        self.queued = queued
    }
}

/// One request that failed: Backstop answered with an error, or the upstream's last answer was a 5xx.
public struct FailureRecord: Sendable, Equatable, Encodable {
    /// Seconds since the Unix epoch.
    public var at: Double
    public var upstream: String
    public var endpoint: String
    /// The status the client got.
    public var status: Int
    /// The error reason (`upstream-timeout`, `upstream-unreachable`, `upstream-status`…) and its detail.
    public var cause: String

    public init(at: Double, upstream: String, endpoint: String, status: Int, cause: String) {
        self.at = at
        self.upstream = upstream
        self.endpoint = endpoint
        self.status = status
        self.cause = cause
    }
}
