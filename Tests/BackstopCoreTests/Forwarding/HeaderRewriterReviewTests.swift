import Testing

@testable import BackstopCore

/// An adversarial review of `HeaderRewriter.upstreamRequestHeaders` on bytes: hop-by-hop and framing fields in any
/// case, `Connection` listing what frames the request, a client `Host`, hostile `Via` values and credentials. Every
/// result is also checked against the invariant the writers rely on.
@Suite("Request header rewriting: adversarial review")
struct HeaderRewriterReviewTests {
    typealias Review = HeaderFieldsReviewTests

    static func rewritten(
        _ fields: HeaderFields, host: String = "up:8080", credential: HeaderRewriter.InjectedHeader? = nil
    ) -> [String] {
        let out = HeaderRewriter.upstreamRequestHeaders(fields, upstreamHost: host, injecting: credential)
        #expect(Review.violations(out).isEmpty)
        return out.map { "\($0.name): \($0.value)" }
    }

    static func fields(_ pairs: [(String, String)]) throws -> HeaderFields {
        var fields = HeaderFields()
        for (name, value) in pairs {
            let appended = fields.append(name: name, value: value)
            try #require(appended, "\(name) refused")
        }
        return fields
    }

    /// Hop-by-hop, framing and `Host` fields go whatever the case of their names; `Connection` listing framing
    /// fields, `Host`, empty entries and tab-padded names takes out only client fields.
    @Test func hopByHopFramingAndHostGoInAnyCase() throws {
        let client = try Self.fields([
            ("hOsT", "evil.example"), ("HOST", "second.example"),
            ("cOnNeCtIoN", "close, content-length, X-Drop\t, transfer-encoding, , \t,HOST, proxy-authorization"),
            ("Content-Length", "5"), ("tRaNsFeR-eNcOdInG", "chunked"), ("kEeP-aLiVe", "timeout=1"), ("tE", "trailers"),
            ("pRoXy-CoNnEcTiOn", "keep-alive"), ("PROXY-AUTHORIZATION", "Basic cHJveHk="), ("proxy-authenticate", "x"),
            ("UPGRADE", "h2c"), ("Trailer", "X"), ("eXpEcT", "100-continue"), ("x-DROP", "gone"), ("X-Kept", "1"),
        ])
        #expect(Self.rewritten(client) == ["Host: up:8080", "X-Kept: 1", "Via: 1.1 backstop"])
    }

    /// `Connection: close, content-length` and `Connection: transfer-encoding`: the reader still frames the body by
    /// the field (it is not removed before framing), and no framing field goes upstream, where the transport writes
    /// the body's own.
    @Test func connectionListingAFramingFieldChangesNeitherFramingNorWhatGoesUpstream() throws {
        var reader = HTTP1RequestReader(maxHeadBytes: 64 << 10)
        let bytes = Array(
            ("POST / HTTP/1.1\r\nConnection: close, content-length\r\nContent-Length: 5\r\n\r\nhello"
                + "POST / HTTP/1.1\r\n\r\n").utf8)
        var offset = 0
        var events: [HTTP1RequestReader.Event] = []
        bytes.withUnsafeBytes { input in
            for _ in 0..<8 {
                let event = reader.next(input, at: &offset)
                events.append(event)
                if event == .needMore { break }
                if case .invalid = event { break }
            }
        }
        guard case .head(let head) = events.first else {
            Issue.record("\(events)")
            return
        }
        #expect(Array(events.dropFirst()) == [.body(73..<78), .end(trailers: nil), .invalid(.afterClose)])
        #expect(Self.rewritten(head.fields) == ["Host: up:8080", "Via: 1.1 backstop"])

        let chunked = Array(
            "POST / HTTP/1.1\r\nConnection: Transfer-Encoding\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\n"
                .utf8)
        var chunkedReader = HTTP1RequestReader(maxHeadBytes: 64 << 10)
        offset = 0
        let first = chunked.withUnsafeBytes { chunkedReader.next($0, at: &offset) }
        let second = chunked.withUnsafeBytes { chunkedReader.next($0, at: &offset) }
        guard case .head(let chunkedHead) = first else {
            Issue.record("\(first)")
            return
        }
        #expect(second == .body(81..<82))
        #expect(Self.rewritten(chunkedHead.fields) == ["Host: up:8080", "Via: 1.1 backstop"])
    }

    /// Backstop's `Host` is the only one upstream whatever the client sent; an upstream host that is not a field
    /// value is refused rather than written (the raw writer then takes the URL's).
    @Test func theClientsHostNeverGoesUpstream() throws {
        let client = try Self.fields([("Host", "a.example"), ("X", "1"), ("host", "b.example")])
        #expect(Self.rewritten(client, host: "up") == ["Host: up", "X: 1", "Via: 1.1 backstop"])
        #expect(Self.rewritten(client, host: "up\r\nX-Evil: 1") == ["X: 1", "Via: 1.1 backstop"])
    }

    /// Client `Via` values are joined as sent (tabs, trailing spaces, a fake `backstop` entry), before Backstop's
    /// own entry; an empty one adds no empty list element (RFC 9110 §5.6.1: a sender generates none).
    @Test func hostileViaValuesAreJoinedAsSent() throws {
        let client = try Self.fields([
            ("Via", "1.1 backstop\t"), ("X", "1"), ("via", "1.0 x,, 1.1 BACKSTOP"), ("VIA", "a\tb  "), ("Via", ""),
        ])
        #expect(
            Self.rewritten(client) == [
                "Host: up:8080", "X: 1", "Via: 1.1 backstop\t, 1.0 x,, 1.1 BACKSTOP, a\tb  , 1.1 backstop",
            ])
        #expect(Self.rewritten(try Self.fields([("Via", "")])) == ["Host: up:8080", "Via: 1.1 backstop"])
        var cannot = HeaderFields()
        let appended = cannot.append(name: "Via", value: "1.1 a\r\nX-Evil: 1")
        #expect(!appended && cannot.isEmpty)
    }

    /// A `Connection` field listing thousands of names (repeated, in any case) across a head of thousands of
    /// fields: every listed field goes, every other stays, in order. The names are a set looked up once per field:
    /// kept in an array, a 60 KB head of them cost 2.75 s of one core in a debug build (quadratic in the names).
    @Test func aConnectionListingThousandsOfNamesTakesOutExactlyThose() throws {
        var text = "GET / HTTP/1.1\r\nConnection: "
        for i in 0..<4_000 { text += i % 3 == 0 ? "X-\(i % 1_000), " : "x-\(i), " }
        text += "host, CONNECTION\r\n"
        for i in stride(from: 0, to: 5_000, by: 2) { text += "X-\(i): \(i)\r\n" }
        text += "Via: 1.0 a\r\n\r\n"
        let fields = try #require(Review.fields(text))
        let listed = Set((0..<4_000).map { $0 % 3 == 0 ? $0 % 1_000 : $0 })
        let kept = stride(from: 0, to: 5_000, by: 2).filter { !listed.contains($0) }.map { "X-\($0): \($0)" }
        #expect(Self.rewritten(fields) == ["Host: up:8080"] + kept + ["Via: 1.0 a, 1.1 backstop"])
    }

    static func credential(
        _ value: String = "Bearer t", name: String = "Authorization", replace: Bool
    ) -> HeaderRewriter.InjectedHeader {
        HeaderRewriter.InjectedHeader(name: name, value: value, replacesClient: replace)
    }

    /// The client's credential field in any case: all of them go with `replace`, they stay (and nothing is injected)
    /// with `keep`; the credential always comes once.
    @Test func theClientsCredentialInAnyCase() throws {
        let client = try Self.fields([("aUtHoRiZaTiOn", "Basic a"), ("X", "1"), ("AUTHORIZATION", "Basic b")])
        #expect(
            Self.rewritten(client, credential: Self.credential(replace: true)) == [
                "Host: up:8080", "X: 1", "Via: 1.1 backstop", "Authorization: Bearer t",
            ])
        #expect(
            Self.rewritten(client, credential: Self.credential(replace: false)) == [
                "Host: up:8080", "aUtHoRiZaTiOn: Basic a", "X: 1", "AUTHORIZATION: Basic b", "Via: 1.1 backstop",
            ])
        // Listed in `Connection`: the client's field was hop-by-hop; the credential goes in once, either way.
        let listed = try Self.fields([("Authorization", "Basic a"), ("Connection", "AUTHORIZATION")])
        for replace in [true, false] {
            #expect(
                Self.rewritten(listed, credential: Self.credential(replace: replace)) == [
                    "Host: up:8080", "Via: 1.1 backstop", "Authorization: Bearer t",
                ])
        }
    }

    /// A credential that is not a field (a token endpoint's or keychain's value with CR, LF, NUL or another control;
    /// a name that is not a token) is never written; with `replace` the client's goes all the same.
    @Test(arguments: [
        ("Authorization", "Bearer t\r\nX-Evil: 1"), ("Authorization", "Bearer t\nX-Evil: 1"),
        ("Authorization", "Bearer t\u{0}"), ("Authorization", "Bearer \u{7F}"), ("Auth orization", "Bearer t"),
        ("Authorization\r\nX-Evil", "t"), ("", "t"),
    ])
    func aCredentialThatIsNotAFieldIsNeverWritten(name: String, value: String) throws {
        let injected = Self.credential(value, name: name, replace: true)
        #expect(injected.field.isEmpty)
        let client = try Self.fields([("Authorization", "Basic mine"), ("X", "1")])
        let replaced = Self.rewritten(client, credential: injected)
        #expect(replaced == ["Host: up:8080", "X: 1", "Via: 1.1 backstop"] || name != "Authorization")
        #expect(!replaced.contains { $0.contains("Evil") || $0.contains("Bearer") })
        let kept = Self.rewritten(client, credential: Self.credential(value, name: name, replace: false))
        #expect(!kept.contains { $0.contains("Evil") || $0.contains("Bearer") })
    }

    /// Tabs and obs-text in a token are field-value bytes: the credential is written as it is.
    @Test func aCredentialWithTabsAndObsTextIsWrittenAsItIs() throws {
        let injected = Self.credential("Bearer a\tb\u{E9}", replace: false)
        #expect(injected.field.count == 1)
        #expect(
            Self.rewritten(HeaderFields(), credential: injected) == [
                "Host: up:8080", "Via: 1.1 backstop", "Authorization: Bearer a\tb\u{E9}",
            ])
    }

    /// A credential in `Proxy-Authorization` (an upstream that is itself a proxy): the client's is aimed at
    /// Backstop and goes; the credential is injected with `keep` too.
    @Test func aProxyAuthorizationCredentialIsAlwaysBackstops() throws {
        let client = try Self.fields([("proxy-authorization", "Basic mine")])
        for replace in [true, false] {
            #expect(
                Self.rewritten(
                    client, credential: Self.credential("Basic up", name: "Proxy-Authorization", replace: replace))
                    == ["Host: up:8080", "Via: 1.1 backstop", "Proxy-Authorization: Basic up"])
        }
    }
}
