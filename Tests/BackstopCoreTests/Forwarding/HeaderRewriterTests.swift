import BackstopCore
import Testing

/// `HeaderRewriter.upstreamRequestHeaders`: the fields a client request takes upstream, compared whole, and the
/// ASCII case-insensitive name comparison every header rule uses.
@Suite("Request header rewriting")
struct HeaderRewriterTests {
    private static func rewritten(_ pairs: [(String, String)]) -> [String] {
        HeaderRewriter.upstreamRequestHeaders(pairs.map { (name: $0.0, value: $0.1) }, upstreamHost: "up:8080")
            .map { "\($0.name): \($0.value)" }
    }

    @Test func hopByHopFramingAndHostGoAndViaIsAppended() {
        let out = Self.rewritten([
            ("Host", "client.example"), ("Connection", "keep-alive"), ("Keep-Alive", "timeout=5"), ("TE", "trailers"),
            ("Content-Length", "3"), ("Expect", "100-continue"), ("Proxy-Authorization", "Basic x"),
            ("Accept", "*/*"), ("X-Request-Id", "abc"), ("Upgrade", "h2c"), ("Transfer-Encoding", "chunked"),
        ])
        #expect(out == ["Host: up:8080", "Accept: */*", "X-Request-Id: abc", "Via: 1.1 backstop"])
    }

    @Test func fieldsListedInConnectionGoInAnyCase() {
        let out = Self.rewritten([
            ("X-Secret", "1"), ("CONNECTION", "close, X-SECRET , x-other"), ("x-other", "2"), ("X-Kept", "3"),
            ("connection", "X-Late"), ("x-late", "4"),
        ])
        #expect(out == ["Host: up:8080", "X-Kept: 3", "Via: 1.1 backstop"])
    }

    @Test func theClientsViaEntriesComeFirst() {
        let out = Self.rewritten([("Via", "1.0 a"), ("X", "y"), ("via", "1.1 b")])
        #expect(out == ["Host: up:8080", "X: y", "Via: 1.0 a, 1.1 b, 1.1 backstop"])
    }

    @Test func theOrderOfTheOtherFieldsIsKept() {
        let names = (0..<20).map { "X-Field-\($0)" }
        let out = Self.rewritten(names.map { ($0, "v") })
        #expect(out == ["Host: up:8080"] + names.map { "\($0): v" } + ["Via: 1.1 backstop"])
    }

    @Test(arguments: [
        ("Content-Length", "content-length", true), ("HOST", "host", true), ("X-A", "x-a", true),
        ("x-a", "X-b", false), ("host", "hos", false), ("", "", true), ("[", "{", false), ("@", "`", false),
        ("Zz", "zZ", true), ("ü", "Ü", false), ("a\u{0}", "A\u{0}", true), ("résumé", "RÉSUMÉ", false),
        ("résumé", "résumé", true),
    ])
    func namesCompareWithoutASCIICase(a: String, b: String, equal: Bool) {
        #expect(a.caseInsensitiveEquals(b) == equal)
        #expect(b.caseInsensitiveEquals(a) == equal)
    }
}
