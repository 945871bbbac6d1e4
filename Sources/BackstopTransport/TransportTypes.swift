import BackstopCore
import NIOCore

/// One upstream attempt as the transport performs it: a fully resolved URL, final headers and a body source.
public struct TransportRequest: Sendable {
    /// Absolute URL (`https://host:port/path?query`), sent byte for byte (curl's path normalisation is off).
    public var url: String
    public var method: String
    /// Headers exactly as they go upstream (hop-by-hop already removed, `Host` already set).
    public var headers: [(name: String, value: String)]
    public var body: TransportRequestBody
    public var connectTimeout: Duration
    public var tls: TransportTLSOptions
    /// Whether the request may reach the upstream twice. When false, libcurl must not resend it by itself: a
    /// request sent on a reused connection that dies before any response byte is normally resent on a fresh one
    /// (harmless for GET, a duplicate for a POST the upstream may already have processed).
    public var mayResend: Bool
    /// A passthrough request (`unmatched: passthrough`): the destination guard also refuses link-local and
    /// metadata addresses for it.
    public var passthrough: Bool

    public init(
        url: String, method: String, headers: [(name: String, value: String)], body: TransportRequestBody = .empty,
        connectTimeout: Duration = .seconds(2), tls: TransportTLSOptions = TransportTLSOptions(), mayResend: Bool = true,
        passthrough: Bool = false
    ) {
        self.mayResend = mayResend
        self.passthrough = passthrough
        self.url = url
        self.method = method
        self.headers = headers
        self.body = body
        self.connectTimeout = connectTimeout
        self.tls = tls
    }
}

/// TLS settings of one transfer.
public struct TransportTLSOptions: Sendable, Equatable {
    public var caFile: String?
    public var insecureSkipVerify: Bool
    public init(caFile: String? = nil, insecureSkipVerify: Bool = false) {
        self.caFile = caFile
        self.insecureSkipVerify = insecureSkipVerify
    }

    /// An upstream's `tls` section.
    public init(_ tls: TLSConfig) {
        self.init(caFile: tls.caFile, insecureSkipVerify: tls.insecureSkipVerify)
    }

    /// A token endpoint's `auth.tls` section: verification is always on.
    public init(_ tls: TokenEndpointTLS) {
        self.init(caFile: tls.caFile, insecureSkipVerify: false)
    }
}

/// Where an attempt's request body comes from.
public enum TransportRequestBody: Sendable {
    /// No body (no `Content-Length` sent for GET/HEAD-like methods, `Content-Length: 0` otherwise).
    case empty
    /// A complete body held in memory; replayable, so usable for retries.
    case buffered(ByteBuffer)
    /// A body still arriving from the client; can be sent once only.
    case streaming(RequestBodyStream)
}

/// Why an attempt failed below HTTP, in the terms of `retry.on` (docs/reference/config.md#retry).
public enum TransportFailure: Error, Sendable, Equatable {
    /// Nothing reached the upstream (refused, unresolvable, connect timeout, TLS handshake failure).
    case connectFailure(detail: String)
    /// The connection broke after the request may have been sent.
    case reset(detail: String)
    /// The transport's own timeout fired (not used for `per_try`, which the exchange enforces).
    case timeout(detail: String)
    /// The exchange cancelled the attempt (client gone, per-try timer fired).
    case cancelled
    /// The request body stream failed (client disconnected mid-upload).
    case requestBodyFailed
    /// The upstream's response head framed its body in a way that cannot be trusted (conflicting or malformed
    /// `Content-Length`/`Transfer-Encoding`); the head was never delivered. Counts as `reset` for retries.
    case badResponse(detail: String)
    /// The connection would have reached one of Backstop's own listeners (508 `loop-detected`).
    case loopDetected(detail: String)
    /// A passthrough connection to a link-local or metadata address was refused (403 `destination-denied`).
    case destinationDenied(detail: String)

    /// What went wrong, for logs: curl's error, errno and the address tried where known.
    public var detail: String {
        switch self {
        case .connectFailure(let d), .reset(let d), .timeout(let d), .badResponse(let d), .loopDetected(let d),
            .destinationDenied(let d):
            d
        case .cancelled: "cancelled"
        case .requestBodyFailed: "client request body failed"
        }
    }

    /// The outcome label of `backstop_upstream_attempts_total{outcome}` and of access log lines.
    public var label: String {
        switch self {
        case .connectFailure: "connect-failure"
        case .reset: "reset"
        case .timeout: "timeout"
        case .cancelled: "cancelled"
        case .requestBodyFailed: "client-body-failed"
        case .badResponse: "bad-response"
        case .loopDetected: "loop-detected"
        case .destinationDenied: "destination-denied"
        }
    }
}

/// Events of one transfer, delivered in order on the requester's event loop.
public enum TransportEvent: Sendable {
    /// The final head (never a 1xx interim one), rewritten for the client.
    case head(UpstreamResponseHead)
    case body(ByteBuffer)
    case end
    case failure(TransportFailure)
}
