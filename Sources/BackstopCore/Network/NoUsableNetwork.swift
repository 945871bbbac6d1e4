#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Why an attempt failed for want of a usable network on this host, rather than because of the upstream: such an
/// attempt waits for its backoff or for the network to change, whichever comes first
/// (docs/reference/behaviour.md#the-network-coming-back).
public enum NoUsableNetwork: String, Sendable, Equatable, CaseIterable {
    /// `connect` found no route (`ENETUNREACH`), or the route's link is down (`ENETDOWN`).
    case networkUnreachable = "network-unreachable"
    /// The route leads nowhere: an `unreachable` route, or no neighbour answered on the link (`EHOSTUNREACH`).
    case hostUnreachable = "host-unreachable"
    /// The host name did not resolve.
    case nameResolution = "name-resolution"

    /// curl's `CURLE_COULDNT_RESOLVE_HOST` and `CURLE_COULDNT_CONNECT` (stable numbers of curl's ABI).
    public static let curlCouldNotResolveHost = 6
    public static let curlCouldNotConnect = 7

    /// Classifies a failed transfer by curl's result code and `CURLINFO_OS_ERRNO`; nil when the failure says
    /// nothing about this host's network.
    ///
    /// What libcurl 7.88 reports, measured in a network namespace: no route at all → `CURLE_COULDNT_CONNECT` with
    /// `ENETUNREACH`, at once; an `unreachable` route → `EHOSTUNREACH` at once; a route whose neighbour never
    /// answers (the link lost its carrier) → `EHOSTUNREACH` after about 3 s, or a connect timeout first
    /// (`CURLE_OPERATION_TIMEDOUT`, not classified: a slow upstream looks the same); a `prohibit` route `EACCES`
    /// and a `blackhole` route `EINVAL` (policy, not a missing network: nil). A name that does not resolve is
    /// `CURLE_COULDNT_RESOLVE_HOST` with errno 0 whether the resolver was unreachable or the name does not exist
    /// (curl's threaded resolver passes on neither the resolver's errno nor `EAI_AGAIN`), so every resolution
    /// failure counts: the only effect is that a network change may end its backoff early.
    public static func classify(curlCode: Int, osErrno: Int) -> NoUsableNetwork? {
        switch curlCode {
        case curlCouldNotResolveHost:
            return .nameResolution
        case curlCouldNotConnect:
            switch Int32(clamping: osErrno) {
            case ENETUNREACH, ENETDOWN: return .networkUnreachable
            case EHOSTUNREACH: return .hostUnreachable
            default: return nil
            }
        default:
            return nil
        }
    }
}
