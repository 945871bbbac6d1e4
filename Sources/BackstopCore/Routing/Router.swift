/// Where a request goes (docs/reference/behaviour.md#routing): a pure function of the request-target, the
/// `Host` header and the configured upstreams. Built once per config snapshot.
///
/// `match.hosts` and `match.path_prefix` are two independent ways to reach an upstream, one for each kind of
/// client; an upstream that lists both is reached either way.
/// - Absolute form (`GET http://api.example.com/x`, what an `HTTP_PROXY` client sends) matches its URL host
///   against `match.hosts` only. `path_prefix` plays no part and nothing is stripped: the upstream's base path is
///   joined with the whole request path.
/// - Origin form (`GET /api/x`, an app whose base URL points at Backstop) matches by `path_prefix` first,
///   whatever the `Host` header says: longest prefix wins; a prefix matches at a segment boundary (`/api`
///   matches `/api`, `/api/x`, `/api?q`, not `/apix`; `/` matches everything); the prefix is removed when
///   `strip_prefix` is on. Only when no prefix matches is the `Host` header matched against the `hosts` of every
///   upstream, as in absolute form (nothing stripped).
/// - Host matching ignores the port and case; an exact host beats a wildcard, a longer wildcard beats a shorter
///   one; `*.a.com` matches `x.a.com` and `y.x.a.com`, not `a.com`. Remaining ties go to the upstream listed first
///   (the config loader rejects two upstreams sharing an exact host pattern or an identical prefix).
/// - The rest of the path is appended to the upstream's base path (`/` when both are empty) and `?query` is
///   appended byte for byte when the request had a `?` (even an empty query).
/// - No match: `noRoute`; with `unmatched: passthrough`, the request's own URL for `http` absolute form
///   (`https` → `noRoute`: a proxy cannot forward TLS it never saw), or `http://<Host><path>?query` for origin
///   form (`noRoute` without a valid `Host`, or for a host no resolver takes: `isForwardableHost`). Asterisk and
///   authority forms never route.
public struct Router: Sendable {
    /// What routing needs of each upstream, in config order: only these fields, so a lookup never copies a whole
    /// `UpstreamConfig` (one retain per string and array in it) for every request.
    private struct Route: Sendable {
        let hosts: [String]
        let pathPrefix: String?
        let stripPrefix: Bool
        let basePath: String
    }

    private let routes: [Route]
    private let unmatched: UnmatchedPolicy

    public init(upstreams: [UpstreamConfig], unmatched: UnmatchedPolicy) {
        self.routes = upstreams.map {
            Route(
                hosts: $0.match.hosts, pathPrefix: $0.match.pathPrefix, stripPrefix: $0.match.stripPrefix,
                basePath: $0.url.basePath)
        }
        self.unmatched = unmatched
    }

    public func route(target: RequestTarget, hostHeader: String?) -> RouteDecision {
        switch target.form {
        case .absolute(let scheme, let host, let port):
            if let index = bestHostMatch(host: host) {
                return .upstream(index: index, path: upstreamPath(index, target, strip: false))
            }
            guard unmatched == .passthrough, scheme == "http", Self.isForwardableHost(host) else { return .noRoute }
            let authority = (host.contains(":") ? "[\(host)]" : host) + (port.map { ":\($0)" } ?? "")
            return .passthrough(url: "http://\(authority)\(target.path)\(Self.querySuffix(target.query))")
        case .origin:
            if let index = bestPrefixMatch(path: target.path) {
                return .upstream(index: index, path: upstreamPath(index, target, strip: true))
            }
            let host = hostHeader.flatMap { RequestTarget.parseAuthority($0)?.host }
            if let host, let index = bestHostMatch(host: host) {
                return .upstream(index: index, path: upstreamPath(index, target, strip: false))
            }
            guard unmatched == .passthrough, let hostHeader, let host, Self.isForwardableHost(host) else {
                return .noRoute
            }
            return .passthrough(url: "http://\(hostHeader)\(target.path)\(Self.querySuffix(target.query))")
        case .asterisk, .authority:
            return .noRoute
        }
    }

    /// Whether a passthrough may go to `host`: an IP literal, or a name of letters, digits, `-`, `.` and `_`. A host
    /// RFC 3986 allows but no resolver does (`a%0ab`, `a'b`, `a=b`) is no route (403), not an attempt that fails.
    static func isForwardableHost(_ host: String) -> Bool {
        if host.contains(":") { return IPAddressParser.parse(host) != nil }
        return !host.isEmpty
            && host.utf8.allSatisfy {
                (0x30...0x39).contains($0) || (0x41...0x5A).contains($0) || (0x61...0x7A).contains($0)
                    || $0 == UInt8(ascii: "-") || $0 == UInt8(ascii: ".") || $0 == UInt8(ascii: "_")
            }
    }

    /// The upstream a request for `host` (lowercased, no port) goes to by `match.hosts`, as for absolute form.
    public func upstreamIndex(forHost host: String) -> Int? { bestHostMatch(host: host) }

    /// The upstream whose `hosts` match `host` best (exact, then the longest wildcard); first listed on a tie.
    private func bestHostMatch(host: String) -> Int? {
        var best: (index: Int, rank: Int)?
        for index in routes.indices {
            guard let rank = Self.hostRank(routes[index].hosts, host) else { continue }
            if let current = best, rank <= current.rank { continue }
            best = (index, rank)
        }
        return best?.index
    }

    /// The upstream with the longest `path_prefix` matching `path` at a segment boundary.
    private func bestPrefixMatch(path: String) -> Int? {
        var best: (index: Int, length: Int)?
        for index in routes.indices {
            guard let prefix = routes[index].pathPrefix, Self.prefixMatches(prefix, path) else { continue }
            let length = prefix.utf8.count
            if let current = best, length <= current.length { continue }
            best = (index, length)
        }
        return best?.index
    }

    /// How well `host` (lowercased, no port) matches the best of `patterns`: nil for no match, the suffix length
    /// for a wildcard (a longer suffix is more specific), above every wildcard for an exact match.
    public static func hostRank(_ patterns: [String], _ host: String) -> Int? {
        var rank: Int?
        for pattern in patterns {
            if pattern == host { return Int.max }
            guard pattern.hasPrefix("*.") else { continue }
            let suffix = pattern.dropFirst(1)  // ".a.com"
            if host.count > suffix.count && host.hasSuffix(suffix) { rank = Swift.max(rank ?? 0, suffix.count) }
        }
        return rank
    }

    /// Whether `path` starts with `prefix` at a segment boundary.
    static func prefixMatches(_ prefix: String, _ path: String) -> Bool {
        if prefix == "/" { return path.hasPrefix("/") }
        guard path.hasPrefix(prefix) else { return false }
        let rest = path.utf8.dropFirst(prefix.utf8.count)
        return rest.isEmpty || rest.first == UInt8(ascii: "/")
    }

    /// Base path + path (without the matched prefix when `strip` and the upstream's `strip_prefix` say so) +
    /// `?query`.
    private func upstreamPath(_ index: Int, _ target: RequestTarget, strip: Bool) -> String {
        var path = target.path
        let stripping = strip && routes[index].stripPrefix
        // Most requests: no base path, no prefix to take off, no query; the path is the client's as it is (the
        // joins below cost ~200 instructions even when nothing is added).
        if routes[index].basePath.isEmpty, target.query == nil, !stripping, !path.isEmpty { return path }
        if stripping, let prefix = routes[index].pathPrefix, prefix != "/" {
            path = String(path.dropFirst(prefix.count))
        }
        var joined = routes[index].basePath + path
        if joined.isEmpty { joined = "/" }
        return joined + Self.querySuffix(target.query)
    }

    private static func querySuffix(_ query: String?) -> String {
        query.map { "?" + $0 } ?? ""
    }
}

/// The outcome of routing one request.
public enum RouteDecision: Sendable, Equatable {
    /// Send to `upstreams[index]` with this path (base path joined, query appended).
    case upstream(index: Int, path: String)
    /// `unmatched: passthrough`: forward to this URL as is, with no retry and no auth.
    case passthrough(url: String)
    /// `unmatched: reject`: 403 `no-route`.
    case noRoute
}
