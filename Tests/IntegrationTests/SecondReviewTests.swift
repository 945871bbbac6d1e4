import BackstopCore
import BackstopTestSupport
import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Regressions for the second attacker review's findings on the request path (each failed before its fix): the
/// unspecified address, tunnels to this host, trickled heads, traversal spellings, the kept-body budget, metadata
/// addresses and unsolicited `101`s.
@Suite("Second review regressions")
struct SecondReviewTests {
    // MARK: 1. the unspecified address is this host

    @Test("passthrough to 0.0.0.0 or 0 on the admin port → 508; to 0.0.0.0 on the proxy's own port → 508 at once")
    func unspecifiedAddressIsThisHost() async throws {
        let proxy = try await ProxyHarness.start("unmatched: passthrough\nadmin: {listen: \"127.0.0.1:0\"}\n")
        let admin = try #require(proxy.server.adminAddress?.port)
        for host in ["0.0.0.0:\(admin)", "0:\(admin)", "0.1.2.3:\(admin)"] {
            let response = try await proxy.get("http://\(host)/metrics", host: host)
            #expect(response.status == 508, "\(host)")
            #expect(response.header("X-Backstop-Error") == "loop-detected")
            #expect(!response.bodyString.contains("backstop_"), "the metrics page never reaches the client")
        }
        // Any port of this host: what listens there is not Backstop's to hand out.
        let other = try await proxy.get("http://0.0.0.0:1/x", host: "0.0.0.0:1")
        #expect(other.status == 508)
        // On the proxy's own port: refused on the first hop, not after eight trips through itself.
        let own = proxy.port
        let looped = try await proxy.get("http://0.0.0.0:\(own)/x", host: "0.0.0.0:\(own)")
        #expect(looped.status == 508)
        // Five requests came in, five 508s went out: none of them came back through Backstop.
        #expect(proxy.server.metricsText().contains("backstop_requests_total{upstream=\"-\",code=\"508\"} 5\n"))
        await proxy.stop()
    }

    // MARK: 2. tunnels never reach this host

    @Test("CONNECT to 0.0.0.0 and [::] → 508 even with a deny list that leaves them out; the default list has ::/128")
    func tunnelsToThisHost() async throws {
        let admin = try FreePort.reserveClosedPort()
        let own = try FreePort.reserveClosedPort()
        let relisted = try await ProxyHarness.start(
            """
            listen: ["127.0.0.1:\(own)"]
            admin: {listen: "127.0.0.1:\(admin)"}
            tunnels:
              allow: ["0.0.0.0:\(admin)", "[::]:\(admin)", "0.0.0.0:\(own)", "127.0.0.1:\(own)"]
              deny_addresses: [10.0.0.0/8]
            """)
        for target in ["0.0.0.0:\(admin)", "[::]:\(admin)", "0.0.0.0:\(own)", "127.0.0.1:\(own)"] {
            let answer = try await relisted.send(Array("CONNECT \(target) HTTP/1.1\r\nHost: \(target)\r\n\r\n".utf8))
            #expect(answer.status == 508, "\(target)")
            #expect(answer.header("X-Backstop-Error") == "loop-detected")
        }
        #expect(relisted.server.metricsText().contains("backstop_tunnels_total{result=\"established\"} 0\n"))
        #expect(relisted.server.metricsText().contains("backstop_tunnels_total{result=\"loop-detected\"} 4\n"))
        await relisted.stop()
        #expect(TunnelsConfig.defaultDenyAddresses.contains { $0.contains([UInt8](repeating: 0, count: 16)) })
    }

    // MARK: 3. trickled heads

    @Test("heads trickled a byte at a time get 408 after header_timeout on the admin listener; health probes get in")
    func trickledHeadsOnAdmin() async throws {
        let proxy = try await ProxyHarness.start(
            """
            admin: {listen: "127.0.0.1:0"}
            limits: {header_timeout: 400ms, client_idle_timeout: 30s, max_connections: 2}
            """)
        let admin = try #require(proxy.server.adminAddress?.port)
        let started = ContinuousClock.now
        let (trickled, health) = try await BlockingSocket.onThread { () -> ([String], String) in
            let trickling = try (0..<2).map { _ in try BlockingSocket(port: admin) }
            let probe = try BlockingSocket(port: admin)  // waits in the backlog: both slots are taken
            _ = probe.send("GET /healthz HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            let head = Array("GET /metrics HTTP/1.1\r\nHost: a\r\n".utf8)
            var index = 0
            // One byte every 100 ms to each: the idle timeout (30 s) never fires, the head never ends.
            while ContinuousClock.now - started < .seconds(5),
                trickling.contains(where: { $0.waitForData(timeout: .zero) == .timeout })
            {
                for socket in trickling { _ = socket.send([head[index % head.count]]) }
                index += 1
                usleep(100_000)
            }
            let answers = trickling.map { String(decoding: $0.readUntilClosed(timeout: .seconds(5)), as: UTF8.self) }
            return (answers, String(decoding: probe.readUntilClosed(timeout: .seconds(5)), as: UTF8.self))
        }()
        for answer in trickled {
            #expect(answer.hasPrefix("HTTP/1.1 408 "), "\(answer)")
            #expect(answer.lowercased().contains("\r\nx-backstop-error: request-timeout\r\n"), "\(answer)")
        }
        #expect(health.hasPrefix("HTTP/1.1 200 "), "\(health)")
        #expect(ContinuousClock.now - started < .seconds(4))
        await proxy.stop()
    }

    @Test("a head trickled to a proxy listener gets 408 request-timeout after header_timeout, and the access line")
    func trickledHeadOnProxy() async throws {
        let capture = LogCapture()
        let proxy = try await ProxyHarness.start(
            "limits: {header_timeout: 300ms, client_idle_timeout: 30s}\n", capture: capture)
        let port = proxy.port
        let started = ContinuousClock.now
        let answer = try await BlockingSocket.onThread { () -> String in
            let socket = try BlockingSocket(port: port)
            for byte in "GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nX-Slow: " {
                guard socket.waitForData(timeout: .zero) == .timeout else { break }
                _ = socket.send(String(byte))
                usleep(50_000)
            }
            return String(decoding: socket.readUntilClosed(timeout: .seconds(5)), as: UTF8.self)
        }()
        #expect(answer.hasPrefix("HTTP/1.1 408 "), "\(answer)")
        #expect(answer.contains("X-Backstop-Error: request-timeout\r\n"))
        #expect(ContinuousClock.now - started < .seconds(3))
        let line = try #require(try await capture.waitFor("request", count: 1).first)
        #expect(line.contains("status=408"))
        #expect(line.contains("error=request-timeout"))
        // Its time is the head's: from its first byte to the answer, at least header_timeout.
        let ms = line.split(separator: " ").first { $0.hasPrefix("ms=") }.flatMap { Double($0.dropFirst(3)) }
        #expect(ms.map { $0 >= 300 && $0 < 3000 } == true, "\(line)")
        // Counted as every answer made before routing.
        #expect(
            proxy.server.metricsText().contains("backstop_requests_total{upstream=\"-\",code=\"408\"} 1\n"),
            "\(proxy.server.metricsText())")
        await proxy.stop()
    }

    // MARK: 4. traversal spellings

    static let traversals = [
        "/api/..;/admin", "/api/%2e%2e;x=1/admin", "/api/..%2fadmin", "/api/%2e%2e%2fadmin", "/api/..%5cadmin",
        "/api/..\\admin", "/api/%252e%252e/admin", "/api/%c0%ae%c0%ae/admin", "http://api.test/..;/admin",
        "/api/%u002e%u002e/admin", "/api/..%00/admin",
    ]

    @Test(
        "every traversal spelling is refused with 400 before routing: nothing (and no token) reaches the upstream",
        arguments: traversals)
    func traversalSpellings(target: String) async throws {
        let (keychain, directory) = try TokenRefreshTests.makeKeychain(["api/token": "injected-secret"])
        defer { TestFiles.remove(directory) }
        let origin = try await TestOrigin.start { _ in .text(200, "reached") }
        let proxy = try await ProxyHarness.start(
            """
            \(keychainSection(directory: directory))
            upstreams:
              - name: api
                match: {hosts: [api.test], path_prefix: /api}
                url: \(origin.baseURL)/v2
                auth: {type: static, entry: api/token}
            """, keychain: keychain)
        let response = try await proxy.send(RawHTTP.request("GET", target, host: "api.test"))
        #expect(response.status == 400)
        #expect(response.header("X-Backstop-Error") == "bad-request")
        #expect(origin.requestCount == 0)
        await proxy.stop()
        try await origin.shutdown()
    }

    @Test("an encoded slash that forms no dot segment reaches the upstream byte for byte")
    func encodedSlashPasses() async throws {
        try await withOriginAndProxy(
            origin: { request in .text(200, request.uri) },
            config: { origin in
                """
                upstreams:
                  - {name: api, match: {path_prefix: /api}, url: "\(origin.baseURL)/v4"}
                """
            }
        ) { origin, proxy in
            let response = try await proxy.get("/api/projects/group%2Fproject/issues?q=a%2F..", host: "127.0.0.1")
            #expect(response.status == 200)
            #expect(response.bodyString == "/v4/projects/group%2Fproject/issues?q=a%2F..")
        }
    }

    // MARK: 8. the kept-body budget and the body phase's timer

    @Test("bodies kept for retries share limits.buffer_memory: one that does not fit streams and is not retried")
    func bufferMemory() async throws {
        let origin = try await TestOrigin.start(
            script: TestOrigin.sequence(
                [.text(503, "busy"), .text(503, "busy")], then: .text(200, "ok")))
        let proxy = try await ProxyHarness.start(
            """
            limits: {buffer_memory: 64KiB, retry_buffer: 1MiB}
            upstreams:
              - name: app
                match: {hosts: [app.test]}
                url: \(origin.baseURL)
                retry: {attempts: 3, methods: [PUT], backoff: {base: 1ms, max: 1ms}}
            """)
        let port = proxy.port
        let runtime = proxy.server.runtime
        let (kept, b, a) = try await BlockingSocket.onThread { () -> (Int, String, String) in
            // A: 40 KiB of a 50 KiB body arrive and stay kept while B is handled.
            let held = try BlockingSocket(port: port)
            _ = held.send(
                "PUT http://app.test/a HTTP/1.1\r\nHost: app.test\r\nContent-Length: 51200\r\nConnection: close\r\n\r\n"
            )
            _ = held.send([UInt8](repeating: 0x61, count: 40960))
            let deadline = ContinuousClock.now + .seconds(5)
            while runtime.keptBodyMemory < 40960 && ContinuousClock.now < deadline { usleep(10_000) }
            let kept = runtime.keptBodyMemory
            // B's 40 KiB do not fit beside A's: B streams once, and its 503 goes back to the client unretried.
            let b = try rawExchange(
                port: port,
                RawHTTP.request(
                    "PUT", "http://app.test/b", host: "app.test", headers: [("Connection", "close")],
                    body: [UInt8](repeating: 0x62, count: 40960)))
            // A completes within the budget: retried after the second 503, answered 200.
            _ = held.send([UInt8](repeating: 0x61, count: 10240))
            return (kept, b, String(decoding: held.readUntilClosed(timeout: .seconds(5)), as: UTF8.self))
        }()
        #expect(kept == 40960)
        #expect(b.hasPrefix("HTTP/1.1 503 "), "\(b)")
        #expect(b.contains("X-Backstop-Attempts: 1\r\n"))
        #expect(a.hasPrefix("HTTP/1.1 200 "), "\(a)")
        #expect(a.contains("X-Backstop-Attempts: 2\r\n"))
        #expect(origin.requests.map(\.body.count) == [40960, 51200, 51200])
        // Everything kept was given back.
        let released = ContinuousClock.now + .seconds(5)
        while proxy.server.runtime.keptBodyMemory != 0 && ContinuousClock.now < released {
            try await Task.sleep(for: .milliseconds(10))
        }
        #expect(proxy.server.runtime.keptBodyMemory == 0)
        await proxy.stop()
        try await origin.shutdown()
    }

    @Test("timeouts.total runs while a body is being kept: a steady trickle gets 408 once it passes")
    func totalTimeoutCoversTheBodyPhase() async throws {
        try await withOriginAndProxy(
            origin: { _ in .text(200, "no") },
            config: { origin in
                singleUpstreamConfig(
                    origin,
                    extra:
                        "    timeouts: {connect: 200ms, per_try: 500ms, total: 600ms}\nlimits: {client_idle_timeout: 300ms}\n"
                )
            }
        ) { origin, proxy in
            let port = proxy.port
            let started = ContinuousClock.now
            let answer = try await BlockingSocket.onThread { () -> String in
                let socket = try BlockingSocket(port: port)
                _ = socket.send("POST http://app.test/x HTTP/1.1\r\nHost: app.test\r\nContent-Length: 100\r\n\r\n")
                // A byte every 100 ms never stalls for client_idle_timeout.
                for _ in 0..<40 {
                    guard socket.waitForData(timeout: .zero) == .timeout else { break }
                    _ = socket.send("a")
                    usleep(100_000)
                }
                return String(decoding: socket.readUntilClosed(timeout: .seconds(5)), as: UTF8.self)
            }()
            #expect(answer.hasPrefix("HTTP/1.1 408 "), "\(answer)")
            #expect(answer.contains("X-Backstop-Error: request-timeout\r\n"))
            #expect(ContinuousClock.now - started < .seconds(3))
            #expect(origin.requestCount == 0)
        }
    }

    // MARK: 9. metadata addresses

    @Test(
        "passthrough never connects to Azure's WireServer or Alibaba's metadata address: 403 at once",
        arguments: ["168.63.129.16", "100.100.100.200"])
    func metadataAddresses(address: String) async throws {
        let proxy = try await ProxyHarness.start("unmatched: passthrough\n")
        let started = ContinuousClock.now
        let response = try await proxy.get("http://\(address)/machine?comp=goalstate", host: address)
        #expect(response.status == 403)
        #expect(response.header("X-Backstop-Error") == "destination-denied")
        #expect(ContinuousClock.now - started < .seconds(1))
        await proxy.stop()
    }

    // MARK: 11. unsolicited 101

    @Test("a 101 to a request that asked for no upgrade is a bad-upstream-response; nothing after it is relayed")
    func unsolicitedSwitchingProtocols() async throws {
        let switching = Array(
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n\u{81}\u{05}hello"
                .utf8)
        try await withOriginAndProxy(
            origin: { _ in .raw(switching) },
            config: { origin in
                singleUpstreamConfig(origin, extra: "    retry: {attempts: 2, backoff: {base: 1ms, max: 1ms}}")
            }
        ) { origin, proxy in
            let response = try await proxy.get("http://app.test/socket", host: "app.test")
            #expect(response.status == 502)
            #expect(response.header("X-Backstop-Error") == "bad-upstream-response")
            #expect(response.header("X-Backstop-Attempts") == "2", "retried as a reset")
            #expect(!response.bodyString.contains("hello"))
            #expect(origin.requestCount == 2)
        }
    }
}
