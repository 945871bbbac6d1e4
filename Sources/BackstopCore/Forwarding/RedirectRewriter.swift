/// Rewrites `Location` and `Content-Location` values that point at an upstream's own URL back to the address the
/// client used, as nginx's `proxy_redirect default` does (docs/reference/behaviour.md#forwarding). Without it, an
/// upstream redirect to `/v2/login` would send an app whose base URL is `http://127.0.0.1:8080/api` out of
/// Backstop's routes. Pure; built per request, used only when a response carries such a field.
///
/// An upstream URL (of any of its endpoints) `scheme://host[:port]` + base path maps to what the client sees: for an origin-form request
/// matched by a stripped `path_prefix`, that prefix (a path on Backstop itself, so the value becomes relative); for
/// another origin-form request, the path itself; for an absolute-form request, `http://` + the host it asked for.
/// Values elsewhere (other hosts, other paths, relative references) are left as they are.
public struct RedirectRewriter: Sendable, Equatable {
    /// `scheme://host` and `scheme://host:port` spellings of each endpoint's origin, lowercased.
    let upstreamOrigins: [String]
    let basePath: String
    /// Prepended to what follows the base path: `""` (keep relative) or `http://host[:port]`.
    let clientOrigin: String
    /// The path prefix the client sees in front of it.
    let clientPrefix: String

    public init(upstream: UpstreamConfig, target: RequestTarget) {
        // Any endpoint's origin: a redirect names the endpoint that answered (they share one base path).
        upstreamOrigins = upstream.endpoints.flatMap { url in
            let host = url.host.contains(":") ? "[\(url.host)]" : url.host
            return ["\(url.scheme)://\(host):\(url.effectivePort)", "\(url.scheme)://\(host)"]
        }
        basePath = upstream.url.basePath
        switch target.form {
        case .absolute(let scheme, let requestHost, let port):
            let authority =
                (requestHost.contains(":") ? "[\(requestHost)]" : requestHost) + (port.map { ":\($0)" } ?? "")
            clientOrigin = "\(scheme)://\(authority)"
            clientPrefix = ""
        case .origin, .asterisk, .authority:
            clientOrigin = ""
            if let prefix = upstream.match.pathPrefix, prefix != "/", upstream.match.stripPrefix,
                Router.prefixMatches(prefix, target.path)
            {
                clientPrefix = prefix
            } else {
                clientPrefix = ""
            }
        }
    }

    /// The value the client should get, or nil to leave `value` as it is.
    public func rewrite(_ value: String) -> String? {
        var rest: Substring?
        if value.hasPrefix("/") && !value.hasPrefix("//") {
            rest = Substring(value)
        } else {
            let lower = value.asciiLowercased()
            for origin in upstreamOrigins where lower.hasPrefix(origin) {
                let after = value.dropFirst(origin.count)
                if after.isEmpty || after.first == "/" || after.first == "?" || after.first == "#" {
                    rest = after
                    break
                }
            }
            guard rest != nil else { return nil }
        }
        guard var remainder = rest else { return nil }
        guard remainder.hasPrefix(basePath) else { return nil }
        let afterBase = remainder.dropFirst(basePath.count)
        guard afterBase.isEmpty || afterBase.first == "/" || afterBase.first == "?" || afterBase.first == "#" else {
            return nil
        }
        remainder = afterBase
        var path = clientPrefix + remainder
        if path.isEmpty || path.first == "?" || path.first == "#" { path = "/" + path }
        let rewritten = clientOrigin + path
        return rewritten == value ? nil : rewritten
    }
}
