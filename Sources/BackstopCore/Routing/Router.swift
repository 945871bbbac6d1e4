/// Where a request goes (SPEC §3 "Routing"): a pure function of the request-target, the `Host` header and the
/// configured upstreams. Built once per config snapshot.
///
/// Rules:
/// - Absolute form (`GET http://api.example.com/x`, what an `HTTP_PROXY` client sends) matches on its URL host,
///   only against upstreams that list `hosts`; an upstream that also has a `path_prefix` additionally needs the
///   path to match it.
/// - Origin form (`GET /api/x`) matches first by `path_prefix`: longest prefix wins; a prefix matches at a segment
///   boundary (`/api` matches `/api`, `/api/x`, `/api?q`, not `/apix`; `/` matches everything); an upstream that
///   also lists hosts needs the `Host` header to match too. Then, among upstreams without a `path_prefix`, by the
///   `Host` header (port ignored, case-insensitive).
/// - Host precedence: an exact host beats a wildcard, a longer wildcard beats a shorter one; `*.a.com` matches
///   `x.a.com` and `y.x.a.com`, not `a.com`. In absolute form the host decides first, then the longest matching
///   prefix (an upstream with a matching prefix beats one without). In origin form the prefix decides first, then
///   the host. Remaining ties go to the upstream listed first (the config loader rejects real overlaps).
/// - When the match used a prefix and `strip_prefix` is on, the prefix is removed. The rest is appended to the
///   upstream's base path (`/` when both are empty) and `?query` is appended byte for byte when the request had a
///   `?` (even an empty query).
/// - No match: `noRoute`; with `unmatched: passthrough`, the request's own URL for `http` absolute form
///   (`https` → `noRoute`: a proxy cannot forward TLS it never saw), or `http://<Host><path>?query` for origin
///   form (`noRoute` without a valid `Host`). Asterisk and authority forms never route.
public struct Router: Sendable {
    private let upstreams: [UpstreamConfig]
    private let unmatched: UnmatchedPolicy

    public init(upstreams: [UpstreamConfig], unmatched: UnmatchedPolicy) {
        self.upstreams = upstreams
        self.unmatched = unmatched
    }

    public func route(target: RequestTarget, hostHeader: String?) -> RouteDecision {
        switch target.form {
        case .absolute(let scheme, let host, let port):
            if let (index, usedPrefix) = bestAbsoluteMatch(host: host, path: target.path) {
                return .upstream(index: index, path: upstreamPath(index, target, usedPrefix: usedPrefix))
            }
            guard unmatched == .passthrough, scheme == "http" else { return .noRoute }
            let authority = (host.contains(":") ? "[\(host)]" : host) + (port.map { ":\($0)" } ?? "")
            return .passthrough(url: "http://\(authority)\(target.path)\(Self.querySuffix(target.query))")
        case .origin:
            let host = hostHeader.flatMap { RequestTarget.parseAuthority($0)?.host }
            if let index = bestPrefixMatch(path: target.path, host: host) {
                return .upstream(index: index, path: upstreamPath(index, target, usedPrefix: true))
            }
            if let host, let index = bestHostOnlyMatch(host: host) {
                return .upstream(index: index, path: upstreamPath(index, target, usedPrefix: false))
            }
            guard unmatched == .passthrough, let hostHeader, host != nil else { return .noRoute }
            return .passthrough(url: "http://\(hostHeader)\(target.path)\(Self.querySuffix(target.query))")
        case .asterisk, .authority:
            return .noRoute
        }
    }

    /// Absolute form: best host rank, then longest matching prefix (no prefix counts as shortest).
    private func bestAbsoluteMatch(host: String, path: String) -> (Int, Bool)? {
        var best: (index: Int, hostRank: Int, prefixRank: Int)?
        for (index, upstream) in upstreams.enumerated() {
            guard let hostRank = Self.hostRank(upstream.match.hosts, host) else { continue }
            var prefixRank = 0
            if let prefix = upstream.match.pathPrefix {
                guard Self.prefixMatches(prefix, path) else { continue }
                prefixRank = prefix.utf8.count + 1
            }
            if let current = best, (hostRank, prefixRank) <= (current.hostRank, current.prefixRank) { continue }
            best = (index, hostRank, prefixRank)
        }
        return best.map { ($0.index, $0.prefixRank > 0) }
    }

    /// Origin form, first pass: longest matching prefix, then host rank (no hosts counts as lowest).
    private func bestPrefixMatch(path: String, host: String?) -> Int? {
        var best: (index: Int, prefixRank: Int, hostRank: Int)?
        for (index, upstream) in upstreams.enumerated() {
            guard let prefix = upstream.match.pathPrefix, Self.prefixMatches(prefix, path) else { continue }
            var hostRank = 0
            if !upstream.match.hosts.isEmpty {
                guard let host, let rank = Self.hostRank(upstream.match.hosts, host) else { continue }
                hostRank = rank
            }
            let prefixRank = prefix.utf8.count
            if let current = best, (prefixRank, hostRank) <= (current.prefixRank, current.hostRank) { continue }
            best = (index, prefixRank, hostRank)
        }
        return best?.index
    }

    /// Origin form, second pass: the `Host` header against upstreams without a prefix.
    private func bestHostOnlyMatch(host: String) -> Int? {
        var best: (index: Int, hostRank: Int)?
        for (index, upstream) in upstreams.enumerated() where upstream.match.pathPrefix == nil {
            guard let rank = Self.hostRank(upstream.match.hosts, host) else { continue }
            if let current = best, rank <= current.hostRank { continue }
            best = (index, rank)
        }
        return best?.index
    }

    /// How well `host` (lowercased, no port) matches the best of `patterns`: nil for no match, the suffix length
    /// for a wildcard (a longer suffix is more specific), above every wildcard for an exact match.
    static func hostRank(_ patterns: [String], _ host: String) -> Int? {
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

    /// Base path + (prefix-stripped) path + `?query`.
    private func upstreamPath(_ index: Int, _ target: RequestTarget, usedPrefix: Bool) -> String {
        let upstream = upstreams[index]
        var path = target.path
        if usedPrefix, upstream.match.stripPrefix, let prefix = upstream.match.pathPrefix, prefix != "/" {
            path = String(path.dropFirst(prefix.count))
        }
        var joined = upstream.url.basePath + path
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
