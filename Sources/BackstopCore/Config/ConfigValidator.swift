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
                errors.append(
                    ConfigError(
                        location: site(i).name,
                        message:
                            "duplicate upstream name '\(upstream.name)' (first defined at line \(site(first).name.line))"
                    ))
            } else {
                firstByName[upstream.name] = i
            }
        }
        errors += overlaps(upstreams, site: site)
        // One keychain_prefix holds one grant's tokens: shared by upstreams of another token endpoint or client,
        // one upstream's token would be sent to the other (and its refresh token to another identity provider).
        var firstByPrefix: [String: (index: Int, config: OAuth2Config)] = [:]
        for (i, upstream) in upstreams.enumerated() {
            guard case .oauth2(let oauth) = upstream.auth else { continue }
            guard let first = firstByPrefix[oauth.keychainPrefix] else {
                firstByPrefix[oauth.keychainPrefix] = (i, oauth)
                continue
            }
            if first.config.tokenURL != oauth.tokenURL || first.config.clientID != oauth.clientID
                || first.config.grant != oauth.grant
            {
                errors.append(
                    ConfigError(
                        location: site(i).auth ?? site(i).name,
                        message:
                            "upstream '\(upstream.name)' shares auth.keychain_prefix '\(oauth.keychainPrefix)' with "
                            + "upstream '\(upstreams[first.index].name)' (line \(site(first.index).name.line)), whose "
                            + "token_url, client_id or grant differ: each would be sent the other's tokens; give each "
                            + "its own keychain_prefix"))
            }
        }
        if !hasKeychain {
            for (i, upstream) in upstreams.enumerated() where upstream.auth != .none {
                errors.append(
                    ConfigError(
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
                errors.append(
                    ConfigError(
                        location: location ?? upstream.location ?? site(i).name,
                        message:
                            "upstream '\(upstream.name)' overlaps upstream '\(upstreams[other].name)': both match \(what)"
                    ))
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
            errors.append(
                ConfigError(
                    location: interceptSection,
                    message: "'intercept' needs a 'keychain' section: the root CA lives in the keychain"))
        }
        for (i, upstream) in upstreams.enumerated() where upstream.intercept {
            let at = sites[i].intercept ?? sites[i].name
            let name = "upstream '\(upstream.name)'"
            if config.intercept == nil {
                errors.append(
                    ConfigError(
                        location: at,
                        message: "\(name) has intercept: true but the config has no "
                            + "'intercept' section (intercept: {ca_entry: ca/root}; create the CA with 'backstop ca init')"
                    ))
            }
            if config.keychain == nil {
                errors.append(
                    ConfigError(
                        location: at, message: "\(name) has intercept: true but the config has no 'keychain' section"))
            }
            if upstream.match.hosts.isEmpty {
                errors.append(
                    ConfigError(
                        location: at,
                        message: "\(name) has intercept: true but no match.hosts "
                            + "(CONNECT is matched on host names)"))
            }
            for (h, host) in upstream.match.hosts.enumerated() where IPAddressParser.parse(host) != nil {
                let location = h < upstream.match.hostLocations.count ? upstream.match.hostLocations[h] : at
                errors.append(
                    ConfigError(
                        location: location,
                        message: "\(name) intercepts, so its match.hosts must be "
                            + "host names, not the IP address '\(host)' (leaves are minted for names)"))
            }
            if upstream.tls.insecureSkipVerify {
                errors.append(
                    ConfigError(
                        location: at,
                        message: "\(name) has intercept: true together with "
                            + "tls.insecure_skip_verify: the client trusts Backstop to verify the real upstream"))
            }
            // Every endpoint: a retry or a failover may land on any of them.
            for endpoint in upstream.endpoints
            where endpoint.scheme != "https" && !IPAddressParser.isLoopback(endpoint.host) {
                let what = upstream.endpoints.count == 1 ? "its url" : "its endpoint \(endpoint.endpointKey)"
                errors.append(
                    ConfigError(
                        location: at,
                        message: "\(name) has intercept: true, so \(what) must be "
                            + "https (the client believes it speaks TLS to \(endpoint.host)); plain http only to loopback"
                    ))
            }
        }
        return errors
    }

    /// The cross-section rules of upstream identity and client identity (docs/reference/config.md#validation):
    /// certificates and signatures only where they cannot be read on the wire, and `clients` naming real upstreams.
    static func validateIdentity(
        upstreams: [UpstreamConfig], sites: [UpstreamSite], config: Config, clientSites: [ClientSite]
    ) -> [ConfigError] {
        var errors: [ConfigError] = []
        for (i, upstream) in upstreams.enumerated() {
            let name = "upstream '\(upstream.name)'"
            let plainRemote = upstream.url.scheme != "https" && !IPAddressParser.isLoopback(upstream.url.host)
            if upstream.tls.clientCertEntry != nil && config.keychain == nil {
                errors.append(
                    ConfigError(
                        location: sites[i].clientCert ?? sites[i].name,
                        message:
                            "\(name): tls.client_cert_entry needs a 'keychain' section (the certificate lives there)"))
            }
            if upstream.tls.clientCertEntry != nil && upstream.url.scheme != "https" {
                errors.append(
                    ConfigError(
                        location: sites[i].clientCert ?? sites[i].name,
                        message:
                            "\(name): tls.client_cert_entry needs an https url (a client certificate is presented in "
                            + "the TLS handshake)"))
            }
            if case .awsSigV4 = upstream.auth, plainRemote {
                // A signature is valid for minutes and readable on a plain connection: replayable by anyone on path.
                errors.append(
                    ConfigError(
                        location: sites[i].auth ?? sites[i].name,
                        message: "\(name): aws_sigv4 needs an https url (plain http only to a loopback host)"))
            }
        }
        guard let clients = config.clients else { return errors }
        let known = Set(upstreams.map(\.name))
        for site in clientSites {
            for (upstream, location) in site.upstreams where !known.contains(upstream) {
                var message = "unknown upstream '\(upstream)' in clients"
                if let suggestion = NodeReader.closest(upstream, upstreams.map(\.name)) {
                    message += "; did you mean '\(suggestion)'?"
                }
                errors.append(ConfigError(location: location, message: message))
            }
        }
        if config.keychain == nil {
            for (client, site) in zip(clients, clientSites) {
                guard case .proxyAuth = client.match else { continue }
                errors.append(
                    ConfigError(
                        location: site.match,
                        message:
                            "client '\(client.name)': proxy_auth needs a 'keychain' section (the credentials live there)"
                    ))
            }
        }
        // Basic credentials travel in clear: only over connections that never leave the host.
        let remote = config.listeners.first { listener in
            if case .tcp(let host, _) = listener.address { return !IPAddressParser.isLoopback(host) }
            return false
        }
        if let remote {
            for (client, site) in zip(clients, clientSites) {
                guard case .proxyAuth = client.match else { continue }
                errors.append(
                    ConfigError(
                        location: site.match,
                        message:
                            "client '\(client.name)': proxy_auth is only allowed when every listener is loopback or a "
                            + "unix socket (the password is sent in clear, and listener \(remote.address) is not local)"
                    ))
            }
        }
        return errors
    }

    /// An intercepting host pattern must not cover a public suffix (docs/reference/https-clients.md#what-check-refuses):
    /// the intermediate's name constraint for `*.github.io` or `amazonaws.com` permits every name below it, so a
    /// leaked intermediate could sign for sites of every owner registered there. `list` is read only when an
    /// upstream intercepts.
    static func validateInterceptedSuffixes(
        upstreams: [UpstreamConfig], sites: [UpstreamSite],
        list: () -> Result<PublicSuffixList, PublicSuffixListUnavailable>
    ) -> [ConfigError] {
        let intercepting = upstreams.indices.filter { upstreams[$0].intercept && !upstreams[$0].match.hosts.isEmpty }
        guard let first = intercepting.first else { return [] }
        let suffixes: PublicSuffixList
        switch list() {
        case .success(let loaded): suffixes = loaded
        case .failure(let unavailable):
            return [
                ConfigError(location: sites[first].intercept ?? sites[first].name, message: unavailable.description)
            ]
        }
        var errors: [ConfigError] = []
        for i in intercepting {
            let upstream = upstreams[i]
            for (h, host) in upstream.match.hosts.enumerated() where IPAddressParser.parse(host) == nil {
                let name = host.hasPrefix("*.") ? String(host.dropFirst(2)) : host
                guard let suffix = suffixes.suffixCovered(by: name) else { continue }
                let location =
                    h < upstream.match.hostLocations.count
                    ? upstream.match.hostLocations[h]
                    : (sites[i].intercept ?? sites[i].name)
                let what =
                    suffix == name
                    ? "'\(name)' is a public suffix" : "'\(name)' has the public suffix '\(suffix)' below it"
                errors.append(
                    ConfigError(
                        location: location,
                        message: "upstream '\(upstream.name)' intercepts "
                            + "'\(host)', but \(what) (Public Suffix List): the interception CA would be allowed to sign for "
                            + "sites of other owners registered there; list the hosts this upstream serves instead"))
            }
        }
        return errors
    }
}

/// The Public Suffix List could not be read; interception needs it for `check`.
struct PublicSuffixListUnavailable: Error, CustomStringConvertible {
    var path: String
    var reason: String
    var description: String {
        "an upstream intercepts, and checking its hosts needs the Public Suffix List, but \(path) cannot be used "
            + "(\(reason)): install Debian's publicsuffix package, or point BACKSTOP_PUBLIC_SUFFIX_LIST at a copy"
    }
}
