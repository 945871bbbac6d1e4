/// Header rewriting at the proxy boundary (SPEC §3 "Forwarding"): pure functions over ordered header lists.
public enum HeaderRewriter {
    /// RFC 9110 §7.6.1 hop-by-hop fields, plus the `Proxy-*` fields aimed at this proxy.
    public static let hopByHop: Set<String> = [
        "connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization", "te",
        "trailer", "transfer-encoding", "upgrade",
    ]

    /// Lowercased names listed in every `Connection` header (comma-separated tokens).
    public static func connectionListed(in headers: [(name: String, value: String)]) -> Set<String> {
        var names: Set<String> = []
        for header in headers where header.name.asciiLowercased() == "connection" {
            for token in header.value.split(separator: ",") {
                let name = token.trimmingCharacters(in: " \t").asciiLowercased()
                if !name.isEmpty { names.insert(name) }
            }
        }
        return names
    }

    /// The headers of a client request as they go upstream: hop-by-hop and `Connection`-listed fields removed,
    /// `Host` replaced by the upstream's, framing fields (`Content-Length`, `Expect`) left to the transport,
    /// `Via: 1.1 backstop` appended.
    public static func upstreamRequestHeaders(
        _ headers: [(name: String, value: String)], upstreamHost: String
    ) -> [(name: String, value: String)] {
        let listed = connectionListed(in: headers)
        var out: [(name: String, value: String)] = []
        out.reserveCapacity(headers.count + 2)
        out.append((name: "Host", value: upstreamHost))
        var via: String?
        for header in headers {
            let lower = header.name.asciiLowercased()
            if hopByHop.contains(lower) || listed.contains(lower) { continue }
            switch lower {
            case "host", "content-length", "expect": continue
            case "via":
                via = via.map { "\($0), \(header.value)" } ?? header.value
                continue
            default: out.append(header)
            }
        }
        out.append((name: "Via", value: via.map { "\($0), 1.1 backstop" } ?? "1.1 backstop"))
        return out
    }

    /// The headers of an upstream response as they go to the client: hop-by-hop and `Connection`-listed fields
    /// and framing removed (the proxy re-frames the body), `Via` extended, `X-Backstop-Attempts` added.
    public static func clientResponseHeaders(
        _ headers: [(name: String, value: String)], attempts: Int, upstreamVersion: String
    ) -> (headers: [(name: String, value: String)], contentLength: Int?) {
        let listed = connectionListed(in: headers)
        var out: [(name: String, value: String)] = []
        out.reserveCapacity(headers.count + 2)
        var contentLength: Int?
        var via: String?
        for header in headers {
            let lower = header.name.asciiLowercased()
            if hopByHop.contains(lower) || listed.contains(lower) { continue }
            switch lower {
            case "content-length":
                contentLength = Int(header.value.trimmingCharacters(in: " \t"))
                continue
            case "via":
                via = via.map { "\($0), \(header.value)" } ?? header.value
                continue
            case "x-backstop-attempts", "x-backstop-error": continue
            default: out.append(header)
            }
        }
        let version = upstreamVersion.hasPrefix("HTTP/") ? String(upstreamVersion.dropFirst(5)) : upstreamVersion
        out.append((name: "Via", value: via.map { "\($0), \(version) backstop" } ?? "\(version) backstop"))
        out.append((name: "X-Backstop-Attempts", value: String(attempts)))
        return (out, contentLength)
    }
}

extension StringProtocol {
    /// Trims the given ASCII characters from both ends.
    func trimmingCharacters(in set: String) -> String {
        var s = self[...]
        while let f = s.first, set.contains(f) { s = s.dropFirst() }
        while let l = s.last, set.contains(l) { s = s.dropLast() }
        return String(s)
    }
}

extension StringProtocol {
    /// Lowercases ASCII letters only: header names are ASCII tokens, and this skips Unicode case mapping.
    public func asciiLowercased() -> String {
        var bytes = Array(utf8)
        var changed = false
        for i in bytes.indices where bytes[i] >= 65 && bytes[i] <= 90 {
            bytes[i] += 32
            changed = true
        }
        return changed ? String(decoding: bytes, as: UTF8.self) : String(self)
    }
}

extension String {
    /// ASCII case-insensitive comparison (header names are ASCII).
    @inlinable
    public func caseInsensitiveEquals(_ other: String) -> Bool {
        var a = self.utf8.makeIterator()
        var b = other.utf8.makeIterator()
        while true {
            let x = a.next()
            let y = b.next()
            if x == nil && y == nil { return true }
            guard let x, let y else { return false }
            if x == y { continue }
            let lx = (x >= 65 && x <= 90) ? x + 32 : x
            let ly = (y >= 65 && y <= 90) ? y + 32 : y
            if lx != ly { return false }
        }
    }
}
