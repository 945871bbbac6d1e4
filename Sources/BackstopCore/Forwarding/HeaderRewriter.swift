/// Header rewriting of client requests at the proxy boundary (docs/reference/behaviour.md#forwarding); responses are rewritten
/// on their bytes by `UpstreamHeadParser`.
public enum HeaderRewriter {
    /// Lowercased names listed in every `Connection` header (comma-separated tokens).
    public static func connectionListed(in headers: [(name: String, value: String)]) -> [String] {
        var names: [String] = []
        for header in headers where HeaderName.classify(header.name) == .hopByHop {
            var name = header.name
            let isConnection = name.withUTF8 { HeaderName.equals(UnsafeRawBufferPointer($0), "connection") }
            guard isConnection else { continue }
            var value = header.value
            value.withUTF8 { HeaderName.appendTokens(of: UnsafeRawBufferPointer($0), to: &names) }
        }
        return names
    }

    /// How many `Via` entries name `backstop` as their receiver (`1.1 backstop`), over every `Via` field: a
    /// request that has passed through Backstop this often is in a loop (docs/reference/behaviour.md).
    public static func backstopViaCount(in headers: [(name: String, value: String)]) -> Int {
        var count = 0
        for header in headers where header.name.caseInsensitiveEquals("via") {
            count += backstopViaEntries(inValue: header.value)
        }
        return count
    }

    /// The entries of one `Via` field value that name `backstop` as their receiver.
    public static func backstopViaEntries(inValue value: String) -> Int {
        var count = 0
        for entry in value.split(separator: ",") {
            let parts = entry.split(whereSeparator: { $0 == " " || $0 == "\t" })
            if parts.count >= 2, String(parts[1]).caseInsensitiveEquals("backstop") { count += 1 }
        }
        return count
    }

    /// A request carrying this many Backstop `Via` entries is refused with 508 `loop-detected`.
    public static let viaLoopLimit = 8

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
            switch HeaderName.classify(header.name) {
            case .hopByHop, .host, .contentLength, .expect: continue
            case .via:
                via = via.map { "\($0), \(header.value)" } ?? header.value
            case .backstopOwn, .retryAfter, .rateLimitReset, .location, .other:
                if !listed.isEmpty && listed.contains(header.name.asciiLowercased()) { continue }
                out.append(header)
            }
        }
        out.append((name: "Via", value: via.map { "\($0), 1.1 backstop" } ?? "1.1 backstop"))
        return out
    }
}
