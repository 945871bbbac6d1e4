/// Where a request goes (SPEC §3 "Routing"): a pure function of the request-target, the `Host` header and the
/// configured upstreams.
///
/// Rules:
/// - Absolute form (`GET http://api.example.com/x`) matches on its URL host, only against upstreams that list
///   `hosts`; an upstream that also has a `path_prefix` additionally needs the path to match it.
/// - Origin form (`GET /api/x`) matches first by `path_prefix` (longest prefix wins; a prefix matches at a
///   segment boundary: `/api` matches `/api`, `/api/x`, not `/apix`; an upstream that also lists hosts needs the
///   `Host` header to match too), then by the `Host` header (port ignored, case-insensitive).
/// - An exact host beats a wildcard; `*.a.com` matches `x.a.com` and `y.x.a.com`, not `a.com`.
/// - When the match used a prefix and `strip_prefix` is on, the prefix is removed; the rest is joined to the
///   upstream's base path (`/` when both are empty) and `?query` is appended byte for byte.
/// - No match: `noRoute`, or with `unmatched: passthrough` the request's own URL (absolute `http` form, or
///   `http://<Host><path>` for origin form).
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
            if let (index, stripped) = bestHostMatch(host: host, path: target.path, requireHosts: true) {
                return .upstream(index: index, path: join(index, stripped ? strip(index, target.path) : target.path, target.query))
            }
            guard unmatched == .passthrough, scheme == "http" else { return .noRoute }
            let authority = (host.contains(":") ? "[\(host)]" : host) + (port.map { ":\($0)" } ?? "")
            return .passthrough(url: "http://\(authority)\(target.path)\(target.query.map { "?\($0)" } ?? "")")
        case .origin:
            let host = hostHeader.flatMap { RequestTarget.parseAuthority($0)?.host }
            if let index = bestPrefixMatch(path: target.path, host: host) {
                let upstream = upstreams[index]
                let path = upstream.match.stripPrefix ? strip(index, target.path) : target.path
                return .upstream(index: index, path: join(index, path, target.query))
            }
            if let host, let (index, _) = bestHostMatch(host: host, path: target.path, requireHosts: true, prefixless: true) {
                return .upstream(index: index, path: join(index, target.path, target.query))
            }
            guard unmatched == .passthrough, let hostHeader, !hostHeader.isEmpty else { return .noRoute }
            return .passthrough(url: "http://\(hostHeader)\(target.path)\(target.query.map { "?\($0)" } ?? "")")
        case .asterisk, .authority:
            return .noRoute
        }
    }

    /// The best upstream whose hosts match `host` (exact beats wildcard, a matching prefix beats none,
    /// longer prefix beats shorter). Returns whether the match used a prefix.
    private func bestHostMatch(host: String, path: String, requireHosts: Bool, prefixless: Bool = false)
        -> (Int, Bool)?
    {
        var best: (index: Int, score: Int, usedPrefix: Bool)?
        for (index, upstream) in upstreams.enumerated() {
            guard let hostScore = Self.hostScore(upstream.match.hosts, host) else { continue }
            var score = hostScore
            var usedPrefix = false
            if let prefix = upstream.match.pathPrefix {
                if prefixless { continue }
                guard Self.prefixMatches(prefix, path) else { continue }
                score += 1000 * (prefix.count + 1)
                usedPrefix = true
            }
            if best == nil || score > best!.score { best = (index, score, usedPrefix) }
        }
        return best.map { ($0.index, $0.usedPrefix && upstreams[$0.index].match.stripPrefix) }
    }

    private func bestPrefixMatch(path: String, host: String?) -> Int? {
        var best: (index: Int, length: Int, hostScore: Int)?
        for (index, upstream) in upstreams.enumerated() {
            guard let prefix = upstream.match.pathPrefix, Self.prefixMatches(prefix, path) else { continue }
            var hostScore = 0
            if !upstream.match.hosts.isEmpty {
                guard let host, let score = Self.hostScore(upstream.match.hosts, host) else { continue }
                hostScore = score
            }
            if best == nil || prefix.count > best!.length || (prefix.count == best!.length && hostScore > best!.hostScore) {
                best = (index, prefix.count, hostScore)
            }
        }
        return best?.index
    }

    /// 2 for an exact match, 1 for a wildcard match, nil for none.
    static func hostScore(_ patterns: [String], _ host: String) -> Int? {
        var score: Int?
        for pattern in patterns {
            if pattern == host { return 2 }
            if pattern.hasPrefix("*.") {
                let suffix = pattern.dropFirst(1)  // ".a.com"
                if host.hasSuffix(suffix) && host.count > suffix.count { score = 1 }
            }
        }
        return score
    }

    static func prefixMatches(_ prefix: String, _ path: String) -> Bool {
        if prefix == "/" { return path.hasPrefix("/") }
        guard path.hasPrefix(prefix) else { return false }
        if path.count == prefix.count { return true }
        return path[path.index(path.startIndex, offsetBy: prefix.count)] == "/"
    }

    private func strip(_ index: Int, _ path: String) -> String {
        guard let prefix = upstreams[index].match.pathPrefix, prefix != "/", path.hasPrefix(prefix) else { return path }
        return String(path.dropFirst(prefix.count))
    }

    private func join(_ index: Int, _ path: String, _ query: String?) -> String {
        let base = upstreams[index].url.basePath
        var joined = base + path
        if joined.isEmpty { joined = "/" }
        if let query { joined += "?" + query }
        return joined
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
