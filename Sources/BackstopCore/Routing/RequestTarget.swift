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
    /// send one, RFC 9112 §3.2). Works on the UTF-8 bytes in one pass: this runs for every request.
    public static func parse(_ raw: String) -> RequestTarget? {
        var raw = raw
        return raw.withUTF8 { parse(bytes: $0) }
    }

    private static func parse(bytes all: UnsafeBufferPointer<UInt8>) -> RequestTarget? {
        guard !all.isEmpty else { return nil }
        var end = all.count
        for (i, b) in all.enumerated() {
            // Control characters, spaces and non-ASCII never belong in a request-target.
            guard b > 0x20 && b < 0x7F else { return nil }
            if b == UInt8(ascii: "#") && end == all.count { end = i }
        }
        let text = UnsafeBufferPointer(rebasing: all[0..<end])
        if text.count == 1 && text[0] == UInt8(ascii: "*") {
            return RequestTarget(form: .asterisk, path: "", query: nil)
        }
        if text.first == UInt8(ascii: "/") {
            let (path, query) = splitQuery(text, prependSlash: false)
            return RequestTarget(form: .origin, path: path, query: query)
        }
        if let colon = text.firstIndex(of: UInt8(ascii: ":")), colon + 2 < text.count,
            text[colon + 1] == UInt8(ascii: "/"), text[colon + 2] == UInt8(ascii: "/")
        {
            let scheme: String
            if equalsIgnoringCase(text[0..<colon], "http") {
                scheme = "http"
            } else if equalsIgnoringCase(text[0..<colon], "https") {
                scheme = "https"
            } else {
                return nil
            }
            let restStart = colon + 3
            var authorityEnd = restStart
            while authorityEnd < text.count, text[authorityEnd] != UInt8(ascii: "/"),
                text[authorityEnd] != UInt8(ascii: "?")
            {
                authorityEnd += 1
            }
            let authority = UnsafeBufferPointer(rebasing: text[restStart..<authorityEnd])
            guard !authority.contains(UInt8(ascii: "@")), let (host, port) = parseAuthority(bytes: authority) else {
                return nil
            }
            let remainder = UnsafeBufferPointer(rebasing: text[authorityEnd...])
            let (path, query) = splitQuery(remainder, prependSlash: remainder.first != UInt8(ascii: "/"))
            return RequestTarget(form: .absolute(scheme: scheme, host: host, port: port), path: path, query: query)
        }
        if let (host, port) = parseAuthority(bytes: text), port != nil {
            return RequestTarget(form: .authority(host: host, port: port), path: "", query: nil)
        }
        return nil
    }

    /// Path and query of `text` (which starts at the path, or at `?`, or is empty when `prependSlash` says the
    /// path needs a leading `/`).
    private static func splitQuery(_ text: UnsafeBufferPointer<UInt8>, prependSlash: Bool) -> (String, String?) {
        let mark = text.firstIndex(of: UInt8(ascii: "?")) ?? text.count
        var path = String(decoding: UnsafeBufferPointer(rebasing: text[0..<mark]), as: UTF8.self)
        if prependSlash { path = "/" + path }
        guard mark < text.count else { return (path, nil) }
        return (path, String(decoding: UnsafeBufferPointer(rebasing: text[(mark + 1)...]), as: UTF8.self))
    }

    private static func equalsIgnoringCase(
        _ bytes: Slice<UnsafeBufferPointer<UInt8>>, _ lowercase: StaticString
    ) -> Bool {
        guard bytes.count == lowercase.utf8CodeUnitCount else { return false }
        let expected = UnsafeBufferPointer(start: lowercase.utf8Start, count: lowercase.utf8CodeUnitCount)
        for (b, e) in zip(bytes, expected) where (b >= 65 && b <= 90 ? b + 32 : b) != e { return false }
        return true
    }

    /// `host`, `host:port`, `[v6]`, `[v6]:port` → lowercased host and optional port; nil when malformed.
    /// Works on the UTF-8 bytes: this runs for every origin-form request (the `Host` header).
    public static func parseAuthority(_ authority: String) -> (host: String, port: Int?)? {
        authority.withUTF8Bytes { parseAuthority(bytes: $0) }
    }

    private static func parseAuthority(bytes: UnsafeBufferPointer<UInt8>) -> (host: String, port: Int?)? {
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
            guard !hostRange.isEmpty, bytes[hostRange].allSatisfy({ isHex($0) || $0 == 58 || $0 == 46 }) else {
                return nil
            }
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
            guard let value = HTTPSyntax.decimal(bytes[portStart...], maxDigits: 5), value <= 65535 else { return nil }
            port = value
        }
        let hostBytes = UnsafeBufferPointer(rebasing: bytes[hostRange])
        let host: String
        if hostBytes.contains(where: { $0 >= 65 && $0 <= 90 }) {
            host = String(asciiLowercasing: hostBytes)
        } else {
            host = String(decoding: hostBytes, as: UTF8.self)
        }
        return (host, port)
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

extension RequestTarget {
    /// Whether the path has a `.` or `..` segment in any spelling a server behind Backstop might decode
    /// (`DotSegments`). Such a path is refused before routing: joined to an upstream's base path it could climb out
    /// of it with the injected token attached (docs/reference/behaviour.md#dot-segments).
    public var hasDotSegment: Bool { DotSegments.isSuspect(path.utf8) }
}

extension Character {
    var isASCIIDigit: Bool { ("0"..."9").contains(self) }
}
