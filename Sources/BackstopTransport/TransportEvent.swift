import BackstopCore
import NIOCore

/// Why an attempt failed below HTTP, in the terms of `retry.on` (docs/reference/config.md#retry).
public enum TransportFailure: Error, Sendable, Equatable {
    /// Nothing reached the upstream (refused, unresolvable, connect timeout, TLS handshake failure). `network` says
    /// when the cause was this host having no usable network: the retry's backoff then races the network coming
    /// back (docs/reference/behaviour.md#the-network-coming-back).
    case connectFailure(detail: String, network: NoUsableNetwork? = nil)
    /// The upstream's certificate did not verify (unknown issuer, expired, wrong name, pinned key mismatch).
    /// Nothing reached the upstream, and a retry would fail the same way: not a `retry.on` condition
    /// (docs/reference/behaviour.md#when-an-attempt-fails).
    case tlsVerificationFailed(detail: String)
    /// The connection broke after the request may have been sent.
    case reset(detail: String)
    /// The transport's own timeout fired (not used for `per_try`, which the exchange enforces).
    case timeout(detail: String)
    /// The exchange cancelled the attempt (client gone, per-try timer fired).
    case cancelled
    /// The transport stopped under the attempt: Backstop is shutting down and the drain ran out
    /// (docs/reference/operations.md#signals-reload-and-drain). Answered 503 `shutting-down`, never retried.
    case shutDown
    /// The request body stream failed (client disconnected mid-upload).
    case requestBodyFailed
    /// The upstream's response head framed its body in a way that cannot be trusted (conflicting or malformed
    /// `Content-Length`/`Transfer-Encoding`); the head was never delivered. Counts as `reset` for retries.
    case badResponse(detail: String)
    /// The connection would have reached one of Backstop's own listeners (508 `loop-detected`).
    case loopDetected(detail: String)
    /// A passthrough connection to a link-local or metadata address was refused (403 `destination-denied`).
    case destinationDenied(detail: String)

    /// What went wrong, for logs: curl's error, the certificate's verification result or the errno, and the
    /// address tried, where known.
    public var detail: String {
        switch self {
        case .connectFailure(let d, _), .tlsVerificationFailed(let d), .reset(let d), .timeout(let d),
            .badResponse(let d),
            .loopDetected(let d),
            .destinationDenied(let d):
            d
        case .cancelled: "cancelled"
        case .shutDown: "backstop stopped before the upstream answered"
        case .requestBodyFailed: "client request body failed"
        }
    }

    /// The outcome label of `backstop_upstream_attempts_total{outcome}` and of access log lines.
    public var label: String {
        switch self {
        case .connectFailure: "connect-failure"
        case .tlsVerificationFailed: "tls-verification-failed"
        case .reset: "reset"
        case .timeout: "timeout"
        case .cancelled: "cancelled"
        case .shutDown: "shutting-down"
        case .requestBodyFailed: "client-body-failed"
        case .badResponse: "bad-response"
        case .loopDetected: "loop-detected"
        case .destinationDenied: "destination-denied"
        }
    }
}

/// Events of one transfer, delivered in order on the requester's event loop.
public enum TransportEvent: Sendable, Equatable {
    /// The final head (never a 1xx interim one), rewritten for the client.
    case head(UpstreamResponseHead)
    case body(ByteBuffer)
    case end
    case failure(TransportFailure)
}
