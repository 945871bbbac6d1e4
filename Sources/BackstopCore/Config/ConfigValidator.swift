/// Semantic checks across sections, run after every section parsed: upstream names unique, no two upstreams
/// claiming the same requests, auth only with a keychain. Each problem is reported at the later of the two nodes.
enum ConfigValidator {
    /// `upstreams` and `sites` run in parallel (one site per upstream).
    static func validate(upstreams: [UpstreamConfig], sites: [UpstreamSite], hasKeychain: Bool) -> [ConfigError] {
        var errors: [ConfigError] = []
        func site(_ i: Int) -> UpstreamSite { sites[i] }
        var firstByName: [String: Int] = [:]
        for (i, upstream) in upstreams.enumerated() {
            if let first = firstByName[upstream.name] {
                errors.append(ConfigError(
                    location: site(i).name,
                    message: "duplicate upstream name '\(upstream.name)' (first defined at line \(site(first).name.line))"))
            } else {
                firstByName[upstream.name] = i
            }
        }
        errors += overlaps(upstreams, site: site)
        if !hasKeychain {
            for (i, upstream) in upstreams.enumerated() where upstream.auth != .none {
                errors.append(ConfigError(
                    location: site(i).auth ?? site(i).name,
                    message: "upstream '\(upstream.name)' uses auth but the config has no 'keychain' section"))
            }
        }
        return errors
    }

    /// Two upstreams overlap when the router could not tell them apart: the same host pattern with the same
    /// path_prefix (or both without one), or the same path_prefix with no hosts on either. Different host patterns
    /// or prefixes are fine (exact beats wildcard, longest prefix wins).
    private static func overlaps(_ upstreams: [UpstreamConfig], site: (Int) -> UpstreamSite) -> [ConfigError] {
        struct Claim: Hashable {
            var host: String?
            var prefix: String?
        }
        var errors: [ConfigError] = []
        var claims: [Claim: Int] = [:]
        for (i, upstream) in upstreams.enumerated() {
            let match = upstream.match
            // A match that failed to parse was reported already; it claims nothing.
            if match.hosts.isEmpty && match.pathPrefix == nil { continue }
            var mine: [(Claim, SourceLocation?)] = []
            if match.hosts.isEmpty {
                mine = [(Claim(host: nil, prefix: match.pathPrefix), match.pathPrefixLocation)]
            } else {
                for (h, host) in match.hosts.enumerated() {
                    let at = h < match.hostLocations.count ? match.hostLocations[h] : nil
                    mine.append((Claim(host: host, prefix: match.pathPrefix), at))
                }
            }
            for (claim, location) in mine {
                guard let other = claims[claim] else {
                    claims[claim] = i
                    continue
                }
                let what = claim.host.map { "host '\($0)'" + (claim.prefix.map { " with path_prefix '\($0)'" } ?? "") }
                    ?? "path_prefix '\(claim.prefix ?? "")'"
                errors.append(ConfigError(
                    location: location ?? upstream.location ?? site(i).name,
                    message: "upstream '\(upstream.name)' overlaps upstream '\(upstreams[other].name)': both match \(what)"))
            }
        }
        return errors
    }
}
