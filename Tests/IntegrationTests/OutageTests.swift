import BackstopKeychain
import BackstopServer
import BackstopTestSupport
import Foundation
import NIOConcurrencyHelpers
import NIOPosix
import Testing

/// docs/reference/behaviour.md#when-an-upstream-is-down through the real proxy over loopback sockets: several
/// endpoints, ejection and probing, failing fast, the in-flight limit, hedging.
@Suite("When an upstream is down")
struct OutageTests {
    /// Starts the origins and a proxy for `config`, and shuts everything down afterwards whatever happens.
    static func with(
        origins scripts: [TestOrigin.Script], config: ([TestOrigin]) -> String, capture: LogCapture? = nil,
        _ body: ([TestOrigin], ProxyHarness) async throws -> Void
    ) async throws {
        var origins: [TestOrigin] = []
        do {
            for script in scripts { origins.append(try await TestOrigin.start(script: script)) }
        } catch {
            for origin in origins { try? await origin.shutdown() }
            throw error
        }
        let proxy: ProxyHarness
        do {
            proxy = try await ProxyHarness.start(config(origins), capture: capture)
        } catch {
            for origin in origins { try? await origin.shutdown() }
            throw error
        }
        do {
            try await body(origins, proxy)
        } catch {
            await proxy.stop()
            for origin in origins { try? await origin.shutdown() }
            throw error
        }
        await proxy.stop()
        for origin in origins { try await origin.shutdown() }
    }

    /// Upstream `app` (host `app.test`) with `endpoints`; `extra` lines are indented into the upstream.
    static func config(endpoints: [String], _ extra: String = "") -> String {
        """
        upstreams:
          - name: app
            match: {hosts: [app.test]}
            endpoints: [\(endpoints.joined(separator: ", "))]
            timeouts: {connect: 1s, per_try: 2s, total: 10s}
        \(extra.split(separator: "\n", omittingEmptySubsequences: false).map { "    " + $0 }.joined(separator: "\n"))
        """
    }

    static let quickRetry = "retry: {attempts: 3, backoff: {strategy: constant, base: 10ms, max: 10ms, jitter: none}}"

    static func get(_ proxy: ProxyHarness, _ path: String = "/r") async throws -> RawHTTPResponse {
        try await proxy.get("http://app.test\(path)", host: "app.test")
    }

    // MARK: another endpoint for a retry

    @Test("a 503 from the first endpoint is retried on the second, which answers; the access line names it")
    func retryOnSecondEndpoint() async throws {
        let capture = LogCapture()
        try await Self.with(
            origins: [{ _ in .respond(status: 503) }, { _ in .text(200, "second") }],
            config: { Self.config(endpoints: $0.map(\.baseURL), Self.quickRetry) }, capture: capture
        ) { origins, proxy in
            let response = try await Self.get(proxy)
            #expect(response.status == 200)
            #expect(response.bodyString == "second")
            #expect(response.header("X-Backstop-Attempts") == "2")
            #expect(origins[0].requestCount == 1)
            #expect(origins[1].requestCount == 1)
            let lines = try await capture.waitFor("request", count: 1)
            #expect(lines.first?.contains("endpoint=\(origins[1].baseURL) ") == true, "\(lines)")
        }
    }

    @Test("a refused connection to the first endpoint is retried on the second")
    func connectFailureFailsOver() async throws {
        let closed = try FreePort.reserveClosedPort()
        try await Self.with(
            origins: [{ _ in .text(200, "second") }],
            config: { Self.config(endpoints: ["http://127.0.0.1:\(closed)", $0[0].baseURL], Self.quickRetry) }
        ) { origins, proxy in
            let response = try await Self.get(proxy)
            #expect(response.status == 200)
            #expect(response.header("X-Backstop-Attempts") == "2")
            #expect(origins[0].requestCount == 1)
        }
    }

    @Test("round_robin spreads requests over the healthy endpoints")
    func roundRobin() async throws {
        try await Self.with(
            origins: [{ _ in .text(200, "a") }, { _ in .text(200, "b") }],
            config: { Self.config(endpoints: $0.map(\.baseURL), "balance: round_robin") }
        ) { origins, proxy in
            var bodies: [String] = []
            for _ in 0..<4 { bodies.append(try await Self.get(proxy).bodyString) }
            #expect(bodies == ["a", "b", "a", "b"])
            #expect(origins.map(\.requestCount) == [2, 2])
        }
    }

    // MARK: ejection

    @Test("a failing endpoint is ejected after circuit.failures and not tried again until its probe")
    func ejectionAndProbe() async throws {
        try await Self.with(
            origins: [{ _ in .respond(status: 503) }, { _ in .text(200, "b") }],
            config: {
                Self.config(
                    endpoints: $0.map(\.baseURL), "circuit: {failures: 2, open_for: 1s}\n" + Self.quickRetry)
            }
        ) { origins, proxy in
            for _ in 0..<5 {
                let response = try await Self.get(proxy)
                #expect(response.status == 200)
            }
            // Two failures ejected endpoint 0; the three requests after went straight to endpoint 1.
            #expect(origins[0].requestCount == 2)
            #expect(origins[1].requestCount == 5)
            var metrics = proxy.server.metricsText()
            #expect(
                metrics.contains("backstop_endpoint_state{upstream=\"app\",endpoint=\"\(origins[0].baseURL)\"} 1\n"))
            #expect(
                metrics.contains("backstop_ejections_total{upstream=\"app\",endpoint=\"\(origins[0].baseURL)\"} 1\n"))

            // The condition here is time itself: `circuit.open_for` (1 s) on the daemon's real clock must pass
            // before a probe is allowed; nothing else announces it.
            try await Task.sleep(for: .milliseconds(1100))
            // open_for has passed: the next request probes endpoint 0 (503: ejected again, for 2 s), and is retried
            // on endpoint 1; the one after does not touch endpoint 0.
            #expect(try await Self.get(proxy).status == 200)
            #expect(try await Self.get(proxy).status == 200)
            #expect(origins[0].requestCount == 3)
            metrics = proxy.server.metricsText()
            #expect(
                metrics.contains("backstop_ejections_total{upstream=\"app\",endpoint=\"\(origins[0].baseURL)\"} 2\n"))
        }
    }

    // MARK: failing fast

    @Test("every endpoint ejected: 503 circuit-open with Retry-After in under 50 ms, nothing sent; a probe restores")
    func circuitOpenAndRecovery() async throws {
        let healthy = NIOLockedValueBox(false)
        try await Self.with(
            origins: [{ _ in healthy.withLockedValue { $0 } ? .text(200, "back") : .respond(status: 503) }],
            config: {
                Self.config(endpoints: [$0[0].baseURL], "circuit: {failures: 2, open_for: 1s}\n" + Self.quickRetry)
            }
        ) { origins, proxy in
            // Attempts 1 and 2 get 503s, which eject the endpoint: no retry is left to make, and the request that
            // reached the upstream gets the upstream's own 503 (circuit-open says nothing was sent).
            let first = try await Self.get(proxy)
            #expect(first.status == 503)
            #expect(first.header("X-Backstop-Error") == nil)
            #expect(first.header("X-Backstop-Attempts") == "2")
            #expect(origins[0].requestCount == 2)

            var latencies: [Duration] = []
            for _ in 0..<20 {
                let started = ContinuousClock.now
                let response = try await Self.get(proxy)
                latencies.append(ContinuousClock.now - started)
                #expect(response.status == 503)
                #expect(response.header("X-Backstop-Error") == "circuit-open")
                #expect(response.header("Retry-After") == "1")
            }
            latencies.sort()
            print("circuit-open: p50 \(latencies[10]), max \(latencies[19]) over 20 requests")
            // Under 50 ms for 19 of 20: one answer may wait for a CPU on a shared test machine (a 126-ms outlier was
            // seen once in a filtered run). The median stays below the 20 ms that the two 10-ms backoffs of a retry
            // loop would take, so an answer that did not fail fast could not pass.
            #expect(latencies[18] < .milliseconds(50), "\(latencies)")
            #expect(latencies[10] < .milliseconds(20), "\(latencies)")
            #expect(origins[0].requestCount == 2)
            #expect(
                proxy.server.metricsText().contains(
                    "backstop_fast_failures_total{upstream=\"app\",reason=\"circuit-open\"} 20\n"))
            // The status page's failures: a circuit-open answer tried no endpoint; the first request tried one.
            let failures = proxy.server.statusSnapshot().failures
            #expect(failures.first?.endpoint == "-" && failures.first?.cause.hasPrefix("circuit-open") == true)
            #expect(failures.last?.endpoint == origins[0].baseURL, "\(failures.last.map { "\($0)" } ?? "none")")

            healthy.withLockedValue { $0 = true }
            // The condition here is time itself: `circuit.open_for` (1 s) on the daemon's real clock must pass
            // before a probe is allowed; nothing else announces it.
            try await Task.sleep(for: .milliseconds(1100))
            let probe = try await Self.get(proxy)
            #expect(probe.status == 200)
            #expect(probe.bodyString == "back")
            #expect(try await Self.get(proxy).status == 200)
            #expect(origins[0].requestCount == 4)
            #expect(
                proxy.server.metricsText().contains(
                    "backstop_endpoint_state{upstream=\"app\",endpoint=\"\(origins[0].baseURL)\"} 0\n"))
        }
    }

    @Test("the request whose failures eject the only endpoint gets 502 upstream-unreachable; the next circuit-open")
    func ejectedByItsOwnFailures() async throws {
        let closed = try FreePort.reserveClosedPort()
        let proxy = try await ProxyHarness.start(
            Self.config(
                endpoints: ["http://127.0.0.1:\(closed)"], "circuit: {failures: 2, open_for: 5s}\n" + Self.quickRetry))
        do {
            let first = try await Self.get(proxy)
            #expect(first.status == 502)
            #expect(first.header("X-Backstop-Error") == "upstream-unreachable")
            #expect(first.header("X-Backstop-Attempts") == "2")
            let next = try await Self.get(proxy)
            #expect(next.status == 503)
            #expect(next.header("X-Backstop-Error") == "circuit-open")
            #expect(
                proxy.server.metricsText().contains(
                    "backstop_fast_failures_total{upstream=\"app\",reason=\"circuit-open\"} 1\n"))
        } catch {
            await proxy.stop()
            throw error
        }
        await proxy.stop()
    }

    @Test("every endpoint ejected: circuit-open at admission, with no body read and no token asked for")
    func circuitOpenAtAdmission() async throws {
        let auth = try await TestAuthServer.start()
        // Tokens living 1 s: by the time the circuit-open requests come, the only token has expired and cannot be
        // renewed, so a request that reached its credential would end 502 token-unavailable instead.
        auth.update { $0.expiresIn = 1 }
        let origin = try await TestOrigin.start { _ in .respond(status: 503) }
        let (keychain, directory) = try TokenRefreshTests.makeKeychain(["api/refresh_token": "refresh-0"])
        defer { TestFiles.remove(directory) }
        let proxy: ProxyHarness
        do {
            proxy = try await ProxyHarness.start(
                """
                \(keychainSection(directory: directory))
                upstreams:
                  - name: api
                    match: {hosts: [api.test]}
                    endpoints: [\(origin.baseURL)]
                    circuit: {failures: 1, open_for: 60s}
                    retry: {attempts: 3, on: [503], backoff: {base: 10ms, max: 10ms, jitter: none}}
                    auth: {type: oauth2, token_url: \(auth.tokenURL), keychain_prefix: api}
                """, keychain: keychain)
        } catch {
            try? await origin.shutdown()
            try? await auth.origin.shutdown()
            throw error
        }
        var failure: (any Error)?
        do {
            // The first request fetches a token, and its 503 ejects the only endpoint.
            let first = try await proxy.get("http://api.test/a", host: "api.test")
            #expect(first.status == 503 && first.header("X-Backstop-Error") == nil)
            #expect(auth.tokenCalls == 1)
            // The grant dies; the proactive refresh a second after the token arrived fails, and the token expires.
            auth.update { $0.invalidGrant = true }
            try await Poll.until("the proactive refresh was tried") { auth.tokenCalls >= 2 }
            for _ in 0..<3 {
                let response = try await proxy.get("http://api.test/b", host: "api.test")
                #expect(response.status == 503)
                #expect(response.header("X-Backstop-Error") == "circuit-open")
                #expect(response.header("Retry-After").flatMap { Int($0) }.map { (59...60).contains($0) } == true)
                #expect(response.header("X-Backstop-Attempts") == nil)
            }
            #expect(auth.tokenCalls == 2, "a request failing fast asked the token endpoint")
            // A body is not waited for (a request admitted to an exchange would wait for it): the answer comes before
            // it; a small one is then read and dropped, and the connection kept.
            let connection = try await RawHTTPConnection.connect(port: proxy.port)
            let post = try await connection.exchange(
                "POST http://api.test/c HTTP/1.1\r\nHost: api.test\r\nContent-Length: 5\r\n\r\n", timeout: .seconds(5))
            #expect(post.status == 503 && post.header("X-Backstop-Error") == "circuit-open")
            #expect(post.header("Connection") == nil)
            // The body, sent after the answer, is dropped; the next request on the connection is answered.
            try await connection.send("hello", startsRequest: false)
            let next = try await connection.exchange(
                "GET http://api.test/d HTTP/1.1\r\nHost: api.test\r\n\r\n", timeout: .seconds(5))
            #expect(next.status == 503 && next.header("X-Backstop-Error") == "circuit-open")
            // A body larger than is worth reading closes the connection after the answer.
            let large = try await connection.exchange(
                "POST http://api.test/e HTTP/1.1\r\nHost: api.test\r\nContent-Length: 1000000\r\n\r\n",
                timeout: .seconds(5))
            #expect(large.status == 503 && large.header("Connection") == "close")
            await connection.close()
            // A client that asked `Expect: 100-continue` and got the answer instead may never send its body: the
            // connection closes rather than take its next request for the body.
            let expecting = try await RawHTTP.exchange(
                port: proxy.port,
                request:
                    "POST http://api.test/f HTTP/1.1\r\nHost: api.test\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n",
                timeout: .seconds(5))
            #expect(expecting.status == 503 && expecting.header("Connection") == "close")
            #expect(auth.tokenCalls == 2)
            #expect(origin.requestCount == 1)
            #expect(
                proxy.server.metricsText().contains(
                    "backstop_fast_failures_total{upstream=\"api\",reason=\"circuit-open\"} 7\n"))
        } catch { failure = error }
        await proxy.stop()
        try? await origin.shutdown()
        try? await auth.origin.shutdown()
        if let failure { throw failure }
    }

    @Test("max_inflight: the request beyond it gets 503 upstream-overloaded at once; later ones go through")
    func maxInflight() async throws {
        let capture = LogCapture()
        try await Self.with(
            origins: [
                { request in
                    request.uri.hasSuffix("/slow") ? .delay(.seconds(1), then: .text(200, "slow")) : .text(200, "ok")
                }
            ],
            config: { Self.config(endpoints: [$0[0].baseURL], "circuit: {max_inflight: 2}") }, capture: capture
        ) { origins, proxy in
            let slow = (0..<2).map { _ in Task { try await Self.get(proxy, "/slow") } }
            _ = try await origins[0].waitForRequests(2, timeout: .seconds(3))
            let started = ContinuousClock.now
            let refused = try await Self.get(proxy)
            #expect(refused.status == 503)
            #expect(refused.header("X-Backstop-Error") == "upstream-overloaded")
            // At once: well inside the 1 s a request waiting for a slot would take (one sample, so not 50 ms on a
            // shared test machine).
            #expect(ContinuousClock.now - started < .milliseconds(500))
            #expect(origins[0].requestCount == 2)
            for task in slow { #expect(try await task.value.status == 200) }
            #expect(try await Self.get(proxy).status == 200)
            let metrics = proxy.server.metricsText()
            #expect(
                metrics.contains("backstop_fast_failures_total{upstream=\"app\",reason=\"upstream-overloaded\"} 1\n"))
            // Refused after routing: its access line and request count name the upstream.
            #expect(metrics.contains("backstop_requests_total{upstream=\"app\",code=\"503\"} 1\n"), "\(metrics)")
            let refusedLines = try await capture.waitFor("request", count: 4).filter {
                $0.contains("error=upstream-overloaded")
            }
            #expect(
                refusedLines.count == 1
                    && refusedLines.allSatisfy { $0.contains("upstream=app ") || $0.hasSuffix("upstream=app\n") },
                "\(refusedLines)")
            // The status page counts it as the upstream's answer, and lists it among the failures (no endpoint).
            let snapshot = proxy.server.statusSnapshot()
            #expect(
                snapshot.failures.contains {
                    $0.upstream == "app" && $0.endpoint == "-" && $0.status == 503 && $0.cause == "upstream-overloaded"
                }, "\(snapshot.failures)")
        }
    }

    // MARK: hedging

    @Test("a slow GET is hedged: the fast copy wins, the slow one is cancelled at the origin")
    func hedgeWins() async throws {
        try await Self.with(
            origins: [{ _ in .delay(.seconds(5), then: .text(200, "slow")) }, { _ in .text(200, "fast") }],
            config: { Self.config(endpoints: $0.map(\.baseURL), "hedge: {after: 100ms, max: 1}") }
        ) { origins, proxy in
            let started = ContinuousClock.now
            let response = try await Self.get(proxy)
            let elapsed = ContinuousClock.now - started
            #expect(response.status == 200)
            #expect(response.bodyString == "fast")
            #expect(response.header("X-Backstop-Attempts") == "2")
            #expect(elapsed >= .milliseconds(100) && elapsed < .seconds(1))
            #expect(origins[1].requestCount == 1)
            // The slow copy's connection is closed by the proxy long before the origin would have answered.
            try await Poll.until("the slow copy's connection closed", within: .seconds(3)) {
                origins[0].openConnectionCount == 0
            }
            #expect(ContinuousClock.now - started < .seconds(4))
            let metrics = proxy.server.metricsText()
            #expect(metrics.contains("backstop_hedges_total{upstream=\"app\",result=\"won\"} 1\n"))
            // Both copies were sent, so both count as attempts: the winner by its status, the loser as cancelled.
            #expect(metrics.contains("backstop_upstream_attempts_total{upstream=\"app\",outcome=\"2xx\"} 1\n"))
            #expect(metrics.contains("backstop_upstream_attempts_total{upstream=\"app\",outcome=\"cancelled\"} 1\n"))
        }
    }

    @Test("hedge.after: p95 follows the upstream's time to response head: quick answers bring it below 250 ms")
    func p95FollowsObservedLatency() async throws {
        try await Self.with(
            origins: [{ _ in .text(200, "ok") }],
            config: { Self.config(endpoints: [$0[0].baseURL], "hedge: {after: p95, max: 1}") }
        ) { _, proxy in
            let health = proxy.server.runtime.snapshot.upstreams[0].health
            // Fewer than 20 samples: the default.
            #expect(health.hedgeDelay(.p95) == .milliseconds(250))
            for _ in 0..<20 {
                let response = try await Self.get(proxy)
                #expect(response.status == 200)
            }
            let delay = health.hedgeDelay(.p95)
            #expect(delay >= .milliseconds(10) && delay < .milliseconds(250), "\(delay)")
        }
    }

    @Test("a POST is never hedged, however slow")
    func postNotHedged() async throws {
        try await Self.with(
            origins: [{ _ in .delay(.milliseconds(400), then: .text(200, "slow")) }, { _ in .text(200, "fast") }],
            config: { Self.config(endpoints: $0.map(\.baseURL), "hedge: {after: 50ms, max: 1}") }
        ) { origins, proxy in
            let response = try await proxy.send(
                RawHTTP.request("POST", "http://app.test/p", host: "app.test", body: Array("x".utf8)))
            #expect(response.status == 200)
            #expect(response.bodyString == "slow")
            #expect(response.header("X-Backstop-Attempts") == "1")
            #expect(origins[1].requestCount == 0)
        }
    }
}

/// docs/reference/behaviour.md#the-network-coming-back with a real route in a network namespace the test creates:
/// the origin lives in the namespace, the route to it is taken away and given back.
@Suite(
    "The network coming back", .serialized,
    .enabled(if: NetworkNamespace.isAvailable, "needs root (CAP_NET_ADMIN) and iproute2 to create a network namespace"))
struct NetworkReturnTests {
    /// A namespace with an origin answering 200 `back`, the route to it taken away; removed afterwards.
    static func withUnreachableOrigin(
        index: Int, _ body: (NetworkNamespace, TestOrigin) async throws -> Void
    ) async throws {
        let namespace = try NetworkNamespace(index: index)
        defer { namespace.remove() }
        let origin = try await namespace.startOrigin { _ in .text(200, "back") }
        do {
            try namespace.takeRouteAway()
            try await body(namespace, origin)
        } catch {
            try? await origin.shutdown()
            throw error
        }
        try await origin.shutdown()
    }

    static func farConfig(_ origin: TestOrigin, retry: String) -> String {
        """
        upstreams:
          - name: far
            match: {hosts: [far.test]}
            url: \(origin.baseURL)
            timeouts: {connect: 1s, per_try: 2s, total: 30s}
            retry: \(retry)
        """
    }

    @Test("the harness: the route taken away refuses at once (EHOSTUNREACH), given back it is announced and works")
    func harness() async throws {
        try await Self.withUnreachableOrigin(index: 8) { namespace, origin in
            #expect(origin.baseURL.hasPrefix("http://\(namespace.clientAddress):"))
            let started = ContinuousClock.now
            #expect {
                _ = try BlockingSocket(port: origin.port, host: namespace.clientAddress)
            } throws: { error in
                "\(error)".contains("errno \(EHOSTUNREACH)")
            }
            // Refused at once, not after a connect timeout (seconds).
            #expect(ContinuousClock.now - started < .milliseconds(500))

            let changes = NIOLockedValueBox<[String]>([])
            let monitor = try await NetworkChangeMonitor.start(
                on: MultiThreadedEventLoopGroup.singleton.next(),
                onChange: { batch in changes.withLockedValue { $0 += batch.map(\.description) } }
            ).get()
            try namespace.giveRouteBack()
            try await Poll.until("route \(namespace.clientAddress)/32 announced", within: .seconds(3)) {
                changes.withLockedValue { $0.contains { $0.hasPrefix("route \(namespace.clientAddress)/32 added") } }
            }
            try await monitor.stop().get()
            let response = try await RawHTTP.exchange(
                host: namespace.clientAddress, port: origin.port,
                request: RawHTTP.request("GET", "/x", host: "far.test"), timeout: .seconds(5))
            #expect(response.status == 200)
        }
    }

    @Test(
        "a retry waiting out a 10 s backoff for want of a route reaches the origin within 200 ms of its return",
    )
    func retryWhenTheRouteReturns() async throws {
        try await Self.withUnreachableOrigin(index: 9) { namespace, origin in
            let proxy = try await ProxyHarness.start(
                Self.farConfig(
                    origin, retry: "{attempts: 5, backoff: {strategy: constant, base: 10s, max: 10s, jitter: none}}"))
            do {
                let request = Task { try await proxy.get("http://far.test/r", host: "far.test") }
                // The first attempt fails at once (EHOSTUNREACH); the route comes back during its backoff.
                let failed = "backstop_upstream_attempts_total{upstream=\"far\",outcome=\"connect-failure\"} 1\n"
                try await Poll.until("the first attempt failed", within: .seconds(5)) {
                    proxy.server.metricsText().contains(failed)
                }
                #expect(origin.requestCount == 0)
                try namespace.giveRouteBack()
                let returned = ContinuousClock.now
                let arrived = try await origin.waitForRequests(1, timeout: .seconds(5))
                let waited = arrived[0].arrivedAt - returned
                print("network coming back: the retry reached the origin \(waited) after the route returned")
                #expect(waited < .milliseconds(200))
                let response = try await request.value
                #expect(response.status == 200)
                #expect(response.bodyString == "back")
                #expect(response.header("X-Backstop-Attempts") == "2")
                #expect(!proxy.server.metricsText().contains("backstop_network_changes_total 0\n"))
            } catch {
                await proxy.stop()
                throw error
            }
            await proxy.stop()
        }
    }

    @Test(
        "retry.on_network_change: false waits out the backoff",
    )
    func notShortenedWhenOff() async throws {
        try await Self.withUnreachableOrigin(index: 10) { namespace, origin in
            let proxy = try await ProxyHarness.start(
                Self.farConfig(
                    origin,
                    retry:
                        "{attempts: 2, on_network_change: false, backoff: {strategy: constant, base: 2s, max: 2s, jitter: none}}"
                ))
            do {
                let started = ContinuousClock.now
                let request = Task { try await proxy.get("http://far.test/r", host: "far.test") }
                let failed = "backstop_upstream_attempts_total{upstream=\"far\",outcome=\"connect-failure\"} 1\n"
                try await Poll.until("the first attempt failed", within: .seconds(5)) {
                    proxy.server.metricsText().contains(failed)
                }
                try namespace.giveRouteBack()
                let arrived = try await origin.waitForRequests(1, timeout: .seconds(5))
                #expect(arrived[0].arrivedAt - started >= .milliseconds(1900))
                #expect(try await request.value.status == 200)
            } catch {
                await proxy.stop()
                throw error
            }
            await proxy.stop()
        }
    }

    @Test(
        "a reload that removes an upstream takes its endpoint state series away (an ejected one would alert for good)")
    func removedUpstreamLosesItsStateSeries() async throws {
        let origin = try await TestOrigin.start { _ in .text(200, "ok") }
        let closed = try FreePort.reserveClosedPort()
        let live = "  - {name: live, match: {hosts: [live.test]}, url: \"\(origin.baseURL)\"}\n"
        let dead =
            "  - {name: dead, match: {hosts: [dead.test]}, url: \"http://127.0.0.1:\(closed)\", retry: {attempts: 1},"
            + " circuit: {failures: 1, open_for: 60s}}\n"
        let proxy = try await ProxyHarness.start("upstreams:\n" + live + dead)
        var failure: (any Error)?
        do {
            #expect(try await proxy.get("http://dead.test/x", host: "dead.test").status == 502)
            let before = proxy.server.metricsText()
            #expect(
                before.split(separator: "\n").contains {
                    $0.hasPrefix("backstop_endpoint_state{upstream=\"dead\",") && $0.hasSuffix("} 1")
                }, "\(before)")
            try await proxy.reload("upstreams:\n" + live)
            let text = proxy.server.metricsText()
            #expect(!text.contains("backstop_endpoint_state{upstream=\"dead\""), "\(text)")
            #expect(text.contains("backstop_endpoint_state{upstream=\"live\""))
            // The counters stay: they only ever rise.
            #expect(text.contains("backstop_ejections_total{upstream=\"dead\""))
        } catch { failure = error }
        await proxy.stop()
        try? await origin.shutdown()
        if let failure { throw failure }
    }

}
