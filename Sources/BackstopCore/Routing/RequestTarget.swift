/// A parsed HTTP request-target (RFC 9112 §3.2): what the client put between the method and the version.
public struct RequestTarget: Sendable, Equatable {
    /// Which of the four request-target forms it was.
    public enum Form: Sendable, Equatable {
        /// `/path?query`, sent to an origin (or to Backstop as an API base URL).
        case origin
        /// `http://host:port/path?query`, sent to a proxy. `host` is lowercased, IPv6 without brackets.
        case absolute(scheme: String, host: String, port: Int?)
        /// `*` (server-wide OPTIONS).
        case asterisk
        /// `host:port`, only used by CONNECT.
        case authority(host: String, port: Int?)
    }

    public var form: Form
    /// The path, starting with `/` for origin and absolute forms (`/` when an absolute URL had none).
    public var path: String
    /// The bytes after `?`, exactly as sent; nil when there was no `?`.
    public var query: String?

    public init(form: Form, path: String, query: String?) {
        self.form = form
        self.path = path
        self.query = query
    }

    /// Parses a request-target; nil means it is malformed (→ 400). A `#fragment` is dropped (clients must not
    /// send one, RFC 9112 §3.2).
    public static func parse(_ raw: String) -> RequestTarget? {
        let bytes = Array(raw.utf8)
        guard !bytes.isEmpty else { return nil }
        // Control characters, spaces and non-ASCII never belong in a request-target.
        guard bytes.allSatisfy({ $0 > 0x20 && $0 < 0x7F }) else { return nil }
        var text = raw
        if let hash = text.firstIndex(of: "#") { text = String(text[..<hash]) }
        if text == "*" { return RequestTarget(form: .asterisk, path: "", query: nil) }
        if text.hasPrefix("/") {
            let (path, query) = splitQuery(text)
            return RequestTarget(form: .origin, path: path, query: query)
        }
        if let colon = text.firstIndex(of: ":"), text[colon...].hasPrefix("://") {
            let scheme = text[..<colon].asciiLowercased()
            guard scheme == "http" || scheme == "https" else { return nil }
            let rest = text[text.index(colon, offsetBy: 3)...]
            let authorityEnd = rest.firstIndex { $0 == "/" || $0 == "?" } ?? rest.endIndex
            let authority = String(rest[..<authorityEnd])
            guard !authority.contains("@"), let (host, port) = parseAuthority(authority) else { return nil }
            var remainder = String(rest[authorityEnd...])
            if remainder.hasPrefix("?") { remainder = "/" + remainder }
            if remainder.isEmpty { remainder = "/" }
            let (path, query) = splitQuery(remainder)
            return RequestTarget(form: .absolute(scheme: scheme, host: host, port: port), path: path, query: query)
        }
        if let (host, port) = parseAuthority(text), port != nil {
            return RequestTarget(form: .authority(host: host, port: port), path: "", query: nil)
        }
        return nil
    }

    private static func splitQuery(_ text: String) -> (String, String?) {
        guard let mark = text.firstIndex(of: "?") else { return (text, nil) }
        return (String(text[..<mark]), String(text[text.index(after: mark)...]))
    }

    /// `host`, `host:port`, `[v6]`, `[v6]:port` → lowercased host and optional port; nil when malformed.
    public static func parseAuthority(_ authority: String) -> (host: String, port: Int?)? {
        guard !authority.isEmpty else { return nil }
        var host: Substring
        var portText: Substring?
        if authority.hasPrefix("[") {
            guard let close = authority.firstIndex(of: "]") else { return nil }
            host = authority[authority.index(after: authority.startIndex)..<close]
            let after = authority[authority.index(after: close)...]
            if !after.isEmpty {
                guard after.hasPrefix(":") else { return nil }
                portText = after.dropFirst()
            }
            guard !host.isEmpty, host.allSatisfy({ $0.isHexDigit || $0 == ":" || $0 == "." }) else { return nil }
        } else {
            let parts = authority.split(separator: ":", omittingEmptySubsequences: false)
            guard parts.count <= 2 else { return nil }
            host = parts[0]
            if parts.count == 2 { portText = parts[1] }
            let allowed: (Character) -> Bool = { $0.isLetter || $0.isNumber || "-._~%!$&'()*+,;=".contains($0) }
            guard !host.isEmpty, host.allSatisfy(allowed) else { return nil }
        }
        var port: Int?
        if let portText {
            guard !portText.isEmpty, portText.count <= 5, portText.allSatisfy(\.isASCIIDigit),
                let value = Int(portText), value <= 65535
            else { return nil }
            port = value
        }
        return (host.asciiLowercased(), port)
    }
}

extension Character {
    var isASCIIDigit: Bool { ("0"..."9").contains(self) }
}
