/// Header rewriting of client requests at the proxy boundary (docs/reference/behaviour.md#forwarding); responses are rewritten
/// on their bytes by `UpstreamHeadParser`.
public enum HeaderRewriter {
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
    /// `Via: 1.1 backstop` appended, then the injected credential unless the client's own stays (`keep`).
    ///
    /// One pass over the client's fields, which may be NIO's `HTTPHeaders` as they are: copying them into an array
    /// first, and freeing that array through the runtime's generic tuple witness, cost ~2k instructions per
    /// realistic request (docs/performance.md#realistic-requests). The credential is handled in the same pass
    /// (finding and removing the client's field afterwards cost two more passes); the fields a `Connection` field
    /// lists are taken out after it, once every `Connection` field was read (rare: most list only `close` or
    /// `keep-alive`, which name no field kept).
    @inlinable
    public static func upstreamRequestHeaders<Fields: Collection<(name: String, value: String)>>(
        _ headers: Fields, upstreamHost: String, injecting credential: InjectedHeader? = nil
    ) -> [(name: String, value: String)] {
        var out: [(name: String, value: String)] = []
        // `Host`, `Via`, and the credential (a full array would be reallocated for it).
        out.reserveCapacity(headers.count + 3)
        out.append((name: "Host", value: upstreamHost))
        var via: String?
        var listed: [String] = []
        var clientSentCredential = false
        // Names of another length are not compared (the comparison is a call per field otherwise).
        let credentialLength = credential?.name.utf8.count ?? -1
        for field in headers {
            switch fate(ofFieldNamed: field.name) {
            case .drop:
                continue
            case .connection:
                appendListedNames(of: field.value, to: &listed)
            case .via:
                via = via.map { "\($0), \(field.value)" } ?? field.value
            case .keep:
                if let credential, field.name.utf8.count == credentialLength,
                    field.name.caseInsensitiveEquals(credential.name)
                {
                    if credential.replacesClient { continue }
                    clientSentCredential = true
                }
                out.append(field)
            }
        }
        finish(&out, listed: listed, via: via, credential: credential, clientSentCredential: clientSentCredential)
        return out
    }

    /// What becomes of a client field upstream, by its name.
    @usableFromInline
    enum FieldFate {
        case drop, keep, via
        /// A `Connection` field: the names it lists are the client's hop-by-hop fields.
        case connection
    }

    @usableFromInline
    static func fate(ofFieldNamed name: String) -> FieldFate {
        switch HeaderName.classify(name) {
        case .hopByHop: name.utf8.count == 10 && name.caseInsensitiveEquals("connection") ? .connection : .drop
        case .host, .contentLength, .expect: .drop
        case .via: .via
        case .backstopOwn, .retryAfter, .rateLimitReset, .location, .other: .keep
        }
    }

    /// The names a `Connection` value lists that name a field still to be removed, lowercased.
    @usableFromInline
    static func appendListedNames(of value: String, to names: inout [String]) {
        HeaderName.withBytes(of: value) { HeaderName.appendTokens(of: $0, to: &names) }
    }

    /// After the pass: the `Connection`-listed fields out (`out[0]` is Backstop's own `Host`), then `Via` and the
    /// credential. A client credential field that `Connection` lists was the client's hop-by-hop field: it is
    /// gone, so it does not keep the injected one out.
    @usableFromInline
    static func finish(
        _ out: inout [(name: String, value: String)], listed: [String], via: String?, credential: InjectedHeader?,
        clientSentCredential: Bool
    ) {
        var clientSentCredential = clientSentCredential
        if !listed.isEmpty {
            var kept = 1
            for i in 1..<out.count where !listed.contains(out[i].name.asciiLowercased()) {
                out.swapAt(kept, i)
                kept += 1
            }
            out.removeSubrange(kept...)
            if let credential, listed.contains(credential.name.asciiLowercased()) { clientSentCredential = false }
        }
        out.append((name: "Via", value: via.map { "\($0), 1.1 backstop" } ?? "1.1 backstop"))
        if let credential, !clientSentCredential {
            out.append((name: credential.name, value: credential.value))
        }
    }
}
