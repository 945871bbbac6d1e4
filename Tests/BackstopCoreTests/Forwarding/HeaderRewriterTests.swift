import BackstopCore
import Testing

/// `HeaderRewriter.upstreamRequestHeaders`: the fields a client request takes upstream, compared whole, and the
/// ASCII case-insensitive name comparison every header rule uses.
@Suite("Request header rewriting")
struct HeaderRewriterTests {
    private static func rewritten(_ pairs: [(String, String)]) -> [String] {
        HeaderRewriter.upstreamRequestHeaders(
            HeaderFields(pairs.map { (name: $0.0, value: $0.1) }), upstreamHost: "up:8080"
        )
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

    /// `Host` and `Via` are Backstop's own whatever `Connection` lists; the fields kept keep their order.
    @Test func connectionCannotTakeOutBackstopsOwnFields() {
        let out = Self.rewritten([
            ("A", "1"), ("Connection", "host, via, b"), ("B", "2"), ("Via", "1.0 p"), ("C", "3"), ("b", "4"),
            ("D", "5"),
        ])
        #expect(out == ["Host: up:8080", "A: 1", "C: 3", "D: 5", "Via: 1.0 p, 1.1 backstop"])
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

    private static func injecting(_ pairs: [(String, String)], replace: Bool) -> [String] {
        let credential = HeaderRewriter.InjectedHeader(
            name: "Authorization", value: "Bearer t", replacesClient: replace)
        return HeaderRewriter.upstreamRequestHeaders(
            HeaderFields(pairs.map { (name: $0.0, value: $0.1) }), upstreamHost: "up:8080", injecting: credential
        ).map { "\($0.name): \($0.value)" }
    }

    /// The credential goes last, after `Via`; with `replace` every client field of its name (in any case) goes.
    @Test func theCredentialReplacesTheClientsOwn() {
        #expect(
            Self.injecting([("authorization", "Basic a"), ("X", "1"), ("AUTHORIZATION", "b")], replace: true)
                == ["Host: up:8080", "X: 1", "Via: 1.1 backstop", "Authorization: Bearer t"])
        #expect(
            Self.injecting([("X", "1")], replace: true) == [
                "Host: up:8080", "X: 1", "Via: 1.1 backstop", "Authorization: Bearer t",
            ])
    }

    /// With `keep`, a client that sent the field keeps it and nothing is injected; one that did not gets the
    /// credential; a client field that `Connection` lists is gone, so it counts as not sent.
    @Test func keepLeavesTheClientsOwnAndInjectsOnlyWithoutIt() {
        #expect(
            Self.injecting([("Authorization", "Basic a"), ("X", "1")], replace: false)
                == ["Host: up:8080", "Authorization: Basic a", "X: 1", "Via: 1.1 backstop"])
        #expect(
            Self.injecting([("X", "1")], replace: false)
                == ["Host: up:8080", "X: 1", "Via: 1.1 backstop", "Authorization: Bearer t"])
        #expect(
            Self.injecting([("Connection", "authorization"), ("Authorization", "Basic a")], replace: false)
                == ["Host: up:8080", "Via: 1.1 backstop", "Authorization: Bearer t"])
        // The same when `Connection` comes after the field it lists.
        #expect(
            Self.injecting([("Authorization", "Basic a"), ("X", "1"), ("connection", "Authorization")], replace: false)
                == ["Host: up:8080", "X: 1", "Via: 1.1 backstop", "Authorization: Bearer t"])
        #expect(
            Self.injecting([("Authorizatio", "a"), ("Authorization-X", "b")], replace: false)
                == [
                    "Host: up:8080", "Authorizatio: a", "Authorization-X: b", "Via: 1.1 backstop",
                    "Authorization: Bearer t",
                ])
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
