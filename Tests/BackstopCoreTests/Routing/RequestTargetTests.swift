import BackstopCore
import Testing

/// `RequestTarget.parse`: the four request-target forms of RFC 9112 §3.2, and what is refused.
@Suite("Request targets")
struct RequestTargetTests {
    @Test(
        "origin form keeps the query byte for byte",
        arguments: [
            ("/", "/", String?.none), ("/a/b", "/a/b", nil), ("/a?", "/a", ""), ("/a?a=%20&b=&&c", "/a", "a=%20&b=&&c"),
            ("/a?x=1?y=2", "/a", "x=1?y=2"), ("/a#frag", "/a", nil), ("/a?q#frag", "/a", "q"), ("//x", "//x", nil),
            ("/%2F..%2f", "/%2F..%2f", nil), ("/a;p=1", "/a;p=1", nil),
        ])
    func origin(uri: String, path: String, query: String?) throws {
        let target = try #require(RequestTarget.parse(uri))
        #expect(target == RequestTarget(form: .origin, path: path, query: query))
    }

    @Test(
        "absolute form",
        arguments: [
            (
                "http://api.example.com/x?q",
                RequestTarget.Form.absolute(scheme: "http", host: "api.example.com", port: nil), "/x",
                String?.some("q")
            ),
            (
                "HTTP://Api.Example.COM:8080/P?Q=A", .absolute(scheme: "http", host: "api.example.com", port: 8080),
                "/P", "Q=A"
            ),
            ("HtTpS://h/", .absolute(scheme: "https", host: "h", port: nil), "/", nil),
            ("http://h", .absolute(scheme: "http", host: "h", port: nil), "/", nil),
            ("http://h?x", .absolute(scheme: "http", host: "h", port: nil), "/", "x"),
            ("http://h:0/", .absolute(scheme: "http", host: "h", port: 0), "/", nil),
            ("http://h:65535", .absolute(scheme: "http", host: "h", port: 65535), "/", nil),
            ("http://[::1]:8080/x", .absolute(scheme: "http", host: "::1", port: 8080), "/x", nil),
            (
                "http://[FD00::AB]/x?a=%20&b=&&c", .absolute(scheme: "http", host: "fd00::ab", port: nil), "/x",
                "a=%20&b=&&c"
            ),
            ("http://10.0.0.1:81/", .absolute(scheme: "http", host: "10.0.0.1", port: 81), "/", nil),
            ("http://h/x#f", .absolute(scheme: "http", host: "h", port: nil), "/x", nil),
        ])
    func absolute(uri: String, form: RequestTarget.Form, path: String, query: String?) throws {
        let target = try #require(RequestTarget.parse(uri))
        #expect(target == RequestTarget(form: form, path: path, query: query))
    }

    @Test("asterisk and authority forms")
    func otherForms() {
        #expect(RequestTarget.parse("*")?.form == .asterisk)
        #expect(RequestTarget.parse("h.test:443")?.form == .authority(host: "h.test", port: 443))
        #expect(RequestTarget.parse("H.Test:443")?.form == .authority(host: "h.test", port: 443))
        #expect(RequestTarget.parse("[::1]:443")?.form == .authority(host: "::1", port: 443))
        #expect(RequestTarget.parse("10.0.0.1:22")?.form == .authority(host: "10.0.0.1", port: 22))
    }

    @Test(
        "malformed targets are refused",
        arguments: [
            "", " ", "/a b", "/a\tb", "/a\u{0}", "/a\r\nX: y", "/é", "/a\u{7F}", "ftp://h/", "http://user@h/",
            "http://u:p@h/", "http://h:99999/", "http://h:x/", "http://h:/", "http:///x", "http://[::1/",
            "http://[::1]x/",
            "http://a:b:c/", "relative", "h.test", "*x", "http://h h/", "http://h\\x/", "[::1]",
        ])
    func malformed(uri: String) {
        #expect(RequestTarget.parse(uri) == nil)
    }

    @Test(
        "dot segments, also percent-encoded, are found wherever they are in the path",
        arguments: [
            "/api/../admin", "/api/./x", "/..", "/.", "/a/..", "/a/%2e%2e/b", "/a/%2E%2e/b", "/a/.%2e/b", "/a/%2e./b",
            "/a/%2E/b", "http://h.test/a/../b", "/a/..?q=1", "/a/../",
            // What Tomcat/Jetty (`;` parameters), IIS (`\\`, `%u`), double-decoding and overlong-UTF-8 readers resolve.
            "/api/..;/admin", "/api/%2e%2e;x=1/admin", "/api/..%2fadmin", "/api/%2e%2e%2fadmin", "/api/..%5cadmin",
            "/api/..\\admin", "/api/%252e%252e/admin", "/api/%c0%ae%c0%ae/admin", "http://api.test/..;/admin",
            "/api/%25252e%25252e/admin", "/api/.;/x", "/api/..%3bjsessionid=1/admin", "/api/%2E%2e%5Cadmin",
            "/a/%u002e%u002e/b", "/a/%U002E/b", "/a/..%00/b", "/a/..%2500/b", "/a\\..", "/a%2f..", "/a/%e0%80%ae/b",
            "/a/%ff", "/a/%252525252e%252525252e/b",
        ])
    func dotSegments(uri: String) throws {
        #expect(try #require(RequestTarget.parse(uri)).hasDotSegment)
    }

    @Test(
        "names that merely contain dots are fine",
        arguments: [
            "/", "/a.b", "/.well-known/x", "/a/...", "/a/..b", "/a/b..", "/a/%2e%2e%2e", "/a/%2f..x", "/a/%2",
            "/a/%2e1",
            "/x?q=/../", "/v1.2/x",
            // An encoded slash that forms no dot segment is forwarded untouched (GitLab's `group%2Fproject`).
            "/api/v4/projects/group%2Fproject", "/a/%2fb%5cc", "/a;..", "/a/..x;y", "/a/%25", "/100%25off",
            "/caf%C3%A9", "/a/%u00e9", "/a/%uD800", "/a/%2e%2e%2e", "/a/x.%2e",
        ])
    func notDotSegments(uri: String) throws {
        #expect(try !#require(RequestTarget.parse(uri)).hasDotSegment)
    }

    @Test("Via entries naming backstop are counted over every Via field")
    func viaCount() {
        let headers: [(name: String, value: String)] = [
            (name: "Via", value: "1.1 backstop, 1.0 squid, HTTP/1.1 Backstop (note)"),
            (name: "via", value: "1.1 backstop"), (name: "X-Via", value: "1.1 backstop"),
            (name: "Via", value: "1.1 backstops, backstop"),
        ]
        #expect(HeaderRewriter.backstopViaCount(in: headers) == 3)
    }
}
