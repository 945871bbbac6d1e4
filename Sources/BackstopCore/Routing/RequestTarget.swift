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
    /// Works on the UTF-8 bytes: this runs for every origin-form request (the `Host` header).
    public static func parseAuthority(_ authority: String) -> (host: String, port: Int?)? {
        var bytes = Array(authority.utf8)
        guard !bytes.isEmpty else { return nil }
        var hostRange: Range<Int>
        var portStart: Int?
        if bytes[0] == UInt8(ascii: "[") {
            guard let close = bytes.firstIndex(of: UInt8(ascii: "]")) else { return nil }
            hostRange = 1..<close
            if close + 1 < bytes.count {
                guard bytes[close + 1] == UInt8(ascii: ":") else { return nil }
                portStart = close + 2
            }
            guard !hostRange.isEmpty, bytes[hostRange].allSatisfy({ isHex($0) || $0 == 58 || $0 == 46 }) else { return nil }
        } else {
            let colon = bytes.firstIndex(of: UInt8(ascii: ":"))
            hostRange = 0..<(colon ?? bytes.count)
            if let colon {
                guard !bytes[(colon + 1)...].contains(UInt8(ascii: ":")) else { return nil }
                portStart = colon + 1
            }
            guard !hostRange.isEmpty, bytes[hostRange].allSatisfy(isHostByte) else { return nil }
        }
        var port: Int?
        if let portStart {
            let digits = bytes[portStart...]
            guard !digits.isEmpty, digits.count <= 5, digits.allSatisfy({ $0 >= 48 && $0 <= 57 }) else { return nil }
            let value = digits.reduce(0) { $0 * 10 + Int($1 - 48) }
            guard value <= 65535 else { return nil }
            port = value
        }
        for i in hostRange where bytes[i] >= 65 && bytes[i] <= 90 { bytes[i] += 32 }
        return (String(decoding: bytes[hostRange], as: UTF8.self), port)
    }

    private static func isHex(_ b: UInt8) -> Bool {
        (b >= 48 && b <= 57) || (b >= 65 && b <= 70) || (b >= 97 && b <= 102)
    }

    /// RFC 3986 reg-name bytes: unreserved, pct-encoded, sub-delims.
    private static func isHostByte(_ b: UInt8) -> Bool {
        switch b {
        case 48...57, 65...90, 97...122: true
        case UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "~"), UInt8(ascii: "%"),
            UInt8(ascii: "!"), UInt8(ascii: "$"), UInt8(ascii: "&"), UInt8(ascii: "'"), UInt8(ascii: "("),
            UInt8(ascii: ")"), UInt8(ascii: "*"), UInt8(ascii: "+"), UInt8(ascii: ","), UInt8(ascii: ";"),
            UInt8(ascii: "="):
            true
        default: false
        }
    }
}

extension Character {
    var isASCIIDigit: Bool { ("0"..."9").contains(self) }
}
