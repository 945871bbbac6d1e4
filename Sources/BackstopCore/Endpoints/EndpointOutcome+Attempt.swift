extension EndpointOutcome {
    /// How an attempt that ended as `outcome` counts for its endpoint (docs/reference/behaviour.md#endpoints-and-ejection):
    /// a `retry.on` condition is a failure, a response head that is not one is a success, and anything else tells
    /// nothing about the endpoint: nil (cancelled, a certificate that did not verify, the client's body failing) or a
    /// connect failure, reset or timeout the upstream's `retry.on` leaves out.
    public init(_ outcome: AttemptOutcome?, retryOn: Set<RetryCondition>) {
        guard let outcome else {
            self = .abandoned
            return
        }
        // Scanned, not hashed: `retry.on` holds a handful of conditions, and this runs for every attempt's end.
        if retryOn.contains(where: { $0 == outcome.condition }) {
            self = .failure
        } else if case .response = outcome {
            self = .success
        } else {
            self = .abandoned
        }
    }
}

extension HedgeConfig {
    /// Whether a request may be hedged (docs/reference/behaviour.md#hedging): hedging is on, its method is listed,
    /// and its body is empty or fully kept (so every copy sends the same bytes).
    public func applies(method: String, bodyReplayable: Bool) -> Bool {
        max > 0 && bodyReplayable && methods.contains(method)
    }
}

/// How one attempt ended for the endpoint it was given, as the request's machine decided it: what its executor hands
/// to the upstream's shared endpoint set.
public struct EndpointReport: Sendable, Equatable {
    public var ticket: EndpointTicket
    public var outcome: EndpointOutcome

    public init(ticket: EndpointTicket, outcome: EndpointOutcome) {
        self.ticket = ticket
        self.outcome = outcome
    }
}
