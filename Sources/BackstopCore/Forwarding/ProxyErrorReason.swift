/// Reasons for responses Backstop makes itself (SPEC §3 error table), sent as `X-Backstop-Error: <reason>`.
public enum ProxyErrorReason: String, Sendable, Equatable, CaseIterable {
    case badRequest = "bad-request"
    case noRoute = "no-route"
    case connectNotSupported = "connect-not-supported"
    case bodyTooLarge = "body-too-large"
    case headersTooLarge = "headers-too-large"
    case upstreamUnreachable = "upstream-unreachable"
    case tokenUnavailable = "token-unavailable"
    case upstreamTimeout = "upstream-timeout"
    case shuttingDown = "shutting-down"
    case tokenRefreshFailed = "token-refresh-failed"

    /// The HTTP status that goes with the reason.
    public var status: Int {
        switch self {
        case .badRequest: 400
        case .noRoute: 403
        case .connectNotSupported: 405
        case .bodyTooLarge: 413
        case .headersTooLarge: 431
        case .upstreamUnreachable, .tokenUnavailable: 502
        case .upstreamTimeout: 504
        case .shuttingDown: 503
        case .tokenRefreshFailed: 401
        }
    }

    /// The one-line `text/plain` body.
    public var message: String {
        switch self {
        case .badRequest: "bad request"
        case .noRoute: "no upstream matches this request"
        case .connectNotSupported: "CONNECT is not supported"
        case .bodyTooLarge: "request body is larger than limits.max_request_body"
        case .headersTooLarge: "request headers are larger than limits.max_header_bytes"
        case .upstreamUnreachable: "upstream unreachable"
        case .tokenUnavailable: "no token could be obtained for the upstream"
        case .upstreamTimeout: "upstream timed out"
        case .shuttingDown: "backstop is shutting down"
        case .tokenRefreshFailed: "token refresh failed"
        }
    }
}
