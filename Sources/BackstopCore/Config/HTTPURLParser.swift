/// Splits an `http://` or `https://` URL from the config (`url`, `auth.token_url`) into parts, or says what is
/// wrong with it in words an operator can act on.
enum HTTPURLParser {
    struct Parts: Equatable {
        var scheme: String
        /// Lowercased, IPv6 without brackets.
        var host: String
        var port: Int?
        /// Everything from the first `/` up to `?`; empty when the URL has no path.
        var path: String
        var query: String?
    }

    static func parse(_ text: String) -> Result<Parts, Problem> {
        guard text.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F }) else { return .failure(.characters) }
        guard let (rawScheme, rest) = text.splitOnce("://") else { return .failure(.scheme) }
        let scheme = rawScheme.asciiLowercased()
        guard scheme == "http" || scheme == "https" else { return .failure(.scheme) }
        if rest.contains("#") { return .failure(.fragment) }
        let authorityEnd = rest.firstIndex { $0 == "/" || $0 == "?" } ?? rest.endIndex
        let authority = rest[..<authorityEnd]
        if authority.contains("@") { return .failure(.userInfo) }
        guard let (host, port) = RequestTarget.parseAuthority(String(authority)) else { return .failure(.host) }
        let tail = rest[authorityEnd...]
        if let mark = tail.firstIndex(of: "?") {
            return .success(
                Parts(
                    scheme: scheme, host: host, port: port, path: String(tail[..<mark]),
                    query: String(tail[tail.index(after: mark)...])))
        }
        return .success(Parts(scheme: scheme, host: host, port: port, path: String(tail), query: nil))
    }

    enum Problem: Error, Equatable, CustomStringConvertible {
        case characters, scheme, fragment, userInfo, host

        var description: String {
            switch self {
            case .characters: "must not contain spaces, control or non-ASCII characters"
            case .scheme: "must start with http:// or https://"
            case .fragment: "must not have a #fragment"
            case .userInfo: "must not contain user:password@ (credentials belong in the keychain)"
            case .host: "needs a valid host[:port] (port 0-65535, IPv6 in brackets)"
            }
        }
    }
}
