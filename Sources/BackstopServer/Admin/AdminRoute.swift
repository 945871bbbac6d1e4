import NIOHTTP1

/// Which admin endpoint a request names, decided from its method and path alone (docs/reference/operations.md,
/// "Admin endpoints"): a known path asked with a method it does not serve is 405 with the methods it does, as an
/// nginx or Envoy admin operator expects; a path that is not served at all is 404.
enum AdminRoute: Equatable {
    case healthz
    case readyz
    case metrics
    case statusPage
    case statusJSON
    case methodNotAllowed(allow: String)
    case notFound

    /// The route for `method` on `uri` (its query, if any, is not part of the path).
    init(method: HTTPMethod, uri: String) {
        let path =
            uri.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false).first.map(String.init) ?? uri
        let endpoint: AdminRoute
        let servesHead: Bool
        switch path {
        case "/healthz": (endpoint, servesHead) = (.healthz, true)
        case "/readyz": (endpoint, servesHead) = (.readyz, true)
        // Rendering the metrics for a HEAD would cost a full scrape for nothing.
        case "/metrics": (endpoint, servesHead) = (.metrics, false)
        case "/status": (endpoint, servesHead) = (.statusPage, true)
        case "/status.json": (endpoint, servesHead) = (.statusJSON, true)
        default:
            self = .notFound
            return
        }
        switch method {
        case .GET: self = endpoint
        case .HEAD where servesHead: self = endpoint
        default: self = .methodNotAllowed(allow: servesHead ? "GET, HEAD" : "GET")
        }
    }
}
