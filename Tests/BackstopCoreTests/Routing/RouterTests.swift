import BackstopCore
import Testing

/// Every rule of `Router` (docs/reference/behaviour.md#routing).
@Suite("Router")
struct RouterTests {
    private static func upstream(
        _ name: String, hosts: [String] = [], prefix: String? = nil, strip: Bool = true,
        base: String = ""
    ) -> UpstreamConfig {
        UpstreamConfig(
            name: name, match: MatchConfig(hosts: hosts, pathPrefix: prefix, stripPrefix: strip),
            url: UpstreamURL(scheme: "https", host: "\(name).upstream", basePath: base))
    }

    private func route(
        _ router: Router, _ uri: String, host: String? = nil,
        sourceLocation: Testing.SourceLocation = #_sourceLocation
    ) -> RouteDecision? {
        guard let target = RequestTarget.parse(uri) else {
            Issue.record("unparsable fixture \(uri)", sourceLocation: sourceLocation)
            return nil
        }
        return router.route(target: target, hostHeader: host)
    }

    @Test("absolute form matches on the URL host, only against upstreams with hosts; Host header ignored")
    func absoluteForm() {
        let router = Router(
            upstreams: [
                Self.upstream("p", prefix: "/api"), Self.upstream("h", hosts: ["h.test"], base: "/v2"),
            ], unmatched: .reject)
        #expect(route(router, "http://h.test/x?q=1") == .upstream(index: 1, path: "/v2/x?q=1"))
        #expect(route(router, "http://H.TEST:8080/x") == .upstream(index: 1, path: "/v2/x"))
        #expect(route(router, "https://h.test/x") == .upstream(index: 1, path: "/v2/x"))
        #expect(route(router, "http://h.test") == .upstream(index: 1, path: "/v2/"))
        #expect(route(router, "http://other.test/api/x") == .noRoute)
        #expect(route(router, "http://other.test/x", host: "h.test") == .noRoute)
    }

    @Test("an upstream with hosts and a prefix is reached either way: absolute form by host, origin form by prefix")
    func hostAndPrefix() {
        let router = Router(upstreams: [Self.upstream("both", hosts: ["h.test"], prefix: "/api")], unmatched: .reject)
        // Absolute form: the host alone decides; the prefix plays no part and nothing is stripped.
        #expect(route(router, "http://h.test/api/x") == .upstream(index: 0, path: "/api/x"))
        #expect(route(router, "http://h.test/api") == .upstream(index: 0, path: "/api"))
        #expect(route(router, "http://h.test/apix") == .upstream(index: 0, path: "/apix"))
        #expect(route(router, "http://h.test/other") == .upstream(index: 0, path: "/other"))
        #expect(route(router, "http://nope.test/api/x") == .noRoute)
        // Origin form: the prefix decides whatever the Host header says, and is stripped.
        #expect(route(router, "/api/x", host: "h.test") == .upstream(index: 0, path: "/x"))
        #expect(route(router, "/api/x", host: "nope.test") == .upstream(index: 0, path: "/x"))
        #expect(route(router, "/api/x", host: "127.0.0.1:8080") == .upstream(index: 0, path: "/x"))
        #expect(route(router, "/api/x") == .upstream(index: 0, path: "/x"))
        // No prefix match: the Host header against hosts, nothing stripped.
        #expect(route(router, "/other", host: "H.Test:80") == .upstream(index: 0, path: "/other"))
        #expect(route(router, "/apix", host: "h.test") == .upstream(index: 0, path: "/apix"))
        #expect(route(router, "/other", host: "nope.test") == .noRoute)
        #expect(route(router, "/other") == .noRoute)
    }

    @Test("the reference example upstream serves an HTTP_PROXY client and an app whose base URL is Backstop")
    func referenceExample() throws {
        let config = try ConfigLoader.parse(
            yaml: """
                version: 1
                listen: [127.0.0.1:8080]
                upstreams:
                  - name: api
                    match: {hosts: [api.example.com, "*.api.example.com"], path_prefix: /api, strip_prefix: true}
                    url: https://api.example.com/v2
                """, file: "t.yaml", baseDirectory: "/")
        let router = Router(upstreams: config.upstreams, unmatched: config.unmatched)
        // curl -x http://127.0.0.1:8080 http://api.example.com/v2/users
        #expect(route(router, "http://api.example.com/v2/users") == .upstream(index: 0, path: "/v2/v2/users"))
        // curl http://127.0.0.1:8080/api/users (Host: 127.0.0.1:8080)
        #expect(route(router, "/api/users", host: "127.0.0.1:8080") == .upstream(index: 0, path: "/v2/users"))
        #expect(route(router, "http://eu.api.example.com/x?a=%20b") == .upstream(index: 0, path: "/v2/x?a=%20b"))
    }

    @Test("origin form: longest prefix wins, at a segment boundary; strip_prefix; base path join")
    func prefixes() {
        let router = Router(
            upstreams: [
                Self.upstream("short", prefix: "/api"), Self.upstream("long", prefix: "/api/v2", base: "/base"),
                Self.upstream("keep", prefix: "/keep", strip: false, base: "/k"),
                Self.upstream("root", prefix: "/", base: "/r"),
            ], unmatched: .reject)
        #expect(route(router, "/api/x") == .upstream(index: 0, path: "/x"))
        #expect(route(router, "/api/x/") == .upstream(index: 0, path: "/x/"))
        #expect(route(router, "/api") == .upstream(index: 0, path: "/"))
        #expect(route(router, "/api/") == .upstream(index: 0, path: "/"))
        #expect(route(router, "/api?q") == .upstream(index: 0, path: "/?q"))
        #expect(route(router, "/api/v2/y") == .upstream(index: 1, path: "/base/y"))
        #expect(route(router, "/api/v2") == .upstream(index: 1, path: "/base"))
        #expect(route(router, "/api/v2?x") == .upstream(index: 1, path: "/base?x"))
        #expect(route(router, "/api/v2x") == .upstream(index: 0, path: "/v2x"))
        #expect(route(router, "/apix") == .upstream(index: 3, path: "/r/apix"))
        #expect(route(router, "/keep/z") == .upstream(index: 2, path: "/k/keep/z"))
        #expect(route(router, "/keep") == .upstream(index: 2, path: "/k/keep"))
        #expect(route(router, "/") == .upstream(index: 3, path: "/r/"))
        #expect(route(router, "/API/x") == .upstream(index: 3, path: "/r/API/x"))
    }

    @Test("the root prefix is never stripped; no base and nothing left joins to /")
    func rootJoin() {
        let router = Router(
            upstreams: [Self.upstream("a", prefix: "/a"), Self.upstream("r", prefix: "/")],
            unmatched: .reject)
        #expect(route(router, "/a") == .upstream(index: 0, path: "/"))
        #expect(route(router, "/a?") == .upstream(index: 0, path: "/?"))
        #expect(route(router, "/") == .upstream(index: 1, path: "/"))
        #expect(route(router, "/b/c") == .upstream(index: 1, path: "/b/c"))
    }

    @Test("the query is kept byte for byte")
    func queryBytes() {
        let router = Router(
            upstreams: [
                Self.upstream("a", hosts: ["a.test"], prefix: nil, base: "/b"),
                Self.upstream("p", prefix: "/p"),
            ], unmatched: .passthrough)
        let query = "a=%20&b=&&c=%2F?d=%C3%A9;e"
        #expect(route(router, "http://a.test/x?\(query)") == .upstream(index: 0, path: "/b/x?\(query)"))
        #expect(route(router, "/p/x?\(query)") == .upstream(index: 1, path: "/x?\(query)"))
        #expect(route(router, "/x?\(query)", host: "a.test") == .upstream(index: 0, path: "/b/x?\(query)"))
        #expect(route(router, "/x?", host: "a.test") == .upstream(index: 0, path: "/b/x?"))
        #expect(route(router, "/x", host: "a.test") == .upstream(index: 0, path: "/b/x"))
        #expect(route(router, "http://z.test/x?\(query)") == .passthrough(url: "http://z.test/x?\(query)"))
    }

    @Test("origin form falls back to the Host header: port ignored, case-insensitive, exact beats wildcard")
    func hostHeader() {
        let router = Router(
            upstreams: [
                Self.upstream("wild", hosts: ["*.a.com"]), Self.upstream("exact", hosts: ["x.a.com"]),
                Self.upstream("deeper", hosts: ["*.y.a.com"]), Self.upstream("v6", hosts: ["::1", "10.0.0.1"]),
            ], unmatched: .reject)
        #expect(route(router, "/p", host: "X.A.COM:8443") == .upstream(index: 1, path: "/p"))
        #expect(route(router, "/p", host: "y.a.com") == .upstream(index: 0, path: "/p"))
        #expect(route(router, "/p", host: "z.x.a.com") == .upstream(index: 0, path: "/p"))
        #expect(route(router, "/p", host: "z.y.a.com") == .upstream(index: 2, path: "/p"))
        #expect(route(router, "/p", host: "a.com") == .noRoute)
        #expect(route(router, "/p", host: "xa.com") == .noRoute)
        #expect(route(router, "/p", host: "[::1]:8080") == .upstream(index: 3, path: "/p"))
        #expect(route(router, "/p", host: "10.0.0.1") == .upstream(index: 3, path: "/p"))
        #expect(route(router, "/p") == .noRoute)
        #expect(route(router, "/p", host: "") == .noRoute)
        #expect(route(router, "/p", host: "bad host") == .noRoute)
        #expect(route(router, "http://X.a.com/p") == .upstream(index: 1, path: "/p"))
        #expect(route(router, "http://q.y.a.com/p") == .upstream(index: 2, path: "/p"))
        #expect(route(router, "http://[::1]:9/p") == .upstream(index: 3, path: "/p"))
    }

    @Test("precedence: origin form tries every prefix before any Host match; absolute form ignores prefixes")
    func precedence() {
        let router = Router(
            upstreams: [
                Self.upstream("byhost", hosts: ["h.test"], base: "/host"),
                Self.upstream("byprefix", prefix: "/api", base: "/prefix"),
                Self.upstream("wildprefix", hosts: ["*.h.test"], prefix: "/api", base: "/wp"),
                Self.upstream("wild", hosts: ["*.h.test"], base: "/w"),
            ], unmatched: .reject)
        // Same prefix on two upstreams is a config error; here the first listed wins the tie.
        #expect(route(router, "/api/x", host: "h.test") == .upstream(index: 1, path: "/prefix/x"))
        #expect(route(router, "/api/x", host: "a.h.test") == .upstream(index: 1, path: "/prefix/x"))
        #expect(route(router, "/other", host: "h.test") == .upstream(index: 0, path: "/host/other"))
        #expect(route(router, "/other", host: "a.h.test") == .upstream(index: 2, path: "/wp/other"))
        #expect(route(router, "http://h.test/api/x") == .upstream(index: 0, path: "/host/api/x"))
        #expect(route(router, "http://a.h.test/api/x") == .upstream(index: 2, path: "/wp/api/x"))
        #expect(route(router, "http://a.h.test/apix") == .upstream(index: 2, path: "/wp/apix"))
    }

    @Test("strip_prefix false keeps the prefix; absolute form never strips")
    func stripFalse() {
        let router = Router(
            upstreams: [
                Self.upstream("k", hosts: ["k.test"], prefix: "/api", strip: false, base: "/b"),
                Self.upstream("s", hosts: ["s.test"], prefix: "/sapi", strip: true, base: "/c"),
            ], unmatched: .reject)
        #expect(route(router, "http://k.test/api/x?y") == .upstream(index: 0, path: "/b/api/x?y"))
        #expect(route(router, "/api/x?y", host: "k.test") == .upstream(index: 0, path: "/b/api/x?y"))
        #expect(route(router, "/sapi/x?y") == .upstream(index: 1, path: "/c/x?y"))
        #expect(route(router, "http://s.test/sapi/x?y") == .upstream(index: 1, path: "/c/sapi/x?y"))
    }

    @Test("passthrough forwards unmatched http requests as they are")
    func passthrough() {
        let router = Router(upstreams: [Self.upstream("a", hosts: ["a.test"])], unmatched: .passthrough)
        #expect(route(router, "http://h.test:81/x?q") == .passthrough(url: "http://h.test:81/x?q"))
        #expect(route(router, "http://h.test") == .passthrough(url: "http://h.test/"))
        #expect(route(router, "http://[::1]:81/x") == .passthrough(url: "http://[::1]:81/x"))
        #expect(route(router, "https://h.test/x") == .noRoute)
        #expect(route(router, "/x?q", host: "h.test") == .passthrough(url: "http://h.test/x?q"))
        #expect(route(router, "/x?q", host: "h.test:8080") == .passthrough(url: "http://h.test:8080/x?q"))
        #expect(route(router, "/x", host: "[::1]:81") == .passthrough(url: "http://[::1]:81/x"))
        #expect(route(router, "/x") == .noRoute)
        #expect(route(router, "/x", host: "h.test/evil") == .noRoute)
        #expect(route(router, "/x", host: "") == .noRoute)
        #expect(route(router, "*") == .noRoute)
        #expect(route(router, "h.test:443") == .noRoute)
        #expect(route(router, "http://a.test/x") == .upstream(index: 0, path: "/x"))
        // A host RFC 3986 allows but no resolver takes: no route, not an attempt that fails.
        for host in ["a%0ab.invalid", "a'b.invalid", "a=b.invalid", "a!b", "a~b"] {
            #expect(route(router, "/zz", host: host) == .noRoute, "\(host)")
            #expect(route(router, "http://\(host)/zz") == .noRoute, "\(host)")
        }
        #expect(route(router, "/x", host: "h_1.test") == .passthrough(url: "http://h_1.test/x"))
        #expect(route(router, "/x", host: "10.0.0.1:81") == .passthrough(url: "http://10.0.0.1:81/x"))
    }

    @Test("reject never passes through; asterisk and authority forms never route")
    func reject() {
        let router = Router(upstreams: [Self.upstream("r", prefix: "/")], unmatched: .reject)
        #expect(route(router, "http://h.test/x") == .noRoute)
        #expect(route(router, "*") == .noRoute)
        #expect(route(router, "h.test:443") == .noRoute)
        #expect(
            Router(upstreams: [], unmatched: .reject).route(
                target: RequestTarget(form: .origin, path: "/", query: nil),
                hostHeader: "h") == .noRoute)
    }

    @Test("routes built from a parsed config")
    func fromConfig() throws {
        let config = try ConfigLoader.parse(
            yaml: """
                version: 1
                listen: [127.0.0.1:0]
                upstreams:
                  - {name: api, match: {hosts: [api.test], path_prefix: /api/}, url: "https://api.test/v2/"}
                  - {name: web, match: {hosts: ["*.Web.test"]}, url: "http://[::1]:9000"}
                """, file: "t.yaml", baseDirectory: "/")
        let router = Router(upstreams: config.upstreams, unmatched: config.unmatched)
        #expect(route(router, "/api/users?id=1", host: "api.test") == .upstream(index: 0, path: "/v2/users?id=1"))
        #expect(route(router, "/x", host: "www.web.test") == .upstream(index: 1, path: "/x"))
        #expect(route(router, "/x", host: "api.test") == .upstream(index: 0, path: "/v2/x"))
        #expect(route(router, "/api/users", host: "www.web.test") == .upstream(index: 0, path: "/v2/users"))
        #expect(route(router, "/y", host: "other.test") == .noRoute)
    }
}
