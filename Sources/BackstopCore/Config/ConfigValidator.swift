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

    /// Two upstreams overlap when the router could not tell them apart: they share an exact host pattern (for
    /// `Host`/URL matching) or an identical `path_prefix` (for origin-form matching); the two are independent ways
    /// to reach an upstream (docs/reference/behaviour.md#routing). Different patterns are fine: exact beats
    /// wildcard, longest prefix wins.
    private static func overlaps(_ upstreams: [UpstreamConfig], site: (Int) -> UpstreamSite) -> [ConfigError] {
        enum Claim: Hashable {
            case host(String)
            case prefix(String)
        }
        var errors: [ConfigError] = []
        var claims: [Claim: Int] = [:]
        for (i, upstream) in upstreams.enumerated() {
            let match = upstream.match
            var mine: [(Claim, SourceLocation?)] = []
            for (h, host) in match.hosts.enumerated() {
                mine.append((.host(host), h < match.hostLocations.count ? match.hostLocations[h] : nil))
            }
            if let prefix = match.pathPrefix { mine.append((.prefix(prefix), match.pathPrefixLocation)) }
            for (claim, location) in mine {
                guard let other = claims[claim] else {
                    claims[claim] = i
                    continue
                }
                let what: String
                switch claim {
                case .host(let host): what = "host '\(host)'"
                case .prefix(let prefix): what = "path_prefix '\(prefix)'"
                }
                errors.append(ConfigError(
                    location: location ?? upstream.location ?? site(i).name,
                    message: "upstream '\(upstream.name)' overlaps upstream '\(upstreams[other].name)': both match \(what)"))
            }
        }
        return errors
    }

    /// The rules for `intercept: true` (docs/reference/https-clients.md#interception): the local CA needs the
    /// `intercept` section and a keychain; the upstream needs host names to mint leaves for, verification on, and an
    /// https url (unless loopback: the app believes it speaks TLS to the real host).
    static func validateInterception(
        upstreams: [UpstreamConfig], sites: [UpstreamSite], config: Config, interceptSection: SourceLocation?
    ) -> [ConfigError] {
        var errors: [ConfigError] = []
        if let interceptSection, config.keychain == nil {
            errors.append(ConfigError(
                location: interceptSection,
                message: "'intercept' needs a 'keychain' section: the root CA lives in the keychain"))
        }
        for (i, upstream) in upstreams.enumerated() where upstream.intercept {
            let at = sites[i].intercept ?? sites[i].name
            let name = "upstream '\(upstream.name)'"
            if config.intercept == nil {
                errors.append(ConfigError(location: at, message: "\(name) has intercept: true but the config has no "
                    + "'intercept' section (intercept: {ca_entry: ca/root}; create the CA with 'backstop ca init')"))
            }
            if config.keychain == nil {
                errors.append(ConfigError(
                    location: at, message: "\(name) has intercept: true but the config has no 'keychain' section"))
            }
            if upstream.match.hosts.isEmpty {
                errors.append(ConfigError(location: at, message: "\(name) has intercept: true but no match.hosts "
                    + "(CONNECT is matched on host names)"))
            }
            for (h, host) in upstream.match.hosts.enumerated() where IPAddressParser.parse(host) != nil {
                let location = h < upstream.match.hostLocations.count ? upstream.match.hostLocations[h] : at
                errors.append(ConfigError(location: location, message: "\(name) intercepts, so its match.hosts must be "
                    + "host names, not the IP address '\(host)' (leaves are minted for names)"))
            }
            if upstream.tls.insecureSkipVerify {
                errors.append(ConfigError(location: at, message: "\(name) has intercept: true together with "
                    + "tls.insecure_skip_verify: the client trusts Backstop to verify the real upstream"))
            }
            // Every endpoint: a retry or a failover may land on any of them.
            for endpoint in upstream.endpoints where endpoint.scheme != "https" && !IPAddressParser.isLoopback(endpoint.host) {
                let what = upstream.endpoints.count == 1 ? "its url" : "its endpoint \(endpoint.endpointKey)"
                errors.append(ConfigError(location: at, message: "\(name) has intercept: true, so \(what) must be "
                    + "https (the client believes it speaks TLS to \(endpoint.host)); plain http only to loopback"))
            }
        }
        return errors
    }
}
