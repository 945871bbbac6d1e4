import BackstopTestSupport
import Foundation
import Testing

/// The responses Backstop makes itself (docs/reference/errors.md), and that nothing reaches the upstream for them.
@Suite("Errors made by Backstop")
struct LocalErrorTests {
    private func expectLocalError(_ response: RawHTTPResponse, status: Int, reason: String) {
        #expect(response.status == status)
        #expect(response.header("X-Backstop-Error") == reason)
        #expect(response.header("Content-Type")?.hasPrefix("text/plain") == true)
        let lines = response.bodyString.split(separator: "\n", omittingEmptySubsequences: false)
        #expect(lines.count == 2 && lines[1].isEmpty, "one-line body, got \(response.bodyString.debugDescription)")
    }

    @Test("CONNECT → 405 connect-not-supported")
    func connect() async throws {
        try await withOriginAndProxy(origin: { _ in .text(200, "no") }, config: { singleUpstreamConfig($0) }) {
            origin, proxy in
            // A client library would read a CONNECT response as a tunnel; read the raw bytes instead.
            let port = proxy.port
            let raw = try await Task.detached {
                try rawExchange(port: port, Array("CONNECT app.test:443 HTTP/1.1\r\nHost: app.test:443\r\n\r\n".utf8))
            }.value
            #expect(raw.hasPrefix("HTTP/1.1 405 "))
            #expect(raw.contains("\r\nX-Backstop-Error: connect-not-supported\r\n"))
            #expect(raw.hasSuffix("\r\n\r\nCONNECT is not supported\n"))
            #expect(origin.requestCount == 0)
        }
    }

    @Test("no matching upstream → 403 no-route")
    func noRoute() async throws {
        try await withOriginAndProxy(origin: { _ in .text(200, "no") }, config: { singleUpstreamConfig($0) }) {
            origin, proxy in
            let r1 = try await proxy.get("http://other.test/x", host: "other.test")
            expectLocalError(r1, status: 403, reason: "no-route")
            let r2 = try await proxy.get("/x", host: "other.test")
            expectLocalError(r2, status: 403, reason: "no-route")
            #expect(origin.requestCount == 0)
        }
    }

    /// docs/reference/errors.md#connection-handling-after-an-error: a small declared body is read and dropped.
    @Test("403 no-route with a small body keeps the connection; with Expect: 100-continue it closes")
    func noRouteWithBody() async throws {
        try await withOriginAndProxy(origin: { _ in .text(200, "yes") }, config: { singleUpstreamConfig($0) }) {
            origin, proxy in
            let connection = try await RawHTTPConnection.connect(port: proxy.port)
            // The refused request and the next one in one write: exactly the 5 body bytes are dropped.
            try await connection.sendPipelined([
                Array("POST http://other.test/x HTTP/1.1\r\nHost: other.test\r\nContent-Length: 5\r\n\r\nhello".utf8),
                Array("GET http://app.test/y HTTP/1.1\r\nHost: app.test\r\n\r\n".utf8),
            ])
            let refused = try await connection.nextResponse(timeout: .seconds(5))
            expectLocalError(refused, status: 403, reason: "no-route")
            #expect(refused.header("Connection") == nil)
            let next = try await connection.nextResponse(timeout: .seconds(5))
            #expect(next.status == 200 && next.bodyString == "yes")
            await connection.close()
            #expect(origin.requestCount == 1)
            let expecting = try await RawHTTP.exchange(
                port: proxy.port,
                request:
                    "POST http://other.test/x HTTP/1.1\r\nHost: other.test\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n",
                timeout: .seconds(5))
            expectLocalError(expecting, status: 403, reason: "no-route")
            #expect(expecting.header("Connection") == "close")
        }
    }

    /// docs/reference/behaviour.md#request-syntax: bytes after complete requests that are no request cost those
    /// requests nothing; they are refused (400) after their answers, or never answered when a request before them
    /// closes the connection.
    @Test("bytes after complete requests: the requests are answered first, then 400 (or nothing, after a close)")
    func bytesAfterCompleteRequests() async throws {
        try await withOriginAndProxy(
            origin: { request in
                request.uri.hasSuffix("/slow")
                    ? .delay(.milliseconds(400), then: .text(200, "ok \(request.uri)"))
                    : .text(200, "ok \(request.uri)")
            }, config: { singleUpstreamConfig($0) }
        ) { origin, proxy in
            let port = proxy.port
            let cases: [(String, [String], Bool)] = [
                // A request that closes the connection, then another: its answer, and the connection closes.
                (
                    "POST http://app.test/a HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\nContent-Length: 5\r\n\r\nhello"
                        + "GET http://app.test/b HTTP/1.1\r\nHost: app.test\r\n\r\n", ["ok /a"], false
                ),
                (
                    "GET http://app.test/c HTTP/1.0\r\nHost: app.test\r\n\r\nGET http://app.test/d HTTP/1.0\r\n\r\n",
                    ["ok /c"], false
                ),
                // Two kept-alive requests, then bytes that are no request: both answers, then 400 and close.
                (
                    "GET http://app.test/e HTTP/1.1\r\nHost: app.test\r\n\r\n"
                        + "GET http://app.test/f HTTP/1.1\r\nHost: app.test\r\n\r\n" + "\u{1}garbage\r\n\r\n",
                    ["ok /e", "ok /f"], true
                ),
            ]
            for (request, answers, refused) in cases {
                let received = try await BlockingSocket.onThread { () throws -> String in
                    let socket = try BlockingSocket(port: port)
                    _ = socket.send(request)
                    return String(decoding: socket.readUntilClosed(timeout: .seconds(5)), as: UTF8.self)
                }()
                var rest = Substring(received)
                for answer in answers {
                    #expect(rest.hasPrefix("HTTP/1.1 200 ") || rest.hasPrefix("HTTP/1.0 200 "), "\(received)")
                    guard let end = rest.range(of: answer) else {
                        Issue.record("no \(answer) in \(received)")
                        break
                    }
                    rest = rest[end.upperBound...]
                }
                if refused {
                    #expect(
                        rest.hasPrefix("HTTP/1.1 400 ") && rest.contains("X-Backstop-Error: bad-request"), "\(received)"
                    )
                } else {
                    #expect(rest.isEmpty, "\(received)")
                }
            }
            // The bytes in a later read, while the request is still answered, and more after them: the same.
            let split = try await BlockingSocket.onThread { () throws -> String in
                let socket = try BlockingSocket(port: port)
                _ = socket.send("GET http://app.test/slow HTTP/1.1\r\nHost: app.test\r\n\r\n")
                _ = socket.waitForData(timeout: .milliseconds(100))  // nothing comes: the origin takes 400 ms
                _ = socket.send("\u{1}garbage\r\n")
                _ = socket.waitForData(timeout: .milliseconds(50))
                _ = socket.send("more\r\n\r\n")
                return String(decoding: socket.readUntilClosed(timeout: .seconds(5)), as: UTF8.self)
            }()
            #expect(split.hasPrefix("HTTP/1.1 200 ") && split.contains("ok /slow"), "\(split)")
            #expect(split.contains("HTTP/1.1 400 ") && split.contains("X-Backstop-Error: bad-request"), "\(split)")
            #expect(origin.requestCount == 5)
        }
    }

    @Test("body above max_request_body → 413 body-too-large, nothing sent upstream")
    func bodyTooLarge() async throws {
        try await withOriginAndProxy(
            origin: { _ in .text(200, "no") },
            config: { singleUpstreamConfig($0, extra: "limits:\n  max_request_body: 1KiB\n  retry_buffer: 512") }
        ) { origin, proxy in
            let declared = try await proxy.send(
                RawHTTP.request(
                    "POST", "http://app.test/up", host: "app.test", body: Array(repeating: 0x61, count: 2048)))
            expectLocalError(declared, status: 413, reason: "body-too-large")
            var chunked = "POST http://app.test/up HTTP/1.1\r\nHost: app.test\r\nTransfer-Encoding: chunked\r\n\r\n"
            for _ in 0..<8 { chunked += "100\r\n" + String(repeating: "b", count: 256) + "\r\n" }
            chunked += "0\r\n\r\n"
            let streamed = try await proxy.send(Array(chunked.utf8))
            expectLocalError(streamed, status: 413, reason: "body-too-large")
            #expect(origin.requestCount == 0)
        }
    }

    @Test(
        "a malformed chunk in a request being read: one 400 bad-request, its one access line with its upstream, method and path (not a 499 and a 400 of nobody's)",
        arguments: [
            "5\r\nhello\r\nzz\r\n", "5\r\nhello\r\n0\r\nContent-Length: 5\r\n\r\n",
        ])
    func malformedChunk(body: String) async throws {
        let origin = try await TestOrigin.start { _ in .text(200, "no") }
        let capture = LogCapture()
        let proxy = try await ProxyHarness.start(singleUpstreamConfig(origin), capture: capture)
        let response = try await proxy.send(
            Array(
                ("POST http://app.test/upload HTTP/1.1\r\nHost: app.test\r\nTransfer-Encoding: chunked\r\n\r\n" + body)
                    .utf8))
        #expect(response.status == 400)
        #expect(response.header("X-Backstop-Error") == "bad-request")
        await proxy.stop()
        let lines = capture.all.filter { $0.contains("msg=request") }
        #expect(lines.count == 1, "\(lines)")
        #expect(
            lines.first.map {
                $0.contains("status=400") && $0.contains("method=POST") && $0.contains("path=/upload")
                    && $0.contains("upstream=app") && $0.contains("error=bad-request")
            } == true, "\(lines)")
        try await origin.shutdown()
    }

    @Test("headers above max_header_bytes → 431 headers-too-large")
    func headersTooLarge() async throws {
        try await withOriginAndProxy(
            origin: { _ in .text(200, "no") },
            config: { singleUpstreamConfig($0, extra: "limits:\n  max_header_bytes: 4KiB") }
        ) { origin, proxy in
            let big = String(repeating: "x", count: 8 * 1024)
            let response = try await proxy.get("http://app.test/h", host: "app.test", headers: [("X-Big", big)])
            expectLocalError(response, status: 431, reason: "headers-too-large")
            let huge = String(repeating: "y", count: 100 * 1024)
            let hugeResponse = try await proxy.get("http://app.test/h", host: "app.test", headers: [("X-Huge", huge)])
            #expect(hugeResponse.status == 431)
            #expect(origin.requestCount == 0)
        }
    }

    @Test(
        "conflicting framing → 400 bad-request",
        arguments: [
            "POST http://app.test/ HTTP/1.1\r\nHost: app.test\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            "POST http://app.test/ HTTP/1.1\r\nHost: app.test\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
            "POST http://app.test/ HTTP/1.1\r\nHost: app.test\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n",
            "GET http://app.test/ HTTP/1.1\r\nHost: app.test\r\nX-Bad: a\rb\r\n\r\n",
            "GET http://app.test/ HTTP/1.1\r\nHost: app.test\r\nX-Folded: a\r\n b\r\n\r\n",
            "GARBAGE\r\n\r\n",
        ])
    func badRequests(raw: String) async throws {
        try await withOriginAndProxy(origin: { _ in .text(200, "no") }, config: { singleUpstreamConfig($0) }) {
            origin, proxy in
            let response = try await proxy.send(Array(raw.utf8))
            #expect(response.status == 400)
            #expect(response.header("X-Backstop-Error") == "bad-request")
            #expect(origin.requestCount == 0)
        }
    }

    @Test("closed upstream port → 502 upstream-unreachable")
    func unreachable() async throws {
        let closedPort = try FreePort.reserveClosedPort()
        let proxy = try await ProxyHarness.start(unreachableUpstreamConfig(closedPort: closedPort))
        let r3 = try await proxy.get("http://gone.test/", host: "gone.test")
        expectLocalError(r3, status: 502, reason: "upstream-unreachable")
        await proxy.stop()
    }

    /// A HEAD response never has a body (RFC 9110 §9.3.2): body bytes after a local error's head would be read by
    /// the client as the start of its next response. The head keeps its Content-Length and the connection stays up.
    @Test("HEAD answered by Backstop: the error head without its body, and the connection serves the next request")
    func headLocalErrors() async throws {
        let closedPort = try FreePort.reserveClosedPort()
        let proxy = try await ProxyHarness.start(unreachableUpstreamConfig(closedPort: closedPort))
        let port = proxy.port
        let received = try await BlockingSocket.onThread { () throws -> [String] in
            let socket = try BlockingSocket(port: port)
            var responses: [String] = []
            for (request, expectedEnd) in [
                ("HEAD http://gone.test/ HTTP/1.1\r\nHost: gone.test\r\n\r\n", "\r\n\r\n"),
                ("HEAD http://other.test/ HTTP/1.1\r\nHost: other.test\r\n\r\n", "\r\n\r\n"),
                (
                    "GET http://other.test/ HTTP/1.1\r\nHost: other.test\r\n\r\n",
                    "\r\n\r\nno upstream matches this request\n"
                ),
            ] {
                socket.send(request)
                let deadline = ContinuousClock.now + .seconds(5)
                while !String(decoding: socket.received, as: UTF8.self).hasSuffix(expectedEnd),
                    ContinuousClock.now < deadline
                {
                    if socket.waitForData(timeout: deadline - ContinuousClock.now) != .data { break }
                }
                responses.append(String(decoding: socket.received, as: UTF8.self))
                // Anything more (a body after a HEAD head) would arrive right behind the head.
                if socket.waitForData(timeout: .milliseconds(200)) == .data {
                    responses.append("unexpected: " + String(decoding: socket.received, as: UTF8.self))
                }
                socket.clear()
            }
            return responses
        }()
        await proxy.stop()
        try #require(received.count == 3, "\(received)")
        #expect(received[0].hasPrefix("HTTP/1.1 502 "))
        #expect(received[0].contains("\r\nX-Backstop-Error: upstream-unreachable\r\n"))
        #expect(received[0].contains("\r\nContent-Length: "))
        #expect(received[0].hasSuffix("\r\n\r\n") && !received[0].contains("Connection: close"))
        #expect(received[1].hasPrefix("HTTP/1.1 403 ") && received[1].hasSuffix("\r\n\r\n"))
        #expect(received[2].hasPrefix("HTTP/1.1 403 ") && received[2].contains("X-Backstop-Error: no-route"))
    }

    @Test("hanging upstream → 504 upstream-timeout after per_try")
    func timeout() async throws {
        try await withOriginAndProxy(
            origin: { _ in .hang },
            config: { origin in
                """
                upstreams:
                  - name: app
                    match: {hosts: [app.test]}
                    url: \(origin.baseURL)
                    timeouts: {connect: 1s, per_try: 300ms, total: 20s}
                    retry: {attempts: 1}
                """
            }
        ) { _, proxy in
            let started = ContinuousClock.now
            let r4 = try await proxy.get("http://app.test/", host: "app.test")
            expectLocalError(r4, status: 504, reason: "upstream-timeout")
            // per_try (300 ms) ended it, not total (20 s); the margin absorbs a loaded test machine.
            #expect(ContinuousClock.now - started < .seconds(10))
        }
    }
}

/// Sends bytes on a plain blocking socket and returns everything until the server closes (≤ 5 s).
func rawExchange(port: Int, _ bytes: [UInt8]) throws -> String {
    let socket = try BlockingSocket(port: port)
    socket.send(bytes)
    return String(decoding: socket.readUntilClosed(timeout: .seconds(5)), as: UTF8.self)
}
