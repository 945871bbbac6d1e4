// The typed, immutable configuration model (docs/reference/config.md). Parsing and validation live in
// ConfigLoader / ConfigValidator; everything downstream reads only these values.

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
    public var description: String { "\(location): \(message)" }
}

/// Every problem found in one config file (parsing and validation report all of them, not just the first).
public struct ConfigErrors: Error, Sendable, Equatable, CustomStringConvertible {
    public var errors: [ConfigError]
    public init(_ errors: [ConfigError]) { self.errors = errors }
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
    public var keyLocation: SourceLocation?
    public init(path: String, key: KeySource, keyLocation: SourceLocation? = nil) {
        self.path = path
        self.key = key
        self.keyLocation = keyLocation
    }
}

/// The `limits` section.
public struct Limits: Sendable, Equatable {
    public var maxRequestBody: Int
    public var retryBuffer: Int
    public var maxHeaderBytes: Int
    public var clientIdleTimeout: Duration
    public var maxConnections: Int
    public init(
        maxRequestBody: Int = 8 << 20, retryBuffer: Int = 1 << 20, maxHeaderBytes: Int = 64 << 10,
        clientIdleTimeout: Duration = .seconds(60), maxConnections: Int = 4096
    ) {
        self.maxRequestBody = maxRequestBody
        self.retryBuffer = retryBuffer
        self.maxHeaderBytes = maxHeaderBytes
        self.clientIdleTimeout = clientIdleTimeout
        self.maxConnections = maxConnections
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
    public var url: UpstreamURL
    public var tls: TLSConfig
    public var timeouts: Timeouts
    public var retry: RetryConfig
    public var auth: AuthConfig
    /// `CONNECT` to one of `match.hosts` is answered by terminating the client's TLS with a leaf of the local CA
    /// and handling the requests inside as requests for this upstream (docs/reference/https-clients.md).
    public var intercept: Bool
    /// `direct` (the client waits) or `queue` (stored, answered 202, delivered in the background).
    public var delivery: DeliveryMode = .direct
    /// How queued deliveries to this upstream are paced and when they give up (`delivery: queue` only).
    public var queue = QueueConfig()
    /// Where this upstream's entry starts in the file.
    public var location: SourceLocation?
    public init(
        name: String, match: MatchConfig, url: UpstreamURL, tls: TLSConfig = TLSConfig(),
        timeouts: Timeouts = Timeouts(), retry: RetryConfig = RetryConfig(), auth: AuthConfig = .none,
        intercept: Bool = false, location: SourceLocation? = nil
    ) {
        self.name = name
        self.match = match
        self.url = url
        self.tls = tls
        self.timeouts = timeouts
        self.retry = retry
        self.auth = auth
        self.intercept = intercept
        self.location = location
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
    public var hostLocations: [SourceLocation] = []
    public var pathPrefixLocation: SourceLocation?
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
}

/// The `tls` section of an upstream.
public struct TLSConfig: Sendable, Equatable {
    /// Absolute path of a CA bundle; nil means the system default.
    public var caFile: String?
    public var insecureSkipVerify: Bool
    /// Offer HTTP/2 by ALPN (`tls.http2`); false pins the upstream connections to HTTP/1.1.
    public var http2: Bool
    public init(caFile: String? = nil, insecureSkipVerify: Bool = false, http2: Bool = true) {
        self.caFile = caFile
        self.insecureSkipVerify = insecureSkipVerify
        self.http2 = http2
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

    public static let defaultOn: Set<RetryCondition> = [
        .connectFailure, .reset, .timeout, .status(429), .status(502), .status(503), .status(504),
    ]
    /// RFC 9110 §9.2.2 idempotent methods.
    public static let defaultMethods: Set<String> = ["GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"]

    public init(
        attempts: Int = 3, on: Set<RetryCondition> = RetryConfig.defaultOn,
        methods: Set<String> = RetryConfig.defaultMethods, retryNonIdempotentWithKey: String? = "Idempotency-Key",
        backoff: BackoffConfig = BackoffConfig(), retryAfter: RetryAfterConfig = RetryAfterConfig(),
        budget: BudgetConfig = BudgetConfig()
    ) {
        self.attempts = attempts
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
    public init(entry: String, header: String = "Authorization", scheme: String = "Bearer",
                clientAuthHeader: ClientAuthHeaderPolicy = .replace) {
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
    public init(accessToken: String = "access_token", refreshToken: String = "refresh_token",
                expiresIn: String = "expires_in") {
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
    public init(caFile: String? = nil) { self.caFile = caFile }
}

/// `auth: {type: oauth2, ...}`.
public struct OAuth2Config: Sendable, Equatable {
    public var tokenURL: String
    public var tls: TokenEndpointTLS
    public var grant: OAuth2Grant
    public var requestFormat: TokenRequestFormat
    public var clientID: String?
    public var clientSecretEntry: String?
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

    /// Loopback, RFC 1918, link-local, ULA, CGNAT and `0.0.0.0/8`.
    public static let defaultDenyAddresses: [CIDR] = [
        "127.0.0.0/8", "::1/128", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "fe80::/10",
        "fc00::/7", "100.64.0.0/10", "0.0.0.0/8",
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
