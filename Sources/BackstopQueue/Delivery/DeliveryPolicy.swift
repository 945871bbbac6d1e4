import BackstopCore

/// How one delivery of a queued request ended, as the deliverer saw it after the exchange's own retries.
public enum DeliveryResult: Sendable, Equatable {
    /// The upstream answered with this final status (and these hint headers, for the next try's time).
    case response(status: Int, retryAfter: String?, rateLimitReset: String?)
    /// No answer: a connect failure, a reset, a timeout, or a local reason not to send now (retry budget spent,
    /// token unavailable). The label is what `deliveries list` shows as the last outcome.
    case noResponse(String)
    /// Not sent: Backstop itself refused it for now (`circuit-open`: every endpoint is ejected) and said when to
    /// come back (`retryAfter`, seconds: the next probe). Tried again then, not on the backoff's schedule, and the
    /// lane waits as long before it claims more (docs/reference/behaviour.md#queued-delivery).
    case notSentNow(String, retryAfter: Double)
    /// The delivery can never be made as it stands (its upstream is no longer configured, its entry does not open, its
    /// answer cannot be relayed: `bad-upstream-response`): a dead letter at once.
    case undeliverable(String)
}

/// What to do with a queued delivery after a try (or when it is found expired).
public enum DeliveryDecision: Sendable, Equatable {
    /// Delivered: the entry is deleted.
    case delivered
    /// Try again at this wall-clock time (seconds since the Unix epoch); `lastOutcome` is kept for `list`.
    case retry(at: Double, lastOutcome: String)
    /// A dead letter: kept, listed, retried or dropped only by an operator.
    case dead(lastOutcome: String)
}

/// The rules of queued delivery (docs/reference/behaviour.md#queued-delivery) as a pure function:
///
/// - a `2xx` answer is delivered;
/// - `408`, `429`, a `5xx` and no answer at all are tried again later, after the wait the response asks for
///   (`Retry-After` or `X-RateLimit-Reset`, when the upstream's `retry.retry_after.honor` is on) or else
///   `redeliveryBackoff` for the number of tries so far: 1 s, 2 s, 4 s, … up to 5 minutes, with equal jitter;
///   a wait past `queue.max_age` is cut to end `lastTryMargin` (1 s) before it, so a last try is made before the
///   deadline turns the delivery into a dead letter (one due at the deadline itself would find it expired); a try
///   that fails after that point was the last;
/// - any other status (`1xx`, `3xx`, a `4xx`) is a dead letter: sending the same request again would get the
///   same answer (a `3xx` asks for something a queued request cannot do: follow it);
/// - a delivery not made by `accepted + queue.max_age` is a dead letter, whatever the last outcome.
public struct DeliveryPolicy: Sendable, Equatable {
    public var maxAge: Duration
    public var honorRetryAfter: Bool
    public var backoff: Backoff

    public static let redeliveryBackoff = BackoffConfig(
        strategy: .exponential, base: .seconds(1), max: .seconds(300), multiplier: 2, jitter: .equal)

    public init(
        maxAge: Duration, honorRetryAfter: Bool = true, backoff: BackoffConfig = DeliveryPolicy.redeliveryBackoff
    ) {
        self.maxAge = maxAge
        self.honorRetryAfter = honorRetryAfter
        self.backoff = Backoff(backoff)
    }

    /// An upstream's settings: its `queue.max_age` and `retry.retry_after.honor`.
    public init(upstream: UpstreamConfig) {
        self.init(maxAge: upstream.queue.maxAge, honorRetryAfter: upstream.retry.retryAfter.honor)
    }

    /// The wall-clock time after which a delivery accepted at `acceptedAt` is a dead letter.
    public func deadline(acceptedAt: Double) -> Double { acceptedAt + maxAge.seconds }

    /// How long before the deadline the last try is due at the latest (seconds).
    public static let lastTryMargin: Double = 1

    /// Whether a delivery accepted at `acceptedAt` has run out of time at `now`.
    public func isExpired(acceptedAt: Double, now: Double) -> Bool { now >= deadline(acceptedAt: acceptedAt) }

    /// The decision after try number `attempts` (1 for the first) ended with `result`.
    public func decide(
        _ result: DeliveryResult, attempts: Int, acceptedAt: Double, now: Double,
        random: inout some RandomNumberGenerator
    ) -> DeliveryDecision {
        let outcome: String
        var hint = RetryHint.none
        switch result {
        case .response(let status, let retryAfter, let rateLimitReset):
            if (200...299).contains(status) { return .delivered }
            outcome = "status \(status)"
            guard status == 408 || status == 429 || (500...599).contains(status) else {
                return .dead(lastOutcome: outcome)
            }
            if honorRetryAfter {
                hint = RetryHint.parse(retryAfter: retryAfter, rateLimitReset: rateLimitReset, nowWall: now)
            }
        case .noResponse(let label):
            outcome = label
        case .notSentNow(let label, let retryAfter):
            outcome = label
            hint = .wait(.milliseconds(Int64(min(max(0, retryAfter), 86_400) * 1000)))
        case .undeliverable(let label):
            return .dead(lastOutcome: label)
        }
        // The last try is due `lastTryMargin` before the deadline; one made after that point was the last.
        let lastTry = deadline(acceptedAt: acceptedAt) - Self.lastTryMargin
        guard now < lastTry else { return .dead(lastOutcome: Self.expired(after: outcome)) }
        let wait: Duration
        if case .wait(let hinted) = hint {
            wait = hinted
        } else {
            wait = backoff.delay(retry: attempts, previous: nil, random: &random)
        }
        return .retry(at: Swift.min(now + wait.seconds, lastTry), lastOutcome: outcome)
    }

    /// The last outcome of a delivery that ran out of time.
    public static func expired(after outcome: String?) -> String {
        outcome.map { "expired (last: \($0))" } ?? "expired"
    }
}
