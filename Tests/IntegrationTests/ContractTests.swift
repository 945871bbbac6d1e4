import BackstopCore
import BackstopTestSupport
import Foundation
import Testing

/// What a newcomer relies on (docs/reference): routing both ways over real sockets, redirects that stay inside
/// Backstop's routes, and logs that explain every answer.
@Suite("Contract: routing, redirects, logs")
struct ContractTests {
    @Test("the reference upstream serves an HTTP_PROXY client by host and an app whose base URL is Backstop by prefix")
    func bothWaysIn() async throws {
        try await withOriginAndProxy(
            origin: { request in .text(200, request.uri) },
            config: { origin in
                """
                upstreams:
                  - name: api
                    match: {hosts: [api.example.com], path_prefix: /api}
                    url: \(origin.baseURL)/v2
                """
            }
        ) { _, proxy in
            let byHost = try await proxy.get("http://api.example.com/v2/users?id=1", host: "api.example.com")
            #expect(byHost.status == 200)
            #expect(byHost.bodyString == "/v2/v2/users?id=1")
            // The app's base URL is http://127.0.0.1:PORT/api: its Host header names Backstop, not the upstream.
            let byPrefix = try await proxy.get("/api/users?id=1", host: "127.0.0.1:\(proxy.port)")
            #expect(byPrefix.status == 200)
            #expect(byPrefix.bodyString == "/v2/users?id=1")
            let outside = try await proxy.get("/other", host: "127.0.0.1:\(proxy.port)")
            #expect(outside.status == 403)
            #expect(outside.header("X-Backstop-Error") == "no-route")
        }
    }

    @Test("an upstream redirect to its own base path is followed through Backstop's prefix (curl -L)")
    func redirectsStayInside() async throws {
        try await withOriginAndProxy(
            origin: { request in
                request.uri == "/base/start"
                    ? .respond(status: 302, headers: [("Location", "/base/next?x=1")])
                    : .text(200, "landed \(request.uri)")
            },
            config: { origin in
                """
                upstreams:
                  - {name: api, match: {path_prefix: /api}, url: "\(origin.baseURL)/base"}
                """
            }
        ) { _, proxy in
            let redirect = try await proxy.get("/api/start", host: "127.0.0.1")
            #expect(redirect.status == 302)
            let location = try #require(redirect.header("Location"))
            #expect(location == "/api/next?x=1")
            let followed = try await proxy.get(location, host: "127.0.0.1")
            #expect(followed.status == 200)
            #expect(followed.bodyString == "landed /base/next?x=1")
        }
    }

    @Test("every client request gets exactly one access line, whoever answered it, with the cause of a failure")
    func accessLines() async throws {
        let capture = LogCapture()
        let origin = try await TestOrigin.start { _ in .text(200, "ok") }
        let closed = try FreePort.reserveClosedPort()
        let proxy = try await ProxyHarness.start(
            """
            limits: {max_request_body: 1KiB, client_idle_timeout: 300ms}
            upstreams:
              - {name: app, match: {hosts: [app.test]}, url: "\(origin.baseURL)"}
              - name: gone
                match: {hosts: [gone.test]}
                url: http://127.0.0.1:\(closed)
                retry: {attempts: 3, backoff: {base: 1ms, max: 2ms}}
            """, capture: capture)
        let port = proxy.port
        #expect(try await proxy.get("http://app.test/ok?secret=1", host: "app.test").status == 200)
        #expect(try await proxy.get("http://nowhere.test/x", host: "nowhere.test").status == 403)
        let unreachable = try await proxy.get("http://gone.test/down", host: "gone.test")
        #expect(unreachable.status == 502)
        #expect(unreachable.header("X-Backstop-Attempts") == "3")
        #expect(
            try await proxy.send(
                RawHTTP.request(
                    "POST", "http://app.test/big", host: "app.test",
                    body: Array(repeating: 0x61, count: 2048))
            ).status == 413)
        let connect = try await BlockingSocket.onThread {
            try rawExchange(port: port, Array("CONNECT api.test:443 HTTP/1.1\r\nHost: api.test:443\r\n\r\n".utf8))
        }()
        #expect(connect.hasPrefix("HTTP/1.1 405 "))
        let stalled = try await BlockingSocket.onThread {
            try rawExchange(
                port: port,
                Array("POST http://app.test/s HTTP/1.1\r\nHost: app.test\r\nContent-Length: 9\r\n\r\nab".utf8))
        }()
        #expect(stalled.hasPrefix("HTTP/1.1 408 "))
        let garbage = try await BlockingSocket.onThread {
            try rawExchange(port: port, Array("NOT HTTP AT ALL\r\n\r\n".utf8))
        }()
        #expect(garbage.hasPrefix("HTTP/1.1 400 "))

        let lines = try await capture.waitFor("request", count: 7)
        #expect(lines.count == 7, "\(lines.joined(separator: "\n"))")
        func line(_ fragment: String) -> String? { lines.first { $0.contains(fragment) } }
        let ok = try #require(line("path=/ok"))
        #expect(ok.contains("status=200") && ok.contains("host=app.test") && ok.contains("upstream=app"))
        #expect(ok.contains("client=127.0.0.1:") && ok.contains("attempts=1") && ok.contains("bytes=2"))
        #expect(!ok.contains("secret"), "queries stay out of the log")
        #expect(try #require(line("host=nowhere.test")).contains("status=403"))
        let down = try #require(line("path=/down"))
        #expect(
            down.contains("status=502") && down.contains("error=upstream-unreachable") && down.contains("attempts=3"))
        #expect(down.contains("retries=connect-failure,connect-failure"))
        #expect(down.contains("reason=\"curl=7 "), "the cause is named: \(down)")
        #expect(down.contains("address=127.0.0.1:\(closed)"))
        #expect(try #require(line("path=/big")).contains("error=body-too-large"))
        #expect(try #require(line("method=CONNECT")).contains("error=connect-not-supported"))
        #expect(try #require(line("error=request-timeout")).contains("status=408"))
        #expect(try #require(line("error=bad-request")).contains("status=400"))
        // The failed attempt itself is logged at info with its cause (the retried ones at debug).
        let failed = capture.messages("attempt failed")
        #expect(failed.count == 1)
        #expect(failed.first?.contains("outcome=connect-failure") == true)
        await proxy.stop()
        try await origin.shutdown()
    }

    @Test("JSON access lines write numbers as numbers")
    func jsonNumbers() async throws {
        let capture = LogCapture()
        let proxy = try await ProxyHarness.start("log: {format: json}\nupstreams: []\n", capture: capture)
        _ = try await proxy.get("http://nowhere.test/x", host: "nowhere.test")
        let line = try #require(try await capture.waitFor("request", count: 1).first)
        #expect(line.contains("\"status\":403"))
        #expect(line.contains("\"attempts\":0"))
        #expect(line.contains("\"bytes\":0"))
        #expect(line.contains("\"ms\":0.0"))
        #expect(line.contains("\"host\":\"nowhere.test\""))
        await proxy.stop()
    }

    @Test("/metrics carries build info, process metrics, client connections, reloads and token expiry")
    func metrics() async throws {
        try await TokenRefreshTests.withAuthProxy(config: { origin, auth, directory in
            TokenRefreshTests.config(origin: origin, auth: auth, directory: directory)
                + "\nadmin: {listen: \"127.0.0.1:0\"}\n"
        }) { _, _, _, proxy in
            let kept = try await RawHTTPConnection.connect(port: proxy.port)
            #expect(
                try await kept.exchange(
                    RawHTTP.request("GET", "http://api.test/x", host: "api.test"), timeout: .seconds(5)
                ).status == 200)
            let admin = try #require(proxy.server.adminAddress?.port)
            let text = try await RawHTTP.exchange(
                port: admin, request: RawHTTP.request("GET", "/metrics", host: "a"),
                timeout: .seconds(5)
            ).bodyString
            #expect(text.contains("backstop_build_info{version=\"\(BackstopVersion.current)\"} 1\n"))
            #expect(text.contains("\nbackstop_client_connections 1\n"), "the kept connection")
            #expect(text.contains("backstop_config_reloads_total{result=\"success\"} 0\n"))
            for name in [
                "process_cpu_seconds_total ", "process_resident_memory_bytes ", "process_open_fds ",
                "process_start_time_seconds ", "backstop_config_last_reload_success_timestamp_seconds ",
            ] {
                #expect(text.contains("\n" + name), "\(name)")
            }
            let expiryLine = try #require(
                text.split(separator: "\n").first {
                    $0.hasPrefix("backstop_token_expiry_timestamp_seconds{upstream=\"api\"} ")
                })
            let expiry = try #require(Double(expiryLine.split(separator: " ").last ?? ""))
            let now = Date().timeIntervalSince1970
            #expect(expiry > now + 3000 && expiry < now + 3700, "the test endpoint grants an hour")
            await kept.close()
        }
    }
}
