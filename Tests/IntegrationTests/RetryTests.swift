import BackstopTestSupport
import Foundation
import Testing

/// docs/reference/behaviour.md#retries through the real proxy against the scriptable origin.
@Suite("Retries")
struct RetryTests {
    static func config(_ origin: TestOrigin, retry: String = "", timeouts: String = "", limits: String = "") -> String {
        """
        \(limits)
        upstreams:
          - name: app
            match: {hosts: [app.test]}
            url: \(origin.baseURL)
            timeouts: {connect: 1s, per_try: \(timeouts.isEmpty ? "2s" : timeouts), total: 10s}
            retry:
              attempts: 3
              backoff: {strategy: constant, base: 50ms, max: 50ms, jitter: none}
        \(retry)
        """
    }

    @Test("503, 503, 200 → 200 with X-Backstop-Attempts: 3; the origin saw 3 requests")
    func retriesUntilSuccess() async throws {
        let script = TestOrigin.sequence([.respond(status: 503), .respond(status: 503)], then: .text(200, "finally"))
        try await withOriginAndProxy(origin: script, config: { Self.config($0) }) { origin, proxy in
            let response = try await proxy.get("http://app.test/r", host: "app.test")
            #expect(response.status == 200)
            #expect(response.bodyString == "finally")
            #expect(response.header("X-Backstop-Attempts") == "3")
            #expect(origin.requestCount == 3)
            // The 503s (empty bodies) were left to finish, so the retries reused the upstream connection.
            #expect(origin.connectionCount == 1)
        }
    }

    @Test("a reset, then 200")
    func resetThenSuccess() async throws {
        let script = TestOrigin.sequence([.reset], then: .text(200, "ok"))
        try await withOriginAndProxy(origin: script, config: { Self.config($0) }) { origin, proxy in
            let response = try await proxy.get("http://app.test/r", host: "app.test")
            #expect(response.status == 200)
            #expect(response.header("X-Backstop-Attempts") == "2")
            #expect(origin.requestCount == 2)
        }
    }

    @Test("a hang (per-try timeout), then 200")
    func hangThenSuccess() async throws {
        let script = TestOrigin.sequence([.hang], then: .text(200, "ok"))
        try await withOriginAndProxy(origin: script, config: { Self.config($0, timeouts: "1s") }) { origin, proxy in
            let response = try await proxy.get("http://app.test/r", host: "app.test")
            #expect(response.status == 200)
            #expect(response.header("X-Backstop-Attempts") == "2")
        }
    }

    @Test("always hanging → 504 within total + 1 s")
    func alwaysHang() async throws {
        try await withOriginAndProxy(
            origin: { _ in .hang },
            config: { origin in
                """
                upstreams:
                  - name: app
                    match: {hosts: [app.test]}
                    url: \(origin.baseURL)
                    timeouts: {connect: 1s, per_try: 1s, total: 2s}
                    retry: {attempts: 5, backoff: {strategy: constant, base: 10ms, max: 10ms, jitter: none}}
                """
            }
        ) { _, proxy in
            let started = ContinuousClock.now
            let response = try await proxy.get("http://app.test/r", host: "app.test")
            #expect(response.status == 504)
            #expect(response.header("X-Backstop-Error") == "upstream-timeout")
            #expect(ContinuousClock.now - started < .seconds(3))
        }
    }

    @Test("a closed port → 502 after all attempts, also for POST")
    func closedPort() async throws {
        let port = try FreePort.reserveClosedPort()
        let proxy = try await ProxyHarness.start(
            """
            upstreams:
              - name: gone
                match: {hosts: [gone.test]}
                url: http://127.0.0.1:\(port)
                retry: {attempts: 3, backoff: {strategy: constant, base: 200ms, max: 200ms, jitter: none}}
                circuit: {failures: 0}  # six failures in a row would eject it: this test is about the retries
            """)
        for method in ["GET", "POST"] {
            let started = ContinuousClock.now
            let response = try await proxy.send(
                RawHTTP.request(
                    method, "http://gone.test/", host: "gone.test", body: method == "POST" ? Array("x".utf8) : nil))
            #expect(response.status == 502)
            #expect(response.header("X-Backstop-Error") == "upstream-unreachable")
            // Two 200 ms backoffs prove the two retries happened.
            #expect(ContinuousClock.now - started >= .milliseconds(400), "\(method) was not retried")
        }
        await proxy.stop()
    }

    @Test("POST 503 → 1 attempt; POST with Idempotency-Key → retried")
    func postRules() async throws {
        try await withOriginAndProxy(origin: { _ in .respond(status: 503) }, config: { Self.config($0) }) {
            origin, proxy in
            let plain = try await proxy.send(
                RawHTTP.request("POST", "http://app.test/p", host: "app.test", body: Array("a".utf8)))
            #expect(plain.status == 503)
            #expect(plain.header("X-Backstop-Attempts") == "1")
            #expect(origin.requestCount == 1)
            let keyed = try await proxy.send(
                RawHTTP.request(
                    "POST", "http://app.test/p", host: "app.test", headers: [("Idempotency-Key", "k1")],
                    body: Array("a".utf8)))
            #expect(keyed.status == 503)
            #expect(keyed.header("X-Backstop-Attempts") == "3")
            #expect(origin.requestCount == 4)
            #expect(origin.requests.dropFirst().allSatisfy { $0.bodyString == "a" })
        }
    }

    @Test("429 + Retry-After: 1 → the second attempt arrives ≥ 1 s later")
    func retryAfterSeconds() async throws {
        let script = TestOrigin.sequence(
            [.respond(status: 429, headers: [("Retry-After", "1")])], then: .text(200, "ok"))
        try await withOriginAndProxy(origin: script, config: { Self.config($0) }) { origin, proxy in
            let response = try await proxy.get("http://app.test/r", host: "app.test")
            #expect(response.status == 200)
            let requests = origin.requests
            #expect(requests.count == 2)
            #expect(requests[1].arrivedAt - requests[0].arrivedAt >= .seconds(1))
        }
    }

    @Test("Retry-After as an HTTP-date is honoured")
    func retryAfterDate() async throws {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "GMT")
        formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss 'GMT'"
        let script: TestOrigin.Script = { request in
            request.index == 0
                ? .respond(
                    status: 503, headers: [("Retry-After", formatter.string(from: Date().addingTimeInterval(2)))])
                : .text(200, "ok")
        }
        try await withOriginAndProxy(origin: script, config: { Self.config($0) }) { origin, proxy in
            let response = try await proxy.get("http://app.test/r", host: "app.test")
            #expect(response.status == 200)
            let requests = origin.requests
            // The date has 1 s resolution: the wait is between 1 and 2 s, far above the 50 ms backoff.
            #expect(requests[1].arrivedAt - requests[0].arrivedAt >= .milliseconds(900))
        }
    }

    @Test("Retry-After: 3600 with max 60s → the response is returned at once")
    func retryAfterTooLong() async throws {
        try await withOriginAndProxy(
            origin: { _ in .respond(status: 503, headers: [("Retry-After", "3600")]) },
            config: { Self.config($0) }
        ) { origin, proxy in
            let started = ContinuousClock.now
            let response = try await proxy.get("http://app.test/r", host: "app.test")
            #expect(response.status == 503)
            #expect(response.header("Retry-After") == "3600")
            #expect(response.header("X-Backstop-Attempts") == "1")
            // Not an hour, and not even one backoff-and-retry: answered as soon as the 503 arrived.
            #expect(ContinuousClock.now - started < .seconds(5))
            #expect(origin.requestCount == 1)
        }
    }

    @Test("a body above retry_buffer is streamed once and not retried")
    func largeBodyNotRetried() async throws {
        try await withOriginAndProxy(
            origin: { _ in .respond(status: 503) },
            config: { Self.config($0, limits: "limits: {retry_buffer: 1KiB}") }
        ) { origin, proxy in
            let response = try await proxy.send(
                RawHTTP.request(
                    "PUT", "http://app.test/big", host: "app.test", body: Array(repeating: 0x62, count: 4096)))
            #expect(response.status == 503)
            #expect(response.header("X-Backstop-Attempts") == "1")
            #expect(origin.requestCount == 1)
            #expect(origin.requests.first?.body.count == 4096)
        }
    }

    @Test("a client that disconnects during a backoff → the origin sees no further attempt")
    func disconnectDuringBackoff() async throws {
        try await withOriginAndProxy(
            origin: { _ in .respond(status: 503) },
            config: { origin in
                """
                upstreams:
                  - name: app
                    match: {hosts: [app.test]}
                    url: \(origin.baseURL)
                    retry: {attempts: 5, backoff: {strategy: constant, base: 1s, max: 1s, jitter: none}}
                """
            }
        ) { origin, proxy in
            let connection = try await RawHTTPConnection.connect(port: proxy.port)
            try await connection.send(RawHTTP.request("GET", "http://app.test/r", host: "app.test"))
            _ = try await origin.waitForRequests(1, timeout: .seconds(5))
            await connection.close()
            // Wait past two backoffs: no second attempt may arrive.
            try await Task.sleep(for: .milliseconds(2500))
            #expect(origin.requestCount == 1)
        }
    }

    @Test("retry budget: always-503 origin, 200 requests over ~4 s stay within ratio + min_per_second")
    func budgetCapsAmplification() async throws {
        for (budget, label) in [
            ("{ratio: 0.2, min_per_second: 1}", "budget"), ("{ratio: 100, min_per_second: 1000}", "unbounded"),
        ] {
            let origin = try await TestOrigin.start { _ in .respond(status: 503) }
            let proxy = try await ProxyHarness.start(
                """
                upstreams:
                  - name: app
                    match: {hosts: [app.test]}
                    url: \(origin.baseURL)
                    retry:
                      attempts: 5
                      backoff: {strategy: constant, base: 1ms, max: 1ms, jitter: none}
                      budget: \(budget)
                    circuit: {failures: 0}  # an always-503 origin would be ejected: this test is about the budget
                """)
            let started = ContinuousClock.now
            for wave in 0..<20 {
                try await withThrowingTaskGroup(of: Void.self) { group in
                    for i in 0..<10 {
                        group.addTask { _ = try await proxy.get("http://app.test/\(wave)-\(i)", host: "app.test") }
                    }
                    try await group.waitForAll()
                }
                try await Task.sleep(until: started + .milliseconds(200 * (wave + 1)))
            }
            let attempts = origin.requestCount
            let seconds = Int((ContinuousClock.now - started).components.seconds) + 1
            if label == "budget" {
                #expect(attempts <= 200 * 12 / 10 + seconds + 5, "origin saw \(attempts) attempts in ~\(seconds) s")
                #expect(attempts >= 200)
            } else {
                #expect(attempts == 1000)
            }
            print("retry budget \(label): 200 client requests → \(attempts) origin attempts")
            await proxy.stop()
            try await origin.shutdown()
        }
    }
}
