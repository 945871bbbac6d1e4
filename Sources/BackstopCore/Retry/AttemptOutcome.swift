/// How one attempt ended, in the terms of `retry.on`.
public enum AttemptOutcome: Sendable, Equatable {
    /// A response head arrived. Only the two hint headers matter to the policy, so only they are carried.
    case response(status: Int, retryAfter: String?, rateLimitReset: String?)
    /// No connection was made (refused, DNS, TLS handshake, connect timeout): nothing reached the upstream.
    case connectFailure
    /// The connection broke after the request may have reached the upstream.
    case reset
    /// `per_try` ran out after the request may have reached the upstream.
    case timeout

    /// The `retry.on` condition this outcome matches.
    public var condition: RetryCondition {
        switch self {
        case .response(let status, _, _): .status(status)
        case .connectFailure: .connectFailure
        case .reset: .reset
        case .timeout: .timeout
        }
    }

    /// False only for a connect failure, which is why that one may be retried for any method.
    public var mayHaveReachedUpstream: Bool { self != .connectFailure }
}

/// What the policy needs to know about the request.
public struct RetryRequestInfo: Sendable, Equatable {
    /// The method as received (methods are case-sensitive, RFC 9110 §9.1).
    public var method: String
    /// Whether the request carries the `retry_non_idempotent_with_key` header.
    public var hasIdempotencyKey: Bool
    /// Whether the body was fully buffered (or empty) and can be sent again.
    public var bodyReplayable: Bool

    public init(method: String, hasIdempotencyKey: Bool, bodyReplayable: Bool) {
        self.method = method
        self.hasIdempotencyKey = hasIdempotencyKey
        self.bodyReplayable = bodyReplayable
    }

    /// Looks for `idempotencyKeyHeader` (case-insensitively, as header names are) among `headerNames`; a nil
    /// header name (the feature switched off) never matches.
    public init(
        method: String, headerNames: some Sequence<String>, idempotencyKeyHeader: String?, bodyReplayable: Bool
    ) {
        self.init(
            method: method,
            hasIdempotencyKey: idempotencyKeyHeader.map { key in headerNames.contains { $0.caseInsensitiveEquals(key) }
            }
                ?? false,
            bodyReplayable: bodyReplayable)
    }
}
