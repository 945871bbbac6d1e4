/// What the exchange knows about a client request when it ends, for its server span (OpenTelemetry HTTP server
/// semantic conventions; docs/reference/operations.md#tracing lists the attributes).
public struct RequestFacts: Sendable, Equatable {
    public var method: String
    /// The request path without its query (a query may carry secrets and is never recorded).
    public var path: String
    /// The host and port the client addressed (`Host` or the absolute-form URL), when known.
    public var serverAddress: String?
    public var serverPort: Int?
    /// The client's address (IP text, or nil for a unix-socket client).
    public var clientAddress: String?
    public var userAgent: String?
    /// `1.0` or `1.1`.
    public var protocolVersion: String
    /// The status sent to the client.
    public var status: Int
    /// The upstream that served it; nil when none matched.
    public var upstream: String?
    /// Backstop's own error reason (`X-Backstop-Error`), when Backstop answered.
    public var errorReason: String?
    /// Attempts made (0 when none was sent).
    public var attempts: Int

    public init(
        method: String, path: String, serverAddress: String? = nil, serverPort: Int? = nil,
        clientAddress: String? = nil, userAgent: String? = nil, protocolVersion: String = "1.1", status: Int,
        upstream: String? = nil, errorReason: String? = nil, attempts: Int = 0
    ) {
        self.method = method
        self.path = path
        self.serverAddress = serverAddress
        self.serverPort = serverPort
        self.clientAddress = clientAddress
        self.userAgent = userAgent
        self.protocolVersion = protocolVersion
        self.status = status
        self.upstream = upstream
        self.errorReason = errorReason
        self.attempts = attempts
    }
}

/// What one attempt to an upstream came to, for its client span (OpenTelemetry HTTP client semantic conventions
/// plus Backstop's `backstop.*` attributes).
public struct AttemptFacts: Sendable, Equatable {
    public var method: String
    /// The URL the attempt went to; its query is dropped before recording.
    public var url: String
    public var upstream: String
    /// The endpoint that was tried (`scheme://host[:port]`).
    public var endpoint: String
    /// 1 for the first attempt.
    public var attempt: Int
    /// Whether this attempt was a hedged copy sent while another was still waiting (docs/reference/behaviour.md).
    public var hedge: Bool
    /// The response status, when a head arrived.
    public var status: Int?
    /// The attempt's outcome as `backstop_upstream_attempts_total` labels it (`2xx`, `timeout`, `connect-failure`…).
    public var outcome: String
    /// The `retry.on` condition this attempt's result was retried for; nil when it was not retried.
    public var retryReason: String?
    /// The wait before the next attempt, when one was made.
    public var backoffMilliseconds: Int64?
    /// The HTTP version the upstream answered with (`1.1`, `2`), when known.
    public var protocolVersion: String?
    /// Why the attempt failed whatever its status: a transport failure (`reset`, `bad-response`…), a response that
    /// broke off after its head (`upstream-broke-mid-response`), or one the client did not wait for
    /// (`client-closed`). nil for an attempt that ended as its status says.
    public var failure: String?

    public init(
        method: String, url: String, upstream: String, endpoint: String, attempt: Int, hedge: Bool = false,
        status: Int? = nil, outcome: String, retryReason: String? = nil, backoffMilliseconds: Int64? = nil,
        protocolVersion: String? = nil, failure: String? = nil
    ) {
        self.method = method
        self.url = url
        self.upstream = upstream
        self.endpoint = endpoint
        self.attempt = attempt
        self.hedge = hedge
        self.status = status
        self.outcome = outcome
        self.retryReason = retryReason
        self.backoffMilliseconds = backoffMilliseconds
        self.protocolVersion = protocolVersion
        self.failure = failure
    }
}

/// What a token refresh came to, for its span.
public struct RefreshFacts: Sendable, Equatable {
    public var upstream: String
    /// The token endpoint's host (never its URL's query, never a credential).
    public var tokenEndpointHost: String
    /// `success`, `failure` or `adopted` (as `backstop_token_refreshes_total` labels it).
    public var outcome: String
    /// Why it failed, in the words of the log line (`invalid_grant`, `connect-failure`…); nil on success.
    public var failure: String?

    public init(upstream: String, tokenEndpointHost: String, outcome: String, failure: String? = nil) {
        self.upstream = upstream
        self.tokenEndpointHost = tokenEndpointHost
        self.outcome = outcome
        self.failure = failure
    }
}
