/// Semantic checks across sections (run after every section parsed): uniqueness, overlaps, cross references.
enum ConfigValidator {
    static func validate(_ config: Config, file: String) -> [ConfigError] {
        var errors: [ConfigError] = []
        func at(_ upstream: UpstreamConfig) -> SourceLocation {
            upstream.location ?? SourceLocation(file: file, line: 1, column: 1)
        }
        var names: [String: UpstreamConfig] = [:]
        for upstream in config.upstreams {
            if let first = names[upstream.name] {
                errors.append(ConfigError(
                    location: at(upstream),
                    message: "duplicate upstream name '\(upstream.name)' (first defined at line \(at(first).line))"))
            } else {
                names[upstream.name] = upstream
            }
        }
        // Two upstreams overlap when some request would match both equally: the same host pattern with the same
        // path prefix (or both none), or the same prefix with no hosts on either.
        var claims: [String: UpstreamConfig] = [:]
        for upstream in config.upstreams {
            let prefix = upstream.match.pathPrefix ?? ""
            var keys: [(String, SourceLocation?)] = []
            if upstream.match.hosts.isEmpty {
                keys = [("*any*|\(prefix)", upstream.match.pathPrefixLocation)]
            } else {
                for (i, host) in upstream.match.hosts.enumerated() {
                    let location = i < upstream.match.hostLocations.count ? upstream.match.hostLocations[i] : nil
                    keys.append(("\(host)|\(prefix)", location))
                }
            }
            for (key, location) in keys {
                if let other = claims[key], other.name != upstream.name {
                    let what = key.hasPrefix("*any*|") ? "path_prefix '\(prefix)'" :
                        "host '\(key.split(separator: "|").first!)'" + (prefix.isEmpty ? "" : " with path_prefix '\(prefix)'")
                    errors.append(ConfigError(
                        location: location ?? at(upstream),
                        message: "upstream '\(upstream.name)' overlaps upstream '\(other.name)': both match \(what)"))
                } else {
                    claims[key] = upstream
                }
            }
        }
        for upstream in config.upstreams {
            switch upstream.auth {
            case .none: break
            case .staticToken, .oauth2:
                if config.keychain == nil {
                    errors.append(ConfigError(
                        location: at(upstream),
                        message: "upstream '\(upstream.name)' uses auth but the config has no 'keychain' section"))
                }
            }
        }
        return errors
    }
}
