// The typed, immutable configuration model (docs/reference/config.md). Parsing and validation live in
// ConfigLoader / ConfigValidator; everything downstream reads only these values.

/// A value kept beside a config setting for messages only (where it was written): two configs that differ only in it
/// are equal, so a reload of a file whose lines merely moved changes nothing
/// (docs/reference/operations.md#signals-reload-and-drain).
@propertyWrapper
public struct NotCompared<Value: Sendable>: Sendable, Equatable {
    public var wrappedValue: Value
    public init(wrappedValue: Value) { self.wrappedValue = wrappedValue }
    public static func == (lhs: Self, rhs: Self) -> Bool { true }
}

/// A place in a config file, for error messages (1-based line and column).
public struct SourceLocation: Sendable, Equatable, Hashable, CustomStringConvertible {
    public var file: String
    public var line: Int
    public var column: Int
    public init(file: String, line: Int, column: Int) {
        self.file = file
        self.line = line
        self.column = column
    }
    public var description: String { "\(file):\(line):\(column)" }
}

/// One config problem, printed by `backstop check` as `FILE:LINE:COLUMN: message`.
public struct ConfigError: Error, Sendable, Equatable, CustomStringConvertible {
    public var location: SourceLocation
    public var message: String
    public init(location: SourceLocation, message: String) {
        self.location = location
        self.message = message
    }
    /// One line whatever the message quotes: a value with a line break or a terminal escape (written in the file, or
    /// from a `${NAME}` expansion) is shown escaped (`DisplayText`).
    public var description: String { DisplayText.oneLine("\(location): \(message)") }
}

extension [ConfigError] {
    /// By position in the file (line, then column); problems at the same node keep the order they were found in.
    public func inFileOrder() -> [ConfigError] {
        enumerated().sorted {
            ($0.element.location.line, $0.element.location.column, $0.offset)
                < ($1.element.location.line, $1.element.location.column, $1.offset)
        }.map(\.element)
    }
}

/// Every problem found in one config file (parsing and validation report all of them, not just the first).
public struct ConfigErrors: Error, Sendable, Equatable, CustomStringConvertible {
    public var errors: [ConfigError]
    /// What could be read of the config despite the errors (sections that failed keep their defaults), when the file
    /// parsed as YAML at all: `check` also looks at the files it names, so one run reports every problem.
    public var partial: Config?
    public init(_ errors: [ConfigError], partial: Config? = nil) {
        self.errors = errors
        self.partial = partial
    }
    public var description: String { errors.map(\.description).joined(separator: "\n") }
}

/// The whole validated configuration: one immutable snapshot, swapped atomically on reload.
public struct Config: Sendable, Equatable {
    public var version: Int
    /// Absolute path of the file this came from ("<memory>" when parsed from a string).
    public var sourceFile: String
    public var listeners: [ListenerConfig]
    public var admin: AdminConfig?
    public var log: LogConfig
    public var keychain: KeychainConfig?
    public var limits: Limits
    public var unmatched: UnmatchedPolicy
    public var upstreams: [UpstreamConfig]
    /// Blind `CONNECT` tunnels; nil: none.
    public var tunnels: TunnelsConfig?
    /// The local CA for upstreams with `intercept: true`; nil when none intercepts.
    public var intercept: InterceptConfig?
    /// Where oauth2 tokens live: the keychain (default) or a store shared by a fleet.
    public var tokenStore: TokenStoreConfig = .keychain
    /// OpenTelemetry spans exported over OTLP/HTTP; nil: no tracing (a client's `traceparent` passes through).
    public var tracing: TracingConfig?
    /// Which local clients may use which upstreams (docs/reference/config.md#clients); nil: every client may use
    /// every upstream.
    public var clients: [ClientConfig]?
    /// Every keychain entry the identity settings name (client certificates, signing keys, secrets, AWS keys,
    /// proxy credentials), with what it must hold and where it was written: what `check --online` reads.
    public var keychainReferences: [KeychainReference] = []
    /// Every CA bundle the config names (upstream `tls.ca_file`, `auth.tls.ca_file`, `token_store.ca_file`), with
    /// where its value was written: what `check` finds readable or not.
    public var caFileReferences: [FileReference] = []
    /// Every unix socket a listener (or the admin listener) binds, with where its address was written: `check`
    /// finds whether its directory is there for `run` to create the socket in.
    public var unixSocketReferences: [FileReference] = []
    /// Where spooled bodies and queued deliveries are kept; nil: no spool.
    public var spool: SpoolConfig?

    public init(
        version: Int = 1, sourceFile: String = "<memory>", listeners: [ListenerConfig] = [], admin: AdminConfig? = nil,
        log: LogConfig = LogConfig(), keychain: KeychainConfig? = nil, limits: Limits = Limits(),
        unmatched: UnmatchedPolicy = .reject, upstreams: [UpstreamConfig] = [], tunnels: TunnelsConfig? = nil,
        intercept: InterceptConfig? = nil
    ) {
        self.version = version
        self.sourceFile = sourceFile
        self.listeners = listeners
        self.admin = admin
        self.log = log
        self.keychain = keychain
        self.limits = limits
        self.unmatched = unmatched
        self.upstreams = upstreams
        self.tunnels = tunnels
        self.intercept = intercept
    }
}

/// Where a listener binds.
public enum ListenAddress: Sendable, Equatable, Hashable, CustomStringConvertible {
    /// `host` is as written without brackets (`127.0.0.1`, `::1`, `localhost`, `0.0.0.0`).
    case tcp(host: String, port: Int)
    /// Absolute path of a unix domain socket.
    case unix(path: String)

    /// False for port 0 (the kernel picks a free port each time): two such listeners never clash.
    public var bindsFixedAddress: Bool {
        if case .tcp(_, 0) = self { return false }
        return true
    }

    /// Whether binding both would fail, however each is written: the same port and the same address
    /// (`[::1]` and `[0:0:0:0:0:0:0:1]`), `localhost` beside a loopback address, or a wildcard (`0.0.0.0`, `::`)
    /// beside an address it covers; the same socket path. Port 0 clashes with nothing.
    public func clashes(with other: ListenAddress) -> Bool {
        switch (self, other) {
        case (.unix(let a), .unix(let b)): return a == b
        case (.tcp(let a, let p), .tcp(let b, let q)):
            guard p == q, p != 0 else { return false }
            return Self.bindTargets(a).contains { x in Self.bindTargets(b).contains { y in Self.overlap(x, y) } }
        default: return false
        }
    }

    /// The addresses a host binds: its literal's bytes, or both loopbacks for `localhost` (resolved at bind time).
    private static func bindTargets(_ host: String) -> [[UInt8]] {
        if host.lowercased() == "localhost" { return [[127, 0, 0, 1], Array(repeating: 0, count: 15) + [1]] }
        return IPAddressParser.parse(host).map { [$0] } ?? [Array(host.lowercased().utf8)]
    }

    private static func overlap(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        if a == b { return true }
        let anyV4: [UInt8] = [0, 0, 0, 0]
        let anyV6 = [UInt8](repeating: 0, count: 16)
        // `::` takes IPv4 too (a dual-stack socket); `0.0.0.0` every IPv4 address.
        if a == anyV6 || b == anyV6 { return true }
        if (a == anyV4 && b.count == 4) || (b == anyV4 && a.count == 4) { return true }
        return false
    }

    public var description: String {
        switch self {
        case .tcp(let host, let port): host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)"
        case .unix(let path): "unix:\(path)"
        }
    }
}

/// An IPv4 or IPv6 network in CIDR notation (`10.0.0.0/8`, `fd00::/8`).
public struct CIDR: Sendable, Equatable, Hashable, CustomStringConvertible {
    /// Network address bytes: 4 for IPv4, 16 for IPv6.
    public var address: [UInt8]
    public var prefixLength: Int
    public init(address: [UInt8], prefixLength: Int) {
        self.address = address
        self.prefixLength = prefixLength
    }
    public var description: String {
        if address.count == 4 { return address.map(String.init).joined(separator: ".") + "/\(prefixLength)" }
        var groups: [String] = []
        for i in stride(from: 0, to: 16, by: 2) {
            groups.append(String((UInt16(address[i]) << 8) | UInt16(address[i + 1]), radix: 16))
        }
        return groups.joined(separator: ":") + "/\(prefixLength)"
    }
}

/// One `listen` entry.
public struct ListenerConfig: Sendable, Equatable, Hashable {
    public var address: ListenAddress
    public var allowRemote: Bool
    /// Remote networks allowed to connect. Loopback clients are always allowed; others need a match here.
    public var allowClients: [CIDR]
    public init(address: ListenAddress, allowRemote: Bool = false, allowClients: [CIDR] = []) {
        self.address = address
        self.allowRemote = allowRemote
        self.allowClients = allowClients
    }
}

/// The admin listener (`/healthz`, `/readyz`, `/metrics`).
public struct AdminConfig: Sendable, Equatable {
    public var address: ListenAddress
    /// Whether a non-loopback admin address was explicitly allowed (`admin.allow_remote: true`).
    public var allowRemote: Bool
    /// Remote networks allowed to connect, as for proxy listeners; loopback clients are always allowed.
    public var allowClients: [CIDR]
    public init(address: ListenAddress, allowRemote: Bool = false, allowClients: [CIDR] = []) {
        self.address = address
        self.allowRemote = allowRemote
        self.allowClients = allowClients
    }
}

/// Log verbosity, in increasing severity.
public enum LogLevel: String, Sendable, Equatable, CaseIterable, Comparable {
    case trace, debug, info, notice, warning, error
    public static func < (lhs: LogLevel, rhs: LogLevel) -> Bool {
        allCases.firstIndex(of: lhs)! < allCases.firstIndex(of: rhs)!
    }
}

/// Log line format.
public enum LogFormat: String, Sendable, Equatable, CaseIterable {
    case logfmt, json
}

/// The `log` section.
public struct LogConfig: Sendable, Equatable {
    public var level: LogLevel
    public var format: LogFormat
    public var accessLog: Bool
    public init(level: LogLevel = .info, format: LogFormat = .logfmt, accessLog: Bool = true) {
        self.level = level
        self.format = format
        self.accessLog = accessLog
    }
}

/// Where the keychain's key comes from.
public enum KeySource: Sendable, Equatable {
    /// An absolute path to a key file.
    case file(path: String)
    /// A systemd credential name, read from `$CREDENTIALS_DIRECTORY/<name>`.
    case credential(name: String)
}

/// The `keychain` section.
public struct KeychainConfig: Sendable, Equatable {
    /// Absolute path of the keychain file.
    public var path: String
    public var key: KeySource
    /// Where `key_file`/`key_credential` was written, for errors found later (unreadable key file, bad mode).
    @NotCompared public var keyLocation: SourceLocation?
    /// Where `path` was written.
    @NotCompared public var pathLocation: SourceLocation?
    public init(
        path: String, key: KeySource, keyLocation: SourceLocation? = nil, pathLocation: SourceLocation? = nil
    ) {
        self.path = path
        self.key = key
        self.keyLocation = keyLocation
        self.pathLocation = pathLocation
    }
}

/// The `limits` section.
public struct Limits: Sendable, Equatable {
    public var maxRequestBody: Int
    public var retryBuffer: Int
    public var maxHeaderBytes: Int
    public var clientIdleTimeout: Duration
    public var maxConnections: Int
    /// A request head must be complete this long after its first byte (408), on every listener.
    public var headerTimeout: Duration
    /// All request bodies kept for retries together; a body that does not fit streams without being kept.
    public var bufferMemory: Int
    public init(
        maxRequestBody: Int = 8 << 20, retryBuffer: Int = 1 << 20, maxHeaderBytes: Int = 64 << 10,
        clientIdleTimeout: Duration = .seconds(60), maxConnections: Int = 4096, headerTimeout: Duration = .seconds(10),
        bufferMemory: Int = 256 << 20
    ) {
        self.maxRequestBody = maxRequestBody
        self.retryBuffer = retryBuffer
        self.maxHeaderBytes = maxHeaderBytes
        self.clientIdleTimeout = clientIdleTimeout
        self.maxConnections = maxConnections
        self.headerTimeout = headerTimeout
        self.bufferMemory = bufferMemory
    }
}

/// What to do with a request no upstream matches.
public enum UnmatchedPolicy: String, Sendable, Equatable {
    /// 403 `no-route`.
    case reject
    /// Forward as is, with no retry and no auth.
    case passthrough
}

/// One `upstreams` entry.
public struct UpstreamConfig: Sendable, Equatable {
    public var name: String
    public var match: MatchConfig
    /// Where requests go, in `balance` order; never empty. Every endpoint has the same scheme and base path (the
    /// loader checks it), so what is sent does not depend on which endpoint gets it (docs/reference/config.md#endpoints).
    public var endpoints: [UpstreamURL]
    /// How an attempt picks among `endpoints`.
    public var balance: BalanceMode
    /// Ejection of failing endpoints and the in-flight limit.
    public var circuit: CircuitConfig
    /// Extra copies of slow idempotent requests.
    public var hedge: HedgeConfig
    public var tls: TLSConfig
    public var timeouts: Timeouts
    public var retry: RetryConfig
    public var auth: AuthConfig
    /// `CONNECT` to one of `match.hosts` is answered by terminating the client's TLS with a leaf of the local CA
    /// and handling the requests inside as requests for this upstream (docs/reference/https-clients.md).
    public var intercept: Bool
    /// Whether requests with `Upgrade` (WebSocket) are forwarded (`upgrades`, default true); false answers them
    /// with 400 `upgrade-not-allowed`.
    public var upgrades: Bool = true
    /// `direct` (the client waits) or `queue` (stored, answered 202, delivered in the background).
    public var delivery: DeliveryMode = .direct
    /// How queued deliveries to this upstream are paced and when they give up (`delivery: queue` only).
    public var queue = QueueConfig()
    /// Where this upstream's entry starts in the file.
    @NotCompared public var location: SourceLocation?

    /// The first endpoint: all of them for an upstream written with `url`. Everything that does not choose an
    /// endpoint per attempt (routing, redirect rewriting, the base path, the scheme) may read it, since every
    /// endpoint shares its scheme and base path. Setting it replaces every endpoint (`url: X` means `endpoints: [X]`).
    public var url: UpstreamURL {
        get { endpoints[0] }
        set { endpoints = [newValue] }
    }

    public init(
        name: String, match: MatchConfig, url: UpstreamURL, tls: TLSConfig = TLSConfig(),
        timeouts: Timeouts = Timeouts(), retry: RetryConfig = RetryConfig(), auth: AuthConfig = .none,
        intercept: Bool = false, location: SourceLocation? = nil
    ) {
        self.init(
            name: name, match: match, endpoints: [url], tls: tls, timeouts: timeouts, retry: retry, auth: auth,
            intercept: intercept, location: location)
    }

    /// `endpoints` must not be empty.
    public init(
        name: String, match: MatchConfig, endpoints: [UpstreamURL], balance: BalanceMode = .failover,
        circuit: CircuitConfig = CircuitConfig(), hedge: HedgeConfig = HedgeConfig(), tls: TLSConfig = TLSConfig(),
        timeouts: Timeouts = Timeouts(), retry: RetryConfig = RetryConfig(), auth: AuthConfig = .none,
        intercept: Bool = false, location: SourceLocation? = nil
    ) {
        precondition(!endpoints.isEmpty, "an upstream has at least one endpoint")
        self.name = name
        self.match = match
        self.endpoints = endpoints
        self.balance = balance
        self.circuit = circuit
        self.hedge = hedge
        self.tls = tls
        self.timeouts = timeouts
        self.retry = retry
        self.auth = auth
        self.intercept = intercept
        self.location = location
    }
}

/// `balance`: which endpoint an attempt goes to.
public enum BalanceMode: String, Sendable, Equatable, CaseIterable {
    /// The first healthy endpoint in the order written: the others are standbys.
    case failover
    /// Each healthy endpoint in turn.
    case roundRobin = "round_robin"
}

/// `circuit`: when an endpoint stops getting requests, and how many requests one upstream may have in progress.
public struct CircuitConfig: Sendable, Equatable {
    /// Consecutive failed attempts (a `retry.on` condition) that eject an endpoint; 0 never ejects.
    public var failures: Int
    /// The first ejection's length; each consecutive ejection doubles it, up to `maxOpenFor`.
    public var openFor: Duration
    /// Requests in progress to the upstream; one more is answered 503 `upstream-overloaded` at once.
    public var maxInflight: Int

    /// The longest an ejection lasts, however often it doubled.
    public static let maxOpenFor: Duration = .seconds(300)

    public init(failures: Int = 5, openFor: Duration = .seconds(30), maxInflight: Int = 1024) {
        self.failures = failures
        self.openFor = openFor
        self.maxInflight = maxInflight
    }
}

/// `hedge.after`: how long an attempt may go without a response head before a copy is sent.
public enum HedgeAfter: Sendable, Equatable {
    case fixed(Duration)
    /// The upstream's observed 95th-percentile time to response head over the last minute (`HeadLatencyWindow`).
    case p95
}

/// `hedge`: extra copies of a slow idempotent request.
public struct HedgeConfig: Sendable, Equatable {
    public var after: HedgeAfter
    /// Copies in flight at once beyond the first attempt; 0 turns hedging off.
    public var max: Int
    /// Uppercased method names; only idempotent ones (the loader checks it).
    public var methods: Set<String>

    public static let defaultMethods: Set<String> = ["GET", "HEAD", "OPTIONS"]

    public init(
        after: HedgeAfter = .fixed(.milliseconds(250)), max: Int = 0,
        methods: Set<String> = HedgeConfig.defaultMethods
    ) {
        self.after = after
        self.max = max
        self.methods = methods
    }
}

/// Which requests an upstream takes.
public struct MatchConfig: Sendable, Equatable {
    /// Lowercased host patterns: exact (`api.example.com`) or one leading wildcard label (`*.api.example.com`).
    public var hosts: [String]
    /// Origin-form path prefix, starting with `/`, without a trailing `/` (except the root itself).
    public var pathPrefix: String?
    /// Whether the prefix is removed before joining with the upstream base path (default true when a prefix is set).
    public var stripPrefix: Bool
    /// Where each of `hosts` (same order) and `pathPrefix` were written, for overlap errors.
    @NotCompared public var hostLocations: [SourceLocation] = []
    @NotCompared public var pathPrefixLocation: SourceLocation?
    public init(hosts: [String] = [], pathPrefix: String? = nil, stripPrefix: Bool = true) {
        self.hosts = hosts
        self.pathPrefix = pathPrefix
        self.stripPrefix = stripPrefix
    }
}

/// An upstream's base URL, split up.
public struct UpstreamURL: Sendable, Equatable {
    /// `http` or `https`.
    public var scheme: String
    /// Lowercased host, without brackets for IPv6.
    public var host: String
    /// Explicit port, if written.
    public var port: Int?
    /// Base path without a trailing `/`; empty for the root.
    public var basePath: String
    public init(scheme: String, host: String, port: Int? = nil, basePath: String = "") {
        self.scheme = scheme
        self.host = host
        self.port = port
        self.basePath = basePath
    }
    /// The port requests go to.
    public var effectivePort: Int { port ?? (scheme == "https" ? 443 : 80) }
    /// `host[:port]` as it goes in a `Host` header (port omitted when it is the scheme's default).
    public var hostHeader: String {
        let h = host.contains(":") ? "[\(host)]" : host
        if let port, port != (scheme == "https" ? 443 : 80) { return "\(h):\(port)" }
        return h
    }
    /// `scheme://host[:port]` with no path.
    public var origin: String { "\(scheme)://\(hostHeader)" }
    /// `scheme://host:port` with the port always written: what makes two endpoints the same (the base path does
    /// not), and the `endpoint` label of metrics and access lines.
    public var endpointKey: String {
        "\(scheme)://\(host.contains(":") ? "[\(host)]" : host):\(effectivePort)"
    }
}

/// The `tls` section of an upstream.
public struct TLSConfig: Sendable, Equatable {
    /// Absolute path of a CA bundle; nil means the system default.
    public var caFile: String?
    public var insecureSkipVerify: Bool
    /// Offer HTTP/2 by ALPN (`tls.http2`); false (the default) keeps the upstream connections to HTTP/1.1.
    public var http2: Bool
    /// Keychain entry holding the client certificate chain and its private key (PEM) presented to the upstream.
    public var clientCertEntry: String?
    public init(
        caFile: String? = nil, insecureSkipVerify: Bool = false, http2: Bool = false, clientCertEntry: String? = nil
    ) {
        self.caFile = caFile
        self.insecureSkipVerify = insecureSkipVerify
        self.http2 = http2
        self.clientCertEntry = clientCertEntry
    }
}

/// The `timeouts` section of an upstream.
public struct Timeouts: Sendable, Equatable {
    public var connect: Duration
    /// One attempt, until the response head.
    public var perTry: Duration
    /// The whole request including backoff sleeps.
    public var total: Duration
    /// A response body that makes no progress this long is aborted (also bounds a retried response that is
    /// left to finish so its connection can be reused).
    public var idle: Duration
    public init(
        connect: Duration = .seconds(2), perTry: Duration = .seconds(10), total: Duration = .seconds(30),
        idle: Duration = .seconds(60)
    ) {
        self.connect = connect
        self.perTry = perTry
        self.total = total
        self.idle = idle
    }
}

/// A condition in `retry.on`.
public enum RetryCondition: Sendable, Equatable, Hashable, CustomStringConvertible {
    case connectFailure
    case reset
    case timeout
    case status(Int)
    public var description: String {
        switch self {
        case .connectFailure: "connect-failure"
        case .reset: "reset"
        case .timeout: "timeout"
        case .status(let code): String(code)
        }
    }
}

/// Backoff strategies.
public enum BackoffStrategy: String, Sendable, Equatable, CaseIterable {
    case constant, exponential, fibonacci, decorrelated
}

/// Jitter modes applied to a backoff delay.
public enum JitterMode: String, Sendable, Equatable, CaseIterable {
    case none, full, equal
}

/// `retry.backoff`.
public struct BackoffConfig: Sendable, Equatable {
    public var strategy: BackoffStrategy
    public var base: Duration
    public var max: Duration
    public var multiplier: Double
    public var jitter: JitterMode
    public init(
        strategy: BackoffStrategy = .exponential, base: Duration = .milliseconds(100), max: Duration = .seconds(10),
        multiplier: Double = 2, jitter: JitterMode = .full
    ) {
        self.strategy = strategy
        self.base = base
        self.max = max
        self.multiplier = multiplier
        self.jitter = jitter
    }
}

/// `retry.retry_after`.
public struct RetryAfterConfig: Sendable, Equatable {
    public var honor: Bool
    public var max: Duration
    public init(honor: Bool = true, max: Duration = .seconds(60)) {
        self.honor = honor
        self.max = max
    }
}

/// `retry.budget`.
public struct BudgetConfig: Sendable, Equatable {
    public var ratio: Double
    public var minPerSecond: Double
    public init(ratio: Double = 0.2, minPerSecond: Double = 10) {
        self.ratio = ratio
        self.minPerSecond = minPerSecond
    }
}

/// The `retry` section of an upstream.
public struct RetryConfig: Sendable, Equatable {
    /// Total attempts including the first; 1 disables retries.
    public var attempts: Int
    public var on: Set<RetryCondition>
    /// Uppercased method names.
    public var methods: Set<String>
    /// Header whose presence makes a POST/PATCH count as idempotent; nil disables that.
    public var retryNonIdempotentWithKey: String?
    public var backoff: BackoffConfig
    public var retryAfter: RetryAfterConfig
    public var budget: BudgetConfig
    /// An attempt that failed for want of a usable network also ends its backoff when the host's network changes
    /// (a link up, an address or route added): `retry.on_network_change`.
    public var onNetworkChange: Bool

    public static let defaultOn: Set<RetryCondition> = [
        .connectFailure, .reset, .timeout, .status(429), .status(502), .status(503), .status(504),
    ]
    /// RFC 9110 §9.2.2 idempotent methods.
    public static let defaultMethods: Set<String> = ["GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"]

    public init(
        attempts: Int = 3, on: Set<RetryCondition> = RetryConfig.defaultOn,
        methods: Set<String> = RetryConfig.defaultMethods, retryNonIdempotentWithKey: String? = "Idempotency-Key",
        backoff: BackoffConfig = BackoffConfig(), retryAfter: RetryAfterConfig = RetryAfterConfig(),
        budget: BudgetConfig = BudgetConfig(), onNetworkChange: Bool = true
    ) {
        self.attempts = attempts
        self.onNetworkChange = onNetworkChange
        self.on = on
        self.methods = methods
        self.retryNonIdempotentWithKey = retryNonIdempotentWithKey
        self.backoff = backoff
        self.retryAfter = retryAfter
        self.budget = budget
    }
}

/// The `auth` section of an upstream.
public enum AuthConfig: Sendable, Equatable {
    case none
    case staticToken(StaticAuthConfig)
    case oauth2(OAuth2Config)
    /// Every attempt signed with AWS Signature Version 4.
    case awsSigV4(AWSSigV4Config)
}

/// What to do with the client's own auth header on an auth-managed upstream.
public enum ClientAuthHeaderPolicy: String, Sendable, Equatable {
    case replace, keep
}

/// `auth: {type: static, ...}`: a keychain entry injected as is.
public struct StaticAuthConfig: Sendable, Equatable {
    public var entry: String
    public var header: String
    public var scheme: String
    public var clientAuthHeader: ClientAuthHeaderPolicy
    public init(
        entry: String, header: String = "Authorization", scheme: String = "Bearer",
        clientAuthHeader: ClientAuthHeaderPolicy = .replace
    ) {
        self.entry = entry
        self.header = header
        self.scheme = scheme
        self.clientAuthHeader = clientAuthHeader
    }
}

/// OAuth2 grant used to obtain tokens.
public enum OAuth2Grant: String, Sendable, Equatable {
    case refreshToken = "refresh_token"
    case clientCredentials = "client_credentials"
}

/// Token request body encoding.
public enum TokenRequestFormat: String, Sendable, Equatable {
    case form, json
}

/// JSON field names in a token response.
public struct TokenFields: Sendable, Equatable {
    public var accessToken: String
    public var refreshToken: String
    public var expiresIn: String
    public init(
        accessToken: String = "access_token", refreshToken: String = "refresh_token",
        expiresIn: String = "expires_in"
    ) {
        self.accessToken = accessToken
        self.refreshToken = refreshToken
        self.expiresIn = expiresIn
    }
}

/// `auth.tls`: the token endpoint's own TLS settings. Verification is always on; the upstream's `tls` never
/// applies to the token endpoint (it receives the client secret and refresh token).
public struct TokenEndpointTLS: Sendable, Equatable {
    /// Absolute path of a CA bundle; nil means the system default.
    public var caFile: String?
    /// Keychain entry holding the client certificate chain and key for mutual TLS with the token endpoint
    /// (RFC 8705; needed by `client_auth: tls_client_auth`).
    public var clientCertEntry: String?
    public init(caFile: String? = nil, clientCertEntry: String? = nil) {
        self.caFile = caFile
        self.clientCertEntry = clientCertEntry
    }
}

/// How the client authenticates to the token endpoint (`auth.client_auth`; OpenID Connect Core §9 names).
public enum OAuth2ClientAuth: String, Sendable, Equatable, CaseIterable {
    /// `client_id` and `client_secret` in the request body (the default; with no secret, a public client).
    case clientSecretPost = "client_secret_post"
    /// `Authorization: Basic` with the form-urlencoded id and secret (RFC 6749 §2.3.1).
    case clientSecretBasic = "client_secret_basic"
    /// A JWT signed with `client_key_entry`, new for every token request (RFC 7523 §2.2).
    case privateKeyJWT = "private_key_jwt"
    /// The client certificate of `auth.tls.client_cert_entry` (RFC 8705 §2), `client_id` in the body.
    case tlsClientAuth = "tls_client_auth"
}

/// `auth: {type: oauth2, ...}`.
public struct OAuth2Config: Sendable, Equatable {
    public var tokenURL: String
    public var tls: TokenEndpointTLS
    public var grant: OAuth2Grant
    public var requestFormat: TokenRequestFormat
    public var clientID: String?
    public var clientSecretEntry: String?
    public var clientAuth: OAuth2ClientAuth = .clientSecretPost
    /// `private_key_jwt`: keychain entry holding the PEM private key that signs assertions (P-256 → ES256,
    /// RSA → RS256).
    public var clientKeyEntry: String?
    /// `private_key_jwt`: the assertion header's `kid`.
    public var clientKeyID: String?
    public var scope: String?
    public var keychainPrefix: String
    public var fields: TokenFields
    public var header: String
    public var scheme: String
    public var refreshOn: Set<Int>
    public var refreshAhead: Duration
    public var clientAuthHeader: ClientAuthHeaderPolicy
    public init(
        tokenURL: String, grant: OAuth2Grant = .refreshToken, requestFormat: TokenRequestFormat = .form,
        clientID: String? = nil, clientSecretEntry: String? = nil, scope: String? = nil, keychainPrefix: String,
        fields: TokenFields = TokenFields(), header: String = "Authorization", scheme: String = "Bearer",
        refreshOn: Set<Int> = [401], refreshAhead: Duration = .seconds(60),
        clientAuthHeader: ClientAuthHeaderPolicy = .replace, tls: TokenEndpointTLS = TokenEndpointTLS()
    ) {
        self.tokenURL = tokenURL
        self.tls = tls
        self.grant = grant
        self.requestFormat = requestFormat
        self.clientID = clientID
        self.clientSecretEntry = clientSecretEntry
        self.scope = scope
        self.keychainPrefix = keychainPrefix
        self.fields = fields
        self.header = header
        self.scheme = scheme
        self.refreshOn = refreshOn
        self.refreshAhead = refreshAhead
        self.clientAuthHeader = clientAuthHeader
    }
}

/// `auth: {type: aws_sigv4, ...}` (docs/reference/config.md#aws-sigv4).
public struct AWSSigV4Config: Sendable, Equatable {
    public var region: String
    public var service: String
    public var accessKeyEntry: String
    public var secretKeyEntry: String
    /// Temporary credentials: sent as `X-Amz-Security-Token` and signed.
    public var sessionTokenEntry: String?
    public var payload: AWSPayloadSigning
    public init(
        region: String, service: String, accessKeyEntry: String, secretKeyEntry: String,
        sessionTokenEntry: String? = nil, payload: AWSPayloadSigning = .signed
    ) {
        self.region = region
        self.service = service
        self.accessKeyEntry = accessKeyEntry
        self.secretKeyEntry = secretKeyEntry
        self.sessionTokenEntry = sessionTokenEntry
        self.payload = payload
    }
}

/// Whether a SigV4 signature covers the request body.
public enum AWSPayloadSigning: String, Sendable, Equatable, CaseIterable {
    /// The body's SHA-256 is signed, so the body must be buffered whole before the first byte goes out.
    case signed
    /// `UNSIGNED-PAYLOAD` (S3 style): bodies stream.
    case unsigned
}

/// One `clients` entry: who the client is, and which upstreams it may use.
public struct ClientConfig: Sendable, Equatable {
    /// `[a-z0-9_-]+`, unique; named in the access line.
    public var name: String
    public var match: ClientMatch
    public var upstreams: ClientUpstreams
    /// Where its `match` value was written: what a problem found on the host (a user that does not exist) names.
    @NotCompared public var location: SourceLocation?
    public init(name: String, match: ClientMatch, upstreams: ClientUpstreams, location: SourceLocation? = nil) {
        self.name = name
        self.match = match
        self.upstreams = upstreams
        self.location = location
    }
}

/// How a `clients` entry recognises its client.
public enum ClientMatch: Sendable, Equatable {
    /// The peer's user: a unix-socket client's `SO_PEERCRED`, or a loopback TCP client's socket owner.
    case unixUser(UnixPrincipal)
    /// A group the peer's user is in (primary or supplementary).
    case unixGroup(UnixPrincipal)
    /// `Proxy-Authorization: Basic` equal to the keychain entry's `user:password`.
    case proxyAuth(entry: String)
}

/// A user or group as written: a name (looked up on the host) or a numeric id.
public enum UnixPrincipal: Sendable, Equatable, Hashable, CustomStringConvertible {
    case name(String)
    case id(UInt32)
    public var description: String {
        switch self {
        case .name(let name): name
        case .id(let id): String(id)
        }
    }
}

/// The upstreams a client entry may use.
public enum ClientUpstreams: Sendable, Equatable {
    /// `*`: every upstream, and requests that reach none (passthrough, blind tunnels).
    case all
    /// These upstream names only.
    case only([String])

    public func allows(_ upstream: String) -> Bool {
        switch self {
        case .all: true
        case .only(let names): names.contains(upstream)
        }
    }
}

/// A keychain entry the config names, what it must hold, and where it was written (`check --online`).
public struct KeychainReference: Sendable, Equatable {
    /// What the entry must hold.
    public enum Content: Sendable, Equatable {
        /// A PEM certificate chain followed by its private key (EC P-256/P-384 or RSA).
        case clientCertificate
        /// A PEM private key that can sign `private_key_jwt` assertions (P-256 or RSA of at least 2048 bits).
        case assertionSigningKey
        /// `user:password` for `Proxy-Authorization: Basic`.
        case proxyCredentials
        /// Any non-empty secret (a client secret, sent in a form body).
        case secret
        /// A value Backstop sends as (part of) a header value or signs with, read as the daemon reads it (static
        /// auth's `entry`, the AWS keys and session token): non-empty, and no control character — a CR or LF would
        /// inject header lines, so the daemon refuses it (502 `token-unavailable`).
        case headerValue
    }

    public var entry: String
    public var content: Content
    /// The config key that names it, for messages (`upstream 'api': auth.client_key_entry`).
    public var key: String
    public var location: SourceLocation
    public init(entry: String, content: Content, key: String, location: SourceLocation) {
        self.entry = entry
        self.content = content
        self.key = key
        self.location = location
    }
}

/// A file the config names, for `check`: its absolute path, the key that names it (`upstream 'api': tls.ca_file`) and
/// where its value was written.
public struct FileReference: Sendable, Equatable {
    public var path: String
    public var key: String
    public var location: SourceLocation
    public init(path: String, key: String, location: SourceLocation) {
        self.path = path
        self.key = key
        self.location = location
    }
}

/// One `tunnels.allow` entry: a host pattern (exact name, `*.` + name, or IP literal) and one port.
public struct TunnelPattern: Sendable, Equatable, Hashable, CustomStringConvertible {
    /// Lowercased, as `match.hosts` patterns; IPv6 literals without brackets.
    public var host: String
    public var port: Int
    public init(host: String, port: Int) {
        self.host = host
        self.port = port
    }
    public var description: String { (host.contains(":") ? "[\(host)]" : host) + ":\(port)" }
}

/// The `tunnels` section: which `CONNECT` targets get a blind tunnel, and which resolved addresses never do.
public struct TunnelsConfig: Sendable, Equatable {
    public var allow: [TunnelPattern]
    /// Checked on every address a tunnel's host resolves to (IPv4-mapped IPv6 judged as IPv4).
    public var denyAddresses: [CIDR]
    /// A tunnel with no byte in either direction for this long is closed.
    public var idleTimeout: Duration

    /// Loopback, RFC 1918, link-local, ULA, CGNAT and the unspecified addresses (`0.0.0.0/8`, `::/128`). Whatever
    /// the list says, Backstop's own listeners and the unspecified addresses are refused as loops
    /// (`DestinationGuard`).
    public static let defaultDenyAddresses: [CIDR] = [
        "127.0.0.0/8", "::1/128", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "fe80::/10",
        "fc00::/7", "100.64.0.0/10", "0.0.0.0/8", "::/128",
    ].map { CIDRParser.parse($0)! }

    public init(
        allow: [TunnelPattern] = [], denyAddresses: [CIDR] = TunnelsConfig.defaultDenyAddresses,
        idleTimeout: Duration = .seconds(300)
    ) {
        self.allow = allow
        self.denyAddresses = denyAddresses
        self.idleTimeout = idleTimeout
    }
}

/// The `intercept` section: where the local root CA lives and how long minted leaves are valid.
public struct InterceptConfig: Sendable, Equatable {
    /// Keychain entry holding the root CA's key and certificate (`backstop ca init`).
    public var caEntry: String
    public var leafLifetime: Duration
    public init(caEntry: String = "ca/root", leafLifetime: Duration = .seconds(86_400)) {
        self.caEntry = caEntry
        self.leafLifetime = leafLifetime
    }
}

/// The `token_store` section: where oauth2 tokens are kept (docs/reference/token-store.md).
public enum TokenStoreConfig: Sendable, Equatable {
    /// In the keychain file, under each upstream's `keychain_prefix` (single flight across the processes that share
    /// the file).
    case keychain
    /// In a PostgreSQL table shared by a fleet (single flight across every instance).
    case postgres(PostgresStoreConfig)
}

/// How the PostgreSQL token store connects.
public enum PostgresTLSMode: String, Sendable, Equatable, CaseIterable {
    /// No TLS: only for a loopback host.
    case disable
    /// TLS without verifying the server's certificate.
    case require
    /// TLS, the certificate verified against `ca_file` (or the system CAs) and the host name.
    case verifyFull = "verify-full"
}

/// `token_store: {type: postgres, ...}`.
public struct PostgresStoreConfig: Sendable, Equatable {
    public var host: String
    public var port: Int
    public var user: String
    public var database: String
    /// Keychain entry holding the role's password; nil: no password (the server trusts the connection).
    public var passwordEntry: String?
    public var tls: PostgresTLSMode
    public var caFile: String?
    /// A plain lowercase SQL identifier.
    public var table: String

    public init(
        host: String, port: Int = 5432, user: String, database: String, passwordEntry: String? = nil,
        tls: PostgresTLSMode = .verifyFull, caFile: String? = nil, table: String = "backstop_tokens"
    ) {
        self.host = host
        self.port = port
        self.user = user
        self.database = database
        self.passwordEntry = passwordEntry
        self.tls = tls
        self.caFile = caFile
        self.table = table
    }

    /// `postgres://user@host:port/database`, for logs and `tokens list` (never a password: the URL has none).
    public var displayURL: String {
        "postgres://\(user)@\(host.contains(":") ? "[\(host)]" : host):\(port)/\(database)"
    }
}

/// The `tracing` section: where spans go and which requests are sampled (docs/reference/config.md#tracing).
public struct TracingConfig: Sendable, Equatable {
    /// The collector's OTLP/HTTP endpoint as written (`http://127.0.0.1:4318`).
    public var otlpEndpoint: String
    /// Where span batches are POSTed: the endpoint with `/v1/traces` appended unless its path already ends so.
    public var exportURL: String
    /// `service.name` of every span's resource.
    public var serviceName: String
    /// The share of requests without a `traceparent` that are sampled, 0...1.
    public var sampleRatio: Double

    public init(
        otlpEndpoint: String, exportURL: String? = nil, serviceName: String = "backstop", sampleRatio: Double = 1
    ) {
        self.otlpEndpoint = otlpEndpoint
        self.exportURL = exportURL ?? TracingConfig.exportURL(for: otlpEndpoint)
        self.serviceName = serviceName
        self.sampleRatio = sampleRatio
    }

    /// OTLP/HTTP's rule for a base endpoint: the traces path is appended (`http://c:4318` →
    /// `http://c:4318/v1/traces`); an endpoint already naming `/v1/traces` is used as written.
    public static func exportURL(for endpoint: String) -> String {
        var base = endpoint
        if let query = base.firstIndex(of: "?") { base = String(base[..<query]) }
        if base.hasSuffix("/v1/traces") { return endpoint }
        while base.hasSuffix("/") { base.removeLast() }
        return base + "/v1/traces"
    }
}
