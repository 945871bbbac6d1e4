import BackstopTestSupport
import Foundation
import Testing

/// A failed attempt that is not retried says, at debug, which rule stopped it (docs/reference/behaviour.md#when-it-is-retried):
/// `msg="not retried"` with `outcome` and `rule`. Through the real proxy against the scriptable origin.
@Suite("Retry give-up log")
struct RetryGiveUpLogTests {
    /// One upstream `app` answering 503 (or what `origin` says), with `retry` lines appended to its retry section.
    static func run(
        retry: String, timeouts: String = "{connect: 1s, per_try: 2s, total: 10s}", limits: String = "",
        origin script: @escaping TestOrigin.Script = { _ in .respond(status: 503) },
        request: [UInt8] = RawHTTP.request("GET", "http://app.test/r", host: "app.test"),
        _ check: (RawHTTPResponse, [String]) throws -> Void
    ) async throws {
        let origin = try await TestOrigin.start(script: script)
        let capture = LogCapture()
        let backoff =
            retry.contains("backoff:") ? "" : "backoff: {strategy: constant, base: 10ms, max: 10ms, jitter: none}\n"
        let retryLines = (backoff + retry).split(separator: "\n").map { "      " + $0 }.joined(separator: "\n")
        let proxy = try await ProxyHarness.start(
            """
            \(limits)
            upstreams:
              - name: app
                match: {hosts: [app.test]}
                url: \(origin.baseURL)
                timeouts: \(timeouts)
                retry:
            \(retryLines)
            """, capture: capture)
        var failure: (any Error)?
        do {
            let response = try await proxy.send(request)
            // The access line is written when the exchange ends, the give-up line just before it.
            _ = try await capture.waitFor("request", count: 1)
            try check(response, capture.messages("not retried"))
        } catch {
            failure = error
        }
        await proxy.stop()
        try? await origin.shutdown()
        if let failure { throw failure }
    }

    @Test("attempts exhausted: rule=attempts-exhausted with the outcome and the attempt")
    func attempts() async throws {
        try await Self.run(retry: "attempts: 2") { response, lines in
            #expect(response.status == 503)
            #expect(lines.count == 1)
            #expect(
                lines.first?.contains(
                    "level=debug msg=\"not retried\" attempt=2 host=app.test method=GET outcome=503 rule=attempts-exhausted upstream=app"
                ) == true, "\(lines)")
        }
    }

    @Test("a POST without an idempotency key: rule=method-not-retryable")
    func method() async throws {
        try await Self.run(
            retry: "attempts: 3", request: RawHTTP.request("POST", "http://app.test/r", host: "app.test", body: [0x61])
        ) { response, lines in
            #expect(response.status == 503)
            #expect(lines.first?.contains("method=POST outcome=503 rule=method-not-retryable") == true, "\(lines)")
        }
    }

    @Test("a body above retry_buffer: rule=body-not-replayable")
    func body() async throws {
        try await Self.run(
            retry: "attempts: 3", limits: "limits: {retry_buffer: 1KiB}",
            request: RawHTTP.request(
                "PUT", "http://app.test/r", host: "app.test", body: Array(repeating: 0x62, count: 4096))
        ) { response, lines in
            #expect(response.status == 503)
            #expect(lines.first?.contains("outcome=503 rule=body-not-replayable") == true, "\(lines)")
        }
    }

    @Test("a backoff that would outlast timeouts.total: rule=deadline-exceeded")
    func deadline() async throws {
        try await Self.run(
            retry: "attempts: 3\nbackoff: {strategy: constant, base: 5s, max: 5s, jitter: none}",
            timeouts: "{connect: 500ms, per_try: 1s, total: 2s}"
        ) { response, lines in
            #expect(response.status == 503)
            #expect(lines.first?.contains("rule=deadline-exceeded") == true, "\(lines)")
        }
    }

    @Test("an empty retry budget: rule=budget-exhausted")
    func budget() async throws {
        try await Self.run(retry: "attempts: 3\nbudget: {ratio: 0, min_per_second: 0}") { response, lines in
            #expect(response.status == 503)
            #expect(lines.first?.contains("rule=budget-exhausted") == true, "\(lines)")
        }
    }

    @Test("a Retry-After above retry_after.max: rule=retry-after-too-long")
    func retryAfter() async throws {
        try await Self.run(
            retry: "attempts: 3\nretry_after: {max: 1s}",
            origin: { _ in .text(503, "later", headers: [("Retry-After", "3600")]) }
        ) { response, lines in
            #expect(response.status == 503)
            #expect(lines.first?.contains("rule=retry-after-too-long") == true, "\(lines)")
        }
    }

    @Test(
        "a connect failure whose condition is not in retry.on: rule=not-retryable; a success or an unlisted status logs nothing"
    )
    func notListed() async throws {
        let closed = try FreePort.reserveClosedPort()
        let capture = LogCapture()
        let proxy = try await ProxyHarness.start(
            """
            upstreams:
              - name: gone
                match: {hosts: [gone.test]}
                url: http://127.0.0.1:\(closed)
                retry: {attempts: 3, on: [503]}
            """, capture: capture)
        let response = try await proxy.get("http://gone.test/r", host: "gone.test")
        #expect(response.status == 502)
        _ = try await capture.waitFor("request", count: 1)
        let lines = capture.messages("not retried")
        #expect(lines.first?.contains("outcome=connect-failure rule=not-retryable upstream=gone") == true, "\(lines)")
        await proxy.stop()

        for status in [200, 404] {
            try await Self.run(retry: "attempts: 3", origin: { _ in .text(status, "x") }) { response, lines in
                #expect(response.status == status)
                #expect(lines.isEmpty, "\(lines)")
            }
        }
    }
}
