/// Reasons for responses Backstop makes itself, sent as `X-Backstop-Error: <reason>` (the table in
/// docs/reference/errors.md). `tokenRefreshFailed` is the one reason added to an upstream's own response.
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
    case methodNotAllowed = "method-not-allowed"
    case requestTimeout = "request-timeout"
    case badUpstreamResponse = "bad-upstream-response"
    case loopDetected = "loop-detected"
    case destinationDenied = "destination-denied"
    case tunnelDenied = "tunnel-denied"
    case tunnelUnreachable = "tunnel-unreachable"
    case clientDenied = "client-denied"
    case proxyAuthRequired = "proxy-auth-required"
    case upgradeNotAllowed = "upgrade-not-allowed"
    /// Every endpoint of the upstream is ejected; sent with `Retry-After` (`EndpointVerdict.circuitOpen`).
    case circuitOpen = "circuit-open"
    /// `circuit.max_inflight` requests to the upstream are already in progress.
    case upstreamOverloaded = "upstream-overloaded"
    /// A request to a `delivery: queue` upstream could not be stored (`spool.max_bytes`, a full disk).
    case spoolFull = "spool-full"

    /// The HTTP status that goes with the reason.
    public var status: Int {
        switch self {
        case .badRequest, .upgradeNotAllowed: 400
        case .noRoute, .destinationDenied, .tunnelDenied, .clientDenied: 403
        case .connectNotSupported, .methodNotAllowed: 405
        case .proxyAuthRequired: 407
        case .requestTimeout: 408
        case .bodyTooLarge: 413
        case .headersTooLarge: 431
        case .upstreamUnreachable, .tokenUnavailable, .badUpstreamResponse, .tunnelUnreachable: 502
        case .shuttingDown, .circuitOpen, .upstreamOverloaded: 503
        case .upstreamTimeout: 504
        case .loopDetected: 508
        case .spoolFull: 507
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
        case .methodNotAllowed: "method not allowed for this upstream"
        case .requestTimeout:
            "the request was not received in time (limits.header_timeout, limits.client_idle_timeout or timeouts.total)"
        case .badUpstreamResponse: "the upstream's response framing is conflicting or malformed"
        case .loopDetected: "the request would come back to backstop itself"
        case .destinationDenied: "passthrough to this destination is not allowed"
        case .tunnelDenied: "CONNECT to this destination is not allowed"
        case .tunnelUnreachable: "the CONNECT destination cannot be reached"
        case .clientDenied: "this client may not use this upstream (clients)"
        case .proxyAuthRequired: "proxy authentication required"
        case .upgradeNotAllowed: "protocol upgrades are not allowed for this upstream"
        case .circuitOpen: "every endpoint of the upstream is failing; not tried until its next probe"
        case .upstreamOverloaded: "too many requests in progress to the upstream (circuit.max_inflight)"
        case .spoolFull: "the request cannot be stored for delivery (spool.max_bytes or the disk is full)"
        }
    }
}
