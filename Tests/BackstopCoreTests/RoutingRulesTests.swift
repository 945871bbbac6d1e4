import BackstopCore
import Testing

/// `RequestTarget` parsing and every rule of `Router` (SPEC §3 "Routing", docs/behaviour.md).
@Suite("Routing rules")
struct RoutingRulesTests {
    private func upstream(_ name: String, hosts: [String] = [], prefix: String? = nil, strip: Bool = true,
                          base: String = "") -> UpstreamConfig {
        UpstreamConfig(
            name: name, match: MatchConfig(hosts: hosts, pathPrefix: prefix, stripPrefix: strip),
            url: UpstreamURL(scheme: "https", host: "\(name).upstream", basePath: base))
    }

    private func route(_ router: Router, _ uri: String, host: String? = nil) -> RouteDecision {
        guard let target = RequestTarget.parse(uri) else { return .noRoute }
        return router.route(target: target, hostHeader: host)
    }

    @Test("request-target forms")
    func targets() throws {
        let origin = try #require(RequestTarget.parse("/a/b?x=%20&y=&&z"))
        #expect(origin.form == .origin && origin.path == "/a/b" && origin.query == "x=%20&y=&&z")
        let absolute = try #require(RequestTarget.parse("HTTP://Api.Example.com:8080/p?q"))
        #expect(absolute.form == .absolute(scheme: "http", host: "api.example.com", port: 8080))
        #expect(absolute.path == "/p" && absolute.query == "q")
        #expect(RequestTarget.parse("http://h")?.path == "/")
        let queryOnly = try #require(RequestTarget.parse("http://h?x"))
        #expect(queryOnly.path == "/" && queryOnly.query == "x")
        #expect(RequestTarget.parse("http://[::1]:9/x")?.form == .absolute(scheme: "http", host: "::1", port: 9))
        #expect(RequestTarget.parse("*")?.form == .asterisk)
        #expect(RequestTarget.parse("h.test:443")?.form == .authority(host: "h.test", port: 443))
        #expect(RequestTarget.parse("/a#frag")?.path == "/a")
        for bad in ["", "http://user@h/", "/a b", "/é", "ftp://h/", "http://h:99999/", "http://h:x/", "relative"] {
            #expect(RequestTarget.parse(bad) == nil, "\(bad)")
        }
    }

    @Test("absolute form matches by URL host, only against upstreams with hosts")
    func absoluteForm() {
        let router = Router(upstreams: [upstream("p", prefix: "/api"), upstream("h", hosts: ["h.test"], base: "/v2")], unmatched: .reject)
        #expect(route(router, "http://h.test/x?q=1") == .upstream(index: 1, path: "/v2/x?q=1"))
        #expect(route(router, "http://other.test/api/x") == .noRoute)
    }

    @Test("an upstream with hosts and a prefix needs both")
    func hostAndPrefix() {
        let router = Router(upstreams: [upstream("both", hosts: ["h.test"], prefix: "/api")], unmatched: .reject)
        #expect(route(router, "http://h.test/api/x") == .upstream(index: 0, path: "/x"))
        #expect(route(router, "http://h.test/other") == .noRoute)
        #expect(route(router, "/api/x", host: "h.test") == .upstream(index: 0, path: "/x"))
        #expect(route(router, "/api/x", host: "nope.test") == .noRoute)
    }

    @Test("origin form: longest prefix wins, at a segment boundary; strip_prefix; base path join")
    func prefixes() {
        let router = Router(upstreams: [
            upstream("short", prefix: "/api"), upstream("long", prefix: "/api/v2", base: "/base"),
            upstream("keep", prefix: "/keep", strip: false), upstream("root", prefix: "/", base: "/r"),
        ], unmatched: .reject)
        #expect(route(router, "/api/x") == .upstream(index: 0, path: "/x"))
        #expect(route(router, "/api") == .upstream(index: 0, path: "/"))
        #expect(route(router, "/api?q") == .upstream(index: 0, path: "/?q"))
        #expect(route(router, "/api/v2/y") == .upstream(index: 1, path: "/base/y"))
        #expect(route(router, "/api/v2") == .upstream(index: 1, path: "/base"))
        #expect(route(router, "/apix") == .upstream(index: 3, path: "/r/apix"))
        #expect(route(router, "/keep/z") == .upstream(index: 2, path: "/keep/z"))
    }

    @Test("origin form falls back to the Host header: port ignored, case-insensitive, exact beats wildcard")
    func hostHeader() {
        let router = Router(upstreams: [
            upstream("wild", hosts: ["*.a.com"]), upstream("exact", hosts: ["x.a.com"]),
        ], unmatched: .reject)
        #expect(route(router, "/p", host: "X.A.COM:8443") == .upstream(index: 1, path: "/p"))
        #expect(route(router, "/p", host: "y.a.com") == .upstream(index: 0, path: "/p"))
        #expect(route(router, "/p", host: "z.y.a.com") == .upstream(index: 0, path: "/p"))
        #expect(route(router, "/p", host: "a.com") == .noRoute)
        #expect(route(router, "/p") == .noRoute)
    }

    @Test("passthrough forwards unmatched http requests as they are")
    func passthrough() {
        let router = Router(upstreams: [], unmatched: .passthrough)
        #expect(route(router, "http://h.test:81/x?q") == .passthrough(url: "http://h.test:81/x?q"))
        #expect(route(router, "https://h.test/x") == .noRoute)
        #expect(route(router, "/x?q", host: "h.test") == .passthrough(url: "http://h.test/x?q"))
        #expect(route(router, "/x") == .noRoute)
        #expect(route(router, "*") == .noRoute)
    }
}
