/// Why an attempt failed for want of a usable network on this host, rather than because of the upstream: such an
/// attempt waits for its backoff or for the network to change, whichever comes first
/// (docs/reference/behaviour.md#the-network-coming-back). Which curl results mean which cause is decided with the
/// transport's other classifications (`FailureClassification.noUsableNetwork` in BackstopTransport).
public enum NoUsableNetwork: String, Sendable, Equatable, CaseIterable {
    /// `connect` found no route (`ENETUNREACH`), or the route's link is down (`ENETDOWN`).
    case networkUnreachable = "network-unreachable"
    /// The route leads nowhere: an `unreachable` route, or no neighbour answered on the link (`EHOSTUNREACH`).
    case hostUnreachable = "host-unreachable"
    /// The host name did not resolve.
    case nameResolution = "name-resolution"
}
