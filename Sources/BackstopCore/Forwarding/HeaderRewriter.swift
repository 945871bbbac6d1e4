/// Header rewriting of client requests at the proxy boundary (docs/reference/behaviour.md#forwarding); responses are rewritten
/// on their bytes by `UpstreamHeadParser`.
public enum HeaderRewriter {
    /// Lowercased names listed in every `Connection` header (comma-separated tokens).
    public static func connectionListed(in headers: [(name: String, value: String)]) -> [String] {
        var names: [String] = []
        headers.withUnsafeBufferPointer { headers in
            // Read in place, and the name's length first: this runs for every field of every request.
            for i in headers.indices where headers[i].name.utf8.count == 10 {
                guard headers[i].name.caseInsensitiveEquals("connection") else { continue }
                HeaderName.withBytes(of: headers[i].value) { HeaderName.appendTokens(of: $0, to: &names) }
            }
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

    /// Whether a comma-separated field value (`Connection`) lists `token`: ASCII case-insensitive, spaces and tabs
    /// around an entry ignored.
    public static func value(_ value: String, lists token: String) -> Bool {
        value.split(separator: ",").contains { $0.trimmingCharacters(in: " \t").caseInsensitiveEquals(token) }
    }

    /// A request carrying this many Backstop `Via` entries is refused with 508 `loop-detected`.
    public static let viaLoopLimit = 8

    /// The credential an upstream's auth puts in a header (docs/reference/config.md#auth): the header's name, its
    /// whole value (`Bearer <token>`), and whether it replaces a header of that name the client sent
    /// (`client_auth_header: replace`) or gives way to it (`keep`).
    public struct InjectedHeader: Sendable, Equatable {
        public var name: String
        public var value: String
        public var replacesClient: Bool

        public init(name: String, value: String, replacesClient: Bool) {
            self.name = name
            self.value = value
            self.replacesClient = replacesClient
        }
    }

    /// The headers of a client request as they go upstream: hop-by-hop and `Connection`-listed fields removed,
    /// `Host` replaced by the upstream's, framing fields (`Content-Length`, `Expect`) left to the transport,
    /// `Via: 1.1 backstop` appended, then the injected credential unless the client's own stays (`keep`). The
    /// credential is handled in the same pass: finding and removing the client's field afterwards cost a request two
    /// more passes over its fields.
    public static func upstreamRequestHeaders(
        _ headers: [(name: String, value: String)], upstreamHost: String, injecting credential: InjectedHeader? = nil
    ) -> [(name: String, value: String)] {
        let listed = connectionListed(in: headers)
        var out: [(name: String, value: String)] = []
        // `Host`, `Via`, and the credential (a full array would be reallocated for it).
        out.reserveCapacity(headers.count + 3)
        out.append((name: "Host", value: upstreamHost))
        var via: String?
        var clientSentCredential = false
        let credentialLength = credential?.name.utf8.count ?? -1
        headers.withUnsafeBufferPointer { headers in
            // Fields read in place: iterating the array copies (retains and releases) every name and value.
            for i in headers.indices {
                switch HeaderName.classify(headers[i].name) {
                case .hopByHop, .host, .contentLength, .expect: continue
                case .via:
                    via = via.map { "\($0), \(headers[i].value)" } ?? headers[i].value
                case .backstopOwn, .retryAfter, .rateLimitReset, .location, .other:
                    if !listed.isEmpty && listed.contains(headers[i].name.asciiLowercased()) { continue }
                    if let credential, headers[i].name.utf8.count == credentialLength,
                        headers[i].name.caseInsensitiveEquals(credential.name)
                    {
                        if credential.replacesClient { continue }
                        clientSentCredential = true
                    }
                    out.append(headers[i])
                }
            }
        }
        out.append((name: "Via", value: via.map { "\($0), 1.1 backstop" } ?? "1.1 backstop"))
        if let credential, !clientSentCredential {
            out.append((name: credential.name, value: credential.value))
        }
        return out
    }
}
