import BackstopCore
import BackstopTransport
import Logging
import NIOConcurrencyHelpers

/// One immutable view of the configuration and everything derived from it. Requests keep the snapshot they
/// started with; a reload swaps in a new one.
public final class ConfigSnapshot: Sendable {
    public let config: Config
    public let router: Router
    public let connectPolicy: ConnectPolicy
    public let upstreams: [UpstreamRuntime]
    /// The interception CA, when an upstream intercepts.
    public let intercept: InterceptAuthority?
    /// Who may use which upstream (`clients`, resolved); nil: every client may use every upstream.
    public let clients: ClientAccessPolicy?

    public init(
        config: Config, upstreams: [UpstreamRuntime], intercept: InterceptAuthority? = nil,
        clients: ClientAccessPolicy? = nil
    ) {
        self.intercept = intercept
        self.clients = clients
        self.config = config
        let router = Router(upstreams: config.upstreams, unmatched: config.unmatched)
        self.router = router
        self.connectPolicy = ConnectPolicy(config: config, router: router)
        self.upstreams = upstreams
    }
}

/// Per-upstream live state that outlives single requests: TLS options, the token source, the retry budget, the
/// endpoints' health.
public final class UpstreamRuntime: Sendable {
    public let config: UpstreamConfig
    /// The `tls` section, with the client certificate of `tls.client_cert_entry` as read at start or reload.
    public let tls: TransportTLSOptions
    /// `tls.client_cert_entry` is set but could not be read or used: requests get 502 `token-unavailable` rather
    /// than go out without the certificate (docs/reference/config.md#client-certificates).
    let clientCertificateUnusable: Bool
    let auth: AuthRuntime
    /// The header the credential goes in; nil when nothing is injected as a header value (no auth, SigV4).
    let credentialHeader: CredentialHeader?
    let retryPolicy: RetryPolicy
    /// `scheme://host[:port]` and the `Host` value of the first endpoint, computed once rather than per request.
    let origin: String
    let hostHeader: String
    /// The same for each endpoint, in config order: where an attempt given endpoint `i` goes.
    let endpointOrigins: [String]
    let endpointHostHeaders: [String]
    /// Shared by every request to this upstream (and kept across reloads while the budget settings stay).
    let budget: SharedRetryBudget
    /// Ejections, probes, requests in progress and time to head, shared by every request to this upstream (and kept
    /// across reloads that leave its endpoints and `circuit` as they were).
    public let health: UpstreamHealth

    /// `clientIdentity`: what `tls.client_cert_entry` holds (nil when the upstream has none). `health` defaults to a
    /// fresh one on the system clock whose metrics and log lines go nowhere (unit tests of other parts).
    init(
        config: UpstreamConfig, auth: AuthRuntime, budget: SharedRetryBudget? = nil,
        clientIdentity: Result<TransportClientIdentity, TokenClientCredentials.CredentialProblem>? = nil,
        health: UpstreamHealth? = nil
    ) {
        self.health =
            health
            ?? UpstreamHealth(
                upstream: config, clock: SystemClock(), metrics: OutageMetrics(),
                logger: Logger(label: "backstop", factory: { _ in SwiftLogNoOpLogHandler() }))
        self.config = config
        var tls = TransportTLSOptions(config.tls)
        if case .success(let identity) = clientIdentity { tls.clientIdentity = identity }
        self.tls = tls
        self.clientCertificateUnusable = if case .failure = clientIdentity { true } else { false }
        self.auth = auth
        self.credentialHeader = auth.injection.map {
            CredentialHeader(name: $0.header, scheme: $0.scheme, policy: $0.policy)
        }
        self.retryPolicy = RetryPolicy(config: config.retry, timeouts: config.timeouts)
        self.origin = config.url.origin
        self.hostHeader = config.url.hostHeader
        self.endpointOrigins = config.endpoints.map(\.origin)
        self.endpointHostHeaders = config.endpoints.map(\.hostHeader)
        if let budget, budget.config == config.retry.budget {
            self.budget = budget
        } else {
            self.budget = SharedRetryBudget(config.retry.budget)
        }
    }
}

/// One upstream's retry budget behind a lock (requests on every event loop draw from it).
final class SharedRetryBudget: Sendable {
    let config: BudgetConfig
    private let budget: NIOLockedValueBox<RetryBudget>

    init(_ config: BudgetConfig) {
        self.config = config
        self.budget = NIOLockedValueBox(RetryBudget(config))
    }

    func withBudget<T>(_ body: (inout RetryBudget) -> T) -> T { budget.withLockedValue { body(&$0) } }
}

/// How requests to one upstream are authenticated.
enum AuthRuntime: Sendable {
    case none
    case staticToken(StaticTokenSource, StaticAuthConfig)
    case oauth2(TokenManager, OAuth2Config)
    /// Each attempt signed (docs/reference/aws-sigv4.md); nothing is injected as a header value.
    case awsSigV4(SigV4Source)

    /// The header name, scheme and client-header policy, when a credential is injected as a header value.
    var injection: (header: String, scheme: String, policy: ClientAuthHeaderPolicy)? {
        switch self {
        case .none, .awsSigV4: return nil
        case .staticToken(_, let c): return (c.header, c.scheme, c.clientAuthHeader)
        case .oauth2(_, let c): return (c.header, c.scheme, c.clientAuthHeader)
        }
    }

    /// What the request machines need to know of it (`ExchangeStateMachine`, `UpgradeHandshake`): whether a
    /// response status means "refresh the token and replay".
    var credentialKind: ExchangeStateMachine.CredentialKind {
        switch self {
        case .staticToken, .awsSigV4: .staticValue
        case .oauth2(_, let config): .oauth2(refreshOn: config.refreshOn)
        case .none: .none
        }
    }
}
