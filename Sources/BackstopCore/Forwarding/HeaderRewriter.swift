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
        public let name: String
        public let value: String
        public let replacesClient: Bool
        /// The field as the upstream's fields hold it, checked once when the header is made (a token is the same
        /// for thousands of requests): empty when the name is not a token or the value holds a control character
        /// (a token endpoint's answer is not ours to trust), and then nothing is injected.
        public let field: HeaderFields

        public init(name: String, value: String, replacesClient: Bool) {
            self.name = name
            self.value = value
            self.replacesClient = replacesClient
            var field = HeaderFields()
            field.append(name: name, value: value)
            self.field = field
        }
    }

    /// The headers of a client request as they go upstream: hop-by-hop and `Connection`-listed fields removed,
    /// `Host` replaced by the upstream's, framing fields (`Content-Length`, `Expect`) left to the transport,
    /// `Via: 1.1 backstop` appended, then the injected credential unless the client's own stays (`keep`).
    ///
    /// One pass over the client's fields, classified on their bytes; the fields kept go upstream as the client's
    /// bytes (no string is made for them: docs/performance.md#header-fields-as-bytes). The credential is
    /// handled in the same pass; the fields a `Connection` field lists are taken out after it, once every
    /// `Connection` field was read (rare: most list only `close` or `keep-alive`, which name no field kept).
    public static func upstreamRequestHeaders(
        _ headers: HeaderFields, upstreamHost: String, injecting credential: InjectedHeader? = nil
    ) -> HeaderFields {
        // The fields kept are the client's lines over the client's bytes: only the line table is new, and the bytes
        // are copied once, with room for Backstop's own fields (`Host`, `Via`, the credential) after them.
        var out = HeaderFields(checkedSection: headers.bytes, lines: [])
        out.lines.reserveCapacity(headers.count + 3)
        out.bytes.reserveCapacity(
            headers.bytes.count + upstreamHost.utf8.count + 32 + (credential?.field.bytes.count ?? 0))
        out.append(name: "Host", value: upstreamHost)
        var via: String?
        var listed = Set<String>()
        var clientSentCredential = false
        // Names of another length are not compared (the comparison is a call per field otherwise).
        let credentialLength = credential?.name.utf8.count ?? -1
        headers.withFieldBytes { bytes, fields in
            for field in fields {
                let name = UnsafeRawBufferPointer(rebasing: bytes[field.name])
                switch fate(ofFieldNamed: name) {
                case .drop:
                    continue
                case .connection:
                    HeaderName.appendTokens(of: UnsafeRawBufferPointer(rebasing: bytes[field.value]), to: &listed)
                case .via:
                    // An empty one would add an empty list element, which a sender must not make (RFC 9110 §5.6.1).
                    guard !field.value.isEmpty else { continue }
                    let value = String(decoding: bytes[field.value], as: UTF8.self)
                    // Appended in place: a new string per field made many `Via` fields quadratic.
                    if via == nil { via = value } else { via!.append(", " + value) }
                case .keep:
                    if let credential, name.count == credentialLength,
                        HeaderFields.equalsIgnoringCase(name, credential.name)
                    {
                        if credential.replacesClient { continue }
                        clientSentCredential = true
                    }
                    // The field's bytes are at the same place in `out`'s copy of them.
                    out.lines.append(field)
                }
            }
        }
        if !listed.isEmpty {
            // The `Connection`-listed fields out, in one pass however many it lists (Backstop's own `Host` stays: the
            // client's was dropped above). A client credential field that `Connection` lists was the client's
            // hop-by-hop field: it is gone, so it does not keep the injected one out.
            listed.remove("host")
            out.remove(namesIn: listed)
            if let credential, listed.contains(credential.name.asciiLowercased()) { clientSentCredential = false }
        }
        out.append(name: "Via", value: via.map { "\($0), 1.1 backstop" } ?? "1.1 backstop")
        if let credential, !clientSentCredential {
            for i in credential.field.indices { out.append(fieldAt: i, of: credential.field) }
        }
        return out
    }

    /// What becomes of a client field upstream, by its name.
    enum FieldFate {
        case drop, keep, via
        /// A `Connection` field: the names it lists are the client's hop-by-hop fields.
        case connection
    }

    static func fate(ofFieldNamed name: UnsafeRawBufferPointer) -> FieldFate {
        switch HeaderName.classify(name) {
        case .hopByHop: HeaderName.equals(name, "connection") ? .connection : .drop
        case .host, .contentLength, .expect: .drop
        case .via: .via
        case .backstopOwn, .retryAfter, .rateLimitReset, .location, .other: .keep
        }
    }
}
