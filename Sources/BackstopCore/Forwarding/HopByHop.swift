/// Header rewriting at the proxy boundary (SPEC §3 "Forwarding"): pure functions over ordered header lists.
public enum HeaderRewriter {
    /// What a header name means to the proxy; decided without allocating (this runs for every header).
    /// Hop-by-hop: RFC 9110 §7.6.1 (`Connection`, `Keep-Alive`, `TE`, `Trailer`, `Transfer-Encoding`,
    /// `Upgrade`) plus `Proxy-Connection`, `Proxy-Authenticate` and `Proxy-Authorization`, aimed at this proxy.
    enum Kind {
        case hopByHop, host, contentLength, expect, via, backstopOwn, other
    }

    static func classify(_ name: String) -> Kind {
        func named(_ candidate: String) -> Bool { name.caseInsensitiveEquals(candidate) }
        switch name.utf8.count {
        case 2: return named("te") ? .hopByHop : .other
        case 3: return named("via") ? .via : .other
        case 4: return named("host") ? .host : .other
        case 6: return named("expect") ? .expect : .other
        case 7: return named("upgrade") || named("trailer") ? .hopByHop : .other
        case 10: return named("connection") || named("keep-alive") ? .hopByHop : .other
        case 14: return named("content-length") ? .contentLength : .other
        case 16:
            if named("proxy-connection") { return .hopByHop }
            return named("x-backstop-error") ? .backstopOwn : .other
        case 17: return named("transfer-encoding") ? .hopByHop : .other
        case 18: return named("proxy-authenticate") ? .hopByHop : .other
        case 19:
            if named("proxy-authorization") { return .hopByHop }
            return named("x-backstop-attempts") ? .backstopOwn : .other
        default: return .other
        }
    }

    /// Lowercased names listed in every `Connection` header (comma-separated tokens).
    public static func connectionListed(in headers: [(name: String, value: String)]) -> Set<String> {
        var names: Set<String> = []
        for header in headers where header.name.caseInsensitiveEquals("connection") {
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
            switch classify(header.name) {
            case .hopByHop, .host, .contentLength, .expect: continue
            case .via:
                via = via.map { "\($0), \(header.value)" } ?? header.value
            case .backstopOwn, .other:
                if !listed.isEmpty && listed.contains(header.name.asciiLowercased()) { continue }
                out.append(header)
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
            switch classify(header.name) {
            case .hopByHop, .backstopOwn: continue
            case .contentLength:
                contentLength = Int(header.value.trimmingCharacters(in: " \t"))
            case .via:
                via = via.map { "\($0), \(header.value)" } ?? header.value
            case .host, .expect, .other:
                if !listed.isEmpty && listed.contains(header.name.asciiLowercased()) { continue }
                out.append(header)
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
