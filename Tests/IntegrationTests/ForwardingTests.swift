import BackstopTestSupport
import Foundation
import Testing

/// docs/reference/behaviour.md, routing and forwarding through the real proxy over loopback sockets.
@Suite("Forwarding")
struct ForwardingTests {
    @Test("absolute-form request reaches the upstream with path, query, headers rewritten")
    func absoluteForm() async throws {
        try await withOriginAndProxy(
            origin: { _ in
                .text(
                    200, "hello",
                    headers: [("X-Origin", "yes"), ("Connection", "close, X-Drop-Me"), ("X-Drop-Me", "1")])
            },
            config: { singleUpstreamConfig($0, basePath: "/v2") }
        ) { origin, proxy in
            let request = RawHTTP.request(
                "GET", "http://app.test/items/7?a=%20&b=&&c", host: "app.test",
                headers: [
                    ("Connection", "keep-alive, X-Hop"), ("X-Hop", "secret-hop"), ("Keep-Alive", "timeout=5"),
                    ("Proxy-Authorization", "Basic Zm9vOmJhcg=="), ("TE", "trailers"), ("X-Custom", "kept"),
                    ("Accept-Encoding", "gzip"), ("X-Spaced", " \t a \t b \t "),
                ])
            let response = try await proxy.send(request)
            #expect(response.status == 200)
            #expect(response.bodyString == "hello")
            #expect(response.header("X-Backstop-Attempts") == "1")
            #expect(response.header("X-Origin") == "yes")
            #expect(response.header("X-Drop-Me") == nil)
            let seen = try #require(origin.requests.first)
            #expect(seen.method == "GET")
            #expect(seen.uri == "/v2/items/7?a=%20&b=&&c")
            #expect(seen.header("Host") == "127.0.0.1:\(origin.port)")
            #expect(seen.header("Via") == "1.1 backstop")
            #expect(seen.header("X-Custom") == "kept")
            #expect(seen.header("Accept-Encoding") == "gzip")
            // Surrounding spaces and tabs are not part of a value (RFC 9110 §5.5); the test origin's llhttp would
            // have kept the trailing ones.
            #expect(seen.header("X-Spaced") == "a \t b")
            for hop in ["Connection", "X-Hop", "Keep-Alive", "Proxy-Authorization", "TE", "Accept"] {
                #expect(seen.header(hop) == nil, "\(hop) must not be forwarded")
            }
        }
    }

    /// Every path and query form reaches the upstream byte for byte, whichever way the transport hands the URL to
    /// curl (a per-handle URL handle for plain targets, the whole URL for percent-encoded ones: curl's URL API
    /// would lower-case `%2F`). Several rounds, so that handles are reused between the two ways.
    @Test("paths and queries are forwarded byte for byte: encoded slashes, reserved and repeated characters")
    func targetsByteForByte() async throws {
        let targets = [
            "/a%2Fb/c", "/a%2fb", "/%E2%82%AC/x", "/p?x=%2F&y=%2f&z=%E2%82%AC", "/p?a=1&a=1&a=", "/p?==&&", "/p?",
            "/p/?", "/:@!$&'()*+,;=", "/~user/x-y_z.json", "//double//slash",
            "/v1/users/42/orders?page=2&sort=-created_at&filter[status]=open",
            "/p;x?y;z", "/a..b/c.d", "/p?q=a+b&r=%20&s=%25", "/", "/p?q=%7E", "/.well-known/x", "/p?a=%41%3d",
            "/plain/again", "/a%2Fb/again",
        ]
        try await withOriginAndProxy(
            origin: { _ in .text(200, "ok") },
            config: { singleUpstreamConfig($0, basePath: "/v2") }
        ) { origin, proxy in
            for _ in 0..<2 {
                for target in targets {
                    let response = try await proxy.send(
                        RawHTTP.request("GET", "http://app.test" + target, host: "app.test"))
                    #expect(response.status == 200, "\(target)")
                }
            }
            let seen = origin.requests.map(\.uri)
            #expect(seen == (targets + targets).map { "/v2" + $0 })
        }
    }

    @Test("origin-form request is routed by path prefix, stripped, joined with the base path")
    func originFormPrefix() async throws {
        try await withOriginAndProxy(
            origin: { _ in .text(200, "ok") },
            config: { origin in
                """
                upstreams:
                  - name: api
                    match:
                      path_prefix: /api
                    url: \(origin.baseURL)/base/
                  - name: keep
                    match:
                      path_prefix: /keep
                      strip_prefix: false
                    url: \(origin.baseURL)
                """
            }
        ) { origin, proxy in
            let r1 = try await proxy.get("/api/users?x=1")
            #expect(r1.status == 200)
            let r2 = try await proxy.get("/api")
            #expect(r2.status == 200)
            let r3 = try await proxy.get("/keep/this")
            #expect(r3.status == 200)
            let r4 = try await proxy.get("/apix")
            #expect(r4.status == 403)
            let uris = origin.requests.map(\.uri)
            #expect(uris == ["/base/users?x=1", "/base", "/keep/this"])
        }
    }

    @Test("origin-form request is routed by Host header when no prefix matches")
    func originFormHost() async throws {
        try await withOriginAndProxy(
            origin: { _ in .text(200, "ok") },
            config: { singleUpstreamConfig($0) }
        ) { origin, proxy in
            let response = try await proxy.get("/by-host", host: "APP.test:8080")
            #expect(response.status == 200)
            #expect(origin.requests.map(\.uri) == ["/by-host"])
        }
    }

    @Test("request bodies and methods pass through unchanged")
    func bodies() async throws {
        try await withOriginAndProxy(
            origin: { request in
                .respond(status: 201, headers: [("X-Len", String(request.body.count))], body: request.body)
            },
            config: { singleUpstreamConfig($0) }
        ) { origin, proxy in
            let payload = Array("{\"name\":\"backstop\"}".utf8)
            let post = try await proxy.send(
                RawHTTP.request(
                    "POST", "http://app.test/things", host: "app.test", headers: [("Content-Type", "application/json")],
                    body: payload))
            #expect(post.status == 201)
            #expect(post.body == payload)
            let chunked = try await proxy.send(
                Array(
                    "PATCH http://app.test/c HTTP/1.1\r\nHost: app.test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
                        .utf8))
            #expect(chunked.status == 201)
            #expect(chunked.bodyString == "hello world")
            let empty = try await proxy.send(RawHTTP.request("DELETE", "http://app.test/d", host: "app.test"))
            #expect(empty.status == 201)
            let requests = origin.requests
            #expect(requests.map(\.method) == ["POST", "PATCH", "DELETE"])
            #expect(requests[0].header("Content-Type") == "application/json")
            #expect(requests[0].header("Content-Length") == String(payload.count))
            #expect(requests[1].bodyString == "hello world")
            #expect(requests[2].body.isEmpty)
        }
    }

    @Test("one request's method, body and headers never carry over to the next on a reused easy handle")
    func handleReuseAcrossMethods() async throws {
        try await withOriginAndProxy(
            origin: { request in .text(200, "\(request.method) \(request.uri) \(request.body.count)") },
            config: { singleUpstreamConfig($0) }
        ) { origin, proxy in
            // Sequential requests on one client connection: the transport takes the same idle handle each time.
            let connection = try await RawHTTPConnection.connect(port: proxy.port)
            defer { Task { await connection.close() } }
            let steps: [(method: String, body: [UInt8]?, header: (String, String)?)] = [
                ("HEAD", nil, ("X-Only-First", "1")), ("POST", Array("abc".utf8), nil), ("GET", nil, nil),
                ("PUT", Array("twelve bytes".utf8), ("Accept", "text/x-put")), ("HEAD", nil, nil), ("DELETE", nil, nil),
                ("OPTIONS", nil, nil), ("GET", nil, nil), ("PATCH", [], nil), ("GET", nil, nil),
            ]
            for (i, step) in steps.enumerated() {
                let response = try await connection.exchange(
                    RawHTTP.request(
                        step.method, "http://app.test/\(i)", host: "app.test",
                        headers: step.header.map { [$0] } ?? [], body: step.body),
                    timeout: .seconds(10))
                #expect(response.status == 200)
                let expected = step.method == "HEAD" ? "" : "\(step.method) /\(i) \(step.body?.count ?? 0)"
                #expect(response.bodyString == expected, "step \(i) \(step.method)")
            }
            let requests = origin.requests
            #expect(requests.map(\.method) == steps.map(\.method))
            for (i, (request, step)) in zip(requests, steps).enumerated() {
                #expect(request.body == (step.body ?? []), "step \(i)")
                // A body travels with its length; a bodiless GET/HEAD/DELETE/OPTIONS carries no framing at all.
                #expect(request.header("Content-Length") == step.body.map { String($0.count) }, "step \(i)")
                #expect(request.header("Transfer-Encoding") == nil, "step \(i)")
                #expect((request.header("X-Only-First") != nil) == (i == 0), "step \(i)")
                #expect(request.header("Accept") == (i == 3 ? "text/x-put" : nil), "step \(i)")
                #expect(request.header("Expect") == nil, "step \(i)")
            }
        }
    }

    @Test("HEAD and 204/304 responses carry no body, and the connection stays usable")
    func bodylessResponses() async throws {
        try await withOriginAndProxy(
            origin: { request in
                switch request.uri {
                case "/204": .respond(status: 204)
                case "/304": .respond(status: 304, headers: [("ETag", "\"x\"")])
                default: .text(200, "twelve bytes")
                }
            },
            config: { singleUpstreamConfig($0) }
        ) { _, proxy in
            let connection = try await RawHTTPConnection.connect(port: proxy.port)
            defer { Task { await connection.close() } }
            let head = try await connection.exchange(
                RawHTTP.request("HEAD", "http://app.test/x", host: "app.test"), timeout: .seconds(10))
            #expect(head.status == 200)
            #expect(head.body.isEmpty)
            let noContent = try await connection.exchange(
                RawHTTP.request("GET", "http://app.test/204", host: "app.test"), timeout: .seconds(10))
            #expect(noContent.status == 204)
            let notModified = try await connection.exchange(
                RawHTTP.request("GET", "http://app.test/304", host: "app.test"), timeout: .seconds(10))
            #expect(notModified.status == 304)
            let after = try await connection.exchange(
                RawHTTP.request("GET", "http://app.test/x", host: "app.test"), timeout: .seconds(10))
            #expect(after.bodyString == "twelve bytes")
        }
    }

    @Test("pipelined requests are answered in order")
    func pipelining() async throws {
        try await withOriginAndProxy(
            origin: { request in
                request.uri == "/slow" ? .delay(.milliseconds(200), then: .text(200, "slow")) : .text(200, request.uri)
            },
            config: { singleUpstreamConfig($0) }
        ) { _, proxy in
            let requests = ["/slow", "/a", "/b"].map {
                RawHTTP.request("GET", "http://app.test\($0)", host: "app.test")
            }
            let responses = try await RawHTTP.exchangeMany(port: proxy.port, requests: requests, timeout: .seconds(10))
            #expect(responses.map(\.bodyString) == ["slow", "/a", "/b"])
        }
    }

    @Test("100 sequential requests reuse upstream connections (at most 2 opened)")
    func connectionReuse() async throws {
        try await withOriginAndProxy(
            origin: { _ in .text(200, "ok") },
            config: { singleUpstreamConfig($0) }
        ) { origin, proxy in
            let connection = try await RawHTTPConnection.connect(port: proxy.port)
            for i in 0..<100 {
                let response = try await connection.exchange(
                    RawHTTP.request("GET", "http://app.test/\(i)", host: "app.test"), timeout: .seconds(10))
                #expect(response.status == 200)
            }
            await connection.close()
            #expect(origin.requestCount == 100)
            #expect(origin.connectionCount <= 2)
        }
    }

    @Test("200 concurrent clients are all served")
    func concurrentClients() async throws {
        try await withOriginAndProxy(
            origin: { request in .delay(.milliseconds(50), then: .text(200, request.uri)) },
            config: { singleUpstreamConfig($0) }
        ) { origin, proxy in
            let statuses = try await withThrowingTaskGroup(of: (Int, String).self) { group in
                for i in 0..<200 {
                    group.addTask {
                        let response = try await proxy.get("http://app.test/c\(i)", host: "app.test")
                        return (response.status, response.bodyString)
                    }
                }
                var all: [(Int, String)] = []
                for try await result in group { all.append(result) }
                return all
            }
            #expect(statuses.count == 200)
            #expect(statuses.allSatisfy { $0.0 == 200 })
            #expect(Set(statuses.map(\.1)).count == 200)
            #expect(origin.requestCount == 200)
        }
    }

    @Test("unmatched: passthrough forwards absolute-form requests as they are")
    func passthrough() async throws {
        let origin = try await TestOrigin.start { request in .text(200, "through \(request.uri)") }
        let proxy = try await ProxyHarness.start("unmatched: passthrough\nupstreams: []\n")
        let response = try await proxy.send(
            RawHTTP.request(
                "GET", "http://127.0.0.1:\(origin.port)/p?q=1", host: "127.0.0.1:\(origin.port)"))
        #expect(response.status == 200)
        #expect(response.bodyString == "through /p?q=1")
        #expect(origin.requests.first?.header("Via") == "1.1 backstop")
        await proxy.stop()
        try await origin.shutdown()
    }

    @Test(
        "a unix-domain listener serves requests and its socket file is 0660, bound privately and renamed into place: a link left at its path is replaced, its target untouched"
    )
    func unixListener() async throws {
        let directory = try TestFiles.makeTemporaryDirectory()
        defer { TestFiles.remove(directory) }
        let origin = try await TestOrigin.start { _ in .text(200, "via unix") }
        let path = directory + "/proxy.sock"
        // A link at the path to a file of someone else's: a chmod by path would have made it 0660.
        let target = directory + "/victim"
        #expect(
            FileManager.default.createFile(
                atPath: target, contents: Data("x".utf8), attributes: [.posixPermissions: 0o600]))
        #expect(symlink(target, path) == 0)
        let proxy = try await ProxyHarness.start(
            """
            listen:
              - 127.0.0.1:0
              - unix:\(path)
            \(singleUpstreamConfig(origin))
            """)
        let attributes = try FileManager.default.attributesOfItem(atPath: path)
        #expect((attributes[.posixPermissions] as? Int) == 0o660)
        #expect(attributes[.type] as? FileAttributeType == .typeSocket)
        #expect((try FileManager.default.attributesOfItem(atPath: target)[.posixPermissions] as? Int) == 0o600)
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory).sorted() == ["proxy.sock", "victim"])
        let response = try await RawHTTP.exchange(
            unixPath: path, request: RawHTTP.request("GET", "http://app.test/u", host: "app.test"),
            timeout: .seconds(10))
        #expect(response.bodyString == "via unix")
        await proxy.stop()
        #expect(!FileManager.default.fileExists(atPath: path))
        try await origin.shutdown()
    }
}

@Suite("HTTP/1.0 clients")
struct HTTP10Tests {
    @Test("an HTTP/1.0 client gets a close-delimited body when the upstream sends no length")
    func closeDelimited() async throws {
        let chunks = [Array("part-one;".utf8), Array("part-two".utf8)]
        try await withOriginAndProxy(
            origin: { _ in .chunked(status: 200, headers: [], chunks: chunks) },
            config: { singleUpstreamConfig($0) }
        ) { _, proxy in
            let port = proxy.port
            let raw = try await Task.detached {
                try rawExchange(port: port, Array("GET http://app.test/ HTTP/1.0\r\nHost: app.test\r\n\r\n".utf8))
            }.value
            #expect(raw.hasPrefix("HTTP/1.0 200"))
            #expect(!raw.lowercased().contains("transfer-encoding"))
            #expect(raw.hasSuffix("\r\n\r\npart-one;part-two"))
        }
    }
}
