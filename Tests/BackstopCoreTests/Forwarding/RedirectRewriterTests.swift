import BackstopCore
import Testing

/// `Location` / `Content-Location` mapped back to what the client sees (docs/reference/behaviour.md#forwarding).
@Suite("Redirect rewriting")
struct RedirectRewriterTests {
    private static func upstream(
        url: String, prefix: String? = nil, strip: Bool = true, hosts: [String] = ["api.test"]
    )
        throws -> UpstreamConfig
    {
        let config = try ConfigLoader.parse(
            yaml: """
                version: 1
                listen: [127.0.0.1:0]
                upstreams:
                  - name: api
                    match: {hosts: [\(hosts.joined(separator: ", "))]\(prefix.map { ", path_prefix: \($0), strip_prefix: \(strip)" } ?? "")}
                    url: \(url)
                """, file: "t.yaml", baseDirectory: "/")
        return config.upstreams[0]
    }

    private static func rewriter(_ upstream: UpstreamConfig, _ uri: String) throws -> RedirectRewriter {
        RedirectRewriter(upstream: upstream, target: try #require(RequestTarget.parse(uri)))
    }

    @Test("origin form through a stripped prefix: the upstream's URL and base path become the prefix")
    func strippedPrefix() throws {
        let r = try Self.rewriter(try Self.upstream(url: "https://api.example.com/base", prefix: "/api"), "/api/login")
        #expect(r.rewrite("/base/") == "/api/")
        #expect(r.rewrite("/base") == "/api")
        #expect(r.rewrite("/base/next?x=1") == "/api/next?x=1")
        #expect(r.rewrite("https://api.example.com/base/next") == "/api/next")
        #expect(r.rewrite("HTTPS://API.Example.com:443/base?q") == "/api?q")
        // Not the upstream's: another host, another path, a look-alike path, a relative reference.
        #expect(r.rewrite("https://other.example.com/base/x") == nil)
        #expect(r.rewrite("https://api.example.com:8443/base/x") == nil)
        #expect(r.rewrite("/elsewhere") == nil)
        #expect(r.rewrite("/basement") == nil)
        #expect(r.rewrite("next") == nil)
        #expect(r.rewrite("//evil.test/base") == nil)
    }

    @Test("origin form through the Host header or an unstripped prefix: only the base path and origin go")
    func unstripped() throws {
        let byHost = try Self.rewriter(try Self.upstream(url: "http://127.0.0.1:9000/v2"), "/users")
        #expect(byHost.rewrite("/v2/users/1") == "/users/1")
        #expect(byHost.rewrite("http://127.0.0.1:9000/v2/users/1") == "/users/1")
        #expect(byHost.rewrite("http://127.0.0.1:9000/v2") == "/")
        let kept = try Self.rewriter(
            try Self.upstream(url: "http://127.0.0.1:9000", prefix: "/api", strip: false), "/api/x")
        #expect(kept.rewrite("/api/y") == nil)
        #expect(kept.rewrite("http://127.0.0.1:9000/api/y") == "/api/y")
    }

    @Test("absolute form: back to the host the client asked for")
    func absoluteForm() throws {
        let r = try Self.rewriter(
            try Self.upstream(url: "https://api.example.com/v2", prefix: "/api"),
            "http://api.test:8080/v2/users")
        #expect(r.rewrite("https://api.example.com/v2/v2/next") == "http://api.test:8080/v2/next")
        #expect(r.rewrite("/v2/other") == "http://api.test:8080/other")
        #expect(r.rewrite("https://elsewhere.test/x") == nil)
    }

    @Test("the head's Location and Content-Location values are replaced in place, other fields untouched")
    func inTheHead() throws {
        var parser = UpstreamHeadParser()
        var head: UpstreamResponseHead?
        for line in [
            "HTTP/1.1 302 Found\r\n", "X-A: 1\r\n", "Location: /base/next\r\n", "Content-Location: /base\r\n",
            "X-B: 2\r\n", "\r\n",
        ] {
            let bytes = Array(line.utf8)
            if let h = bytes.withUnsafeBytes({ parser.consume($0) }) { head = h }
        }
        var rewritten = try #require(head)
        rewritten.rewriteRedirects(
            try Self.rewriter(try Self.upstream(url: "https://api.example.com/base", prefix: "/api"), "/api/a"))
        #expect(
            String(decoding: rewritten.fields, as: UTF8.self)
                == "X-A: 1\r\nLocation: /api/next\r\nContent-Location: /api\r\nX-B: 2\r\n")
    }
}
