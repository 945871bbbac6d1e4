import BackstopServer
import BackstopTestSupport
import Foundation
import Testing

/// Requests through the real proxy, traced and exported to a real OTLP/HTTP receiver (scripts/otlp-receiver.py,
/// decoding with the reference `opentelemetry-proto` classes): the spans' parents, attributes and status, and the
/// `traceparent` each attempt sent upstream (docs/reference/operations.md#tracing).
@Suite("Traced requests", .serialized)
struct TracedRequestTests {
    static let clientTrace = "0af7651916cd43dd8448eb211c80319c"
    static let clientSpan = "b7ad6b7169203331"

    /// The receiver script, started on a free port; `spans` parses what it printed so far.
    struct Receiver {
        let process: DaemonProcess
        let port: Int

        static func start() async throws -> Receiver {
            let port = try FreePort.reserveClosedPort()
            let process = try DaemonProcess.start(
                binary: "/usr/bin/env", arguments: ["python3", TracingExportTests.receiverScript, String(port)])
            do {
                try await process.waitUntilListening(port: port)
            } catch {
                process.send(signal: SIGKILL)
                throw error
            }
            return Receiver(process: process, port: port)
        }

        var spans: [[String: Any]] {
            process.output.split(separator: "\n").compactMap {
                try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
            }.filter { $0["trace_id"] != nil }
        }

        /// Waits until `count` spans arrived (export runs every second), then a little longer for extra ones.
        func waitForSpans(_ count: Int) async throws -> [[String: Any]] {
            try await process.waitForOutput(timeout: .seconds(15)) {
                $0.components(separatedBy: "\"trace_id\"").count - 1 >= count
            }
            return spans
        }

        func stop() { process.send(signal: SIGKILL) }
    }

    static func tracing(_ receiver: Receiver, ratio: Double = 1) -> String {
        "tracing: {otlp_endpoint: \"http://127.0.0.1:\(receiver.port)\", service_name: backstop-it, sample_ratio: \(ratio)}"
    }

    static func attributes(_ span: [String: Any]) -> [String: Any] { span["attributes"] as? [String: Any] ?? [:] }
    static func int(_ span: [String: Any], _ key: String) -> Int? { (attributes(span)[key] as? NSNumber)?.intValue }
    static func string(_ span: [String: Any], _ key: String) -> String? { attributes(span)[key] as? String }
    static func statusCode(_ span: [String: Any]) -> String? { (span["status"] as? [String: Any])?["code"] as? String }
    static func time(_ span: [String: Any], _ key: String) -> UInt64 { (span[key] as? NSNumber)?.uint64Value ?? 0 }

    /// The span ids named by `traceparent` values (`00-trace-span-flags`).
    static func spanID(ofTraceparent value: String?) -> String? {
        guard let parts = value?.split(separator: "-"), parts.count == 4 else { return nil }
        return String(parts[2])
    }

    @Test(
        "reset, 503, 200: one trace under the client's span, a client span per attempt with its retry reason; each attempt sent its own traceparent; a refused request has its span"
    )
    func retriedRequest() async throws {
        let receiver = try await Receiver.start()
        defer { receiver.stop() }
        // The reset comes first, on a fresh connection: curl reports it rather than resending on a new one.
        let script = TestOrigin.sequence([.reset, .respond(status: 503)], then: .text(200, "ok"))
        try await withOriginAndProxy(
            origin: script,
            config: { origin in
                """
                \(Self.tracing(receiver))
                upstreams:
                  - name: app
                    match: {hosts: [app.test]}
                    url: \(origin.baseURL)
                    timeouts: {connect: 1s, per_try: 2s, total: 10s}
                    retry: {attempts: 3, backoff: {strategy: constant, base: 50ms, max: 50ms, jitter: none}}
                """
            }
        ) { origin, proxy in
            let response = try await proxy.get(
                "http://app.test/items?token=secret-query", host: "app.test",
                headers: [
                    // Trailing OWS is not part of the value: the trace goes on.
                    ("traceparent", "00-\(Self.clientTrace)-\(Self.clientSpan)-01 \t"),
                    ("tracestate", "rojo=00f067aa0ba902b7"),
                    ("User-Agent", "legacy-app/1.0"),
                ])
            #expect(response.status == 200)
            #expect(response.header("X-Backstop-Attempts") == "3")
            let refused = try await proxy.get(
                "http://nowhere.test/x", host: "nowhere.test",
                headers: [
                    ("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
                ])
            #expect(refused.status == 403)
            // A refused CONNECT (no tunnels here) is a request too: a server span of its own.
            let connect = try await proxy.send(
                Array(
                    ("CONNECT elsewhere.test:443 HTTP/1.1\r\nHost: elsewhere.test:443\r\n"
                        + "traceparent: 00-5bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\n\r\n").utf8))
            #expect(connect.status == 405)

            // Each attempt carried one traceparent: the client's trace, a span of its own, sampled; tracestate as sent.
            let requests = origin.requests.sorted { $0.index < $1.index }
            try #require(requests.count == 3)
            for request in requests {
                #expect(request.headers(named: "traceparent").count == 1)
                #expect(request.header("traceparent")?.hasPrefix("00-\(Self.clientTrace)-") == true)
                #expect(request.header("traceparent")?.hasSuffix("-01") == true)
                #expect(request.header("tracestate") == "rojo=00f067aa0ba902b7")
            }
            let sentSpans = requests.map { Self.spanID(ofTraceparent: $0.header("traceparent")) }
            #expect(Set(sentSpans.compactMap { $0 }).count == 3)

            let spans = try await receiver.waitForSpans(6)
            try #require(spans.count == 6, "\(receiver.process.output)")
            let trace = spans.filter { $0["trace_id"] as? String == Self.clientTrace }
            try #require(trace.count == 4)
            let server = try #require(trace.first { $0["kind"] as? String == "SPAN_KIND_SERVER" })
            #expect(server["parent_span_id"] as? String == Self.clientSpan)
            #expect(server["trace_state"] as? String == "rojo=00f067aa0ba902b7")
            #expect(((server["flags"] as? NSNumber)?.intValue ?? 0) & 0x300 == 0x300)  // the parent is remote
            #expect(server["name"] as? String == "GET")
            #expect(Self.string(server, "url.path") == "/items")
            #expect(Self.string(server, "server.address") == "app.test")
            #expect(Self.int(server, "server.port") == 80)
            #expect(Self.string(server, "client.address") == "127.0.0.1")
            #expect(Self.string(server, "user_agent.original") == "legacy-app/1.0")
            #expect(Self.int(server, "http.response.status_code") == 200)
            #expect(Self.string(server, "backstop.upstream") == "app")
            #expect(Self.int(server, "backstop.attempts") == 3)
            #expect(Self.statusCode(server) == "STATUS_CODE_UNSET")

            let clients = trace.filter { $0["kind"] as? String == "SPAN_KIND_CLIENT" }
                .sorted { (Self.int($0, "backstop.attempt") ?? 0) < (Self.int($1, "backstop.attempt") ?? 0) }
            try #require(clients.count == 3)
            for (index, client) in clients.enumerated() {
                #expect(client["parent_span_id"] as? String == server["span_id"] as? String)
                #expect(client["span_id"] as? String == sentSpans[index], "attempt \(index + 1)")
                #expect(Self.int(client, "backstop.attempt") == index + 1)
                #expect(Self.string(client, "backstop.upstream") == "app")
                #expect(Self.string(client, "backstop.endpoint") == origin.baseURL)
                #expect(Self.string(client, "url.full") == origin.baseURL + "/items")
                #expect(Self.attributes(client)["backstop.hedge"] as? Bool == false)
                #expect(Self.int(client, "http.request.resend_count") == (index == 0 ? nil : index))
                // Inside the server span, one after the other.
                #expect(Self.time(client, "start") >= Self.time(server, "start"))
                #expect(Self.time(client, "end") <= Self.time(server, "end"))
                if index > 0 { #expect(Self.time(client, "start") >= Self.time(clients[index - 1], "end")) }
            }
            let (reset, unavailable, ok) = (clients[0], clients[1], clients[2])
            #expect(Self.int(reset, "http.response.status_code") == nil)
            #expect(Self.string(reset, "backstop.outcome") == "reset")
            #expect(Self.string(reset, "error.type") == "reset")
            #expect(Self.string(reset, "backstop.retry_reason") == "reset")
            #expect(Self.int(reset, "backstop.backoff_ms") == 50)
            #expect(Self.statusCode(reset) == "STATUS_CODE_ERROR")
            #expect(Self.int(unavailable, "http.response.status_code") == 503)
            #expect(Self.string(unavailable, "network.protocol.version") == "1.1")
            #expect(Self.string(unavailable, "backstop.outcome") == "5xx")
            #expect(Self.string(unavailable, "backstop.retry_reason") == "503")
            #expect(Self.int(unavailable, "backstop.backoff_ms") == 50)
            #expect(Self.string(unavailable, "error.type") == "503")
            #expect(Self.statusCode(unavailable) == "STATUS_CODE_ERROR")
            #expect(Self.int(ok, "http.response.status_code") == 200)
            #expect(Self.string(ok, "backstop.outcome") == "2xx")
            #expect(Self.string(ok, "backstop.retry_reason") == nil)
            #expect(Self.string(ok, "error.type") == nil)
            #expect(Self.statusCode(ok) == "STATUS_CODE_UNSET")

            // The refused request: a server span of its own trace, with Backstop's reason.
            let refusal = try #require(spans.first { $0["trace_id"] as? String == "4bf92f3577b34da6a3ce929d0e0e4736" })
            #expect(refusal["kind"] as? String == "SPAN_KIND_SERVER")
            #expect(refusal["parent_span_id"] as? String == "00f067aa0ba902b7")
            #expect(Self.int(refusal, "http.response.status_code") == 403)
            #expect(Self.string(refusal, "error.type") == "no-route")
            #expect(Self.int(refusal, "backstop.attempts") == 0)
            #expect(Self.string(refusal, "backstop.upstream") == nil)
            #expect(Self.statusCode(refusal) == "STATUS_CODE_UNSET")  // a 4xx is the client's, not the server's error
            let refusedConnect = try #require(
                spans.first { $0["trace_id"] as? String == "5bf92f3577b34da6a3ce929d0e0e4736" })
            #expect(refusedConnect["kind"] as? String == "SPAN_KIND_SERVER")
            #expect(refusedConnect["name"] as? String == "CONNECT")
            #expect(Self.int(refusedConnect, "http.response.status_code") == 405)
            #expect(Self.string(refusedConnect, "error.type") == "connect-not-supported")

            #expect(!receiver.process.output.contains("secret-query"))
        }
    }

    @Test(
        "an unsampled request is not recorded but each attempt still carries its trace (flag 00); without tracing a client's traceparent and tracestate pass through as sent"
    )
    func unsampledAndUntraced() async throws {
        let receiver = try await Receiver.start()
        defer { receiver.stop() }
        let clientParent = "00-\(Self.clientTrace)-\(Self.clientSpan)-00"
        try await withOriginAndProxy(
            origin: { _ in .text(200, "ok") },
            config: {
                Self.tracing(receiver, ratio: 0) + "\n" + singleUpstreamConfig($0)
            }
        ) { origin, proxy in
            #expect(try await proxy.get("http://app.test/a", host: "app.test").status == 200)
            #expect(
                try await proxy.get(
                    "http://app.test/b", host: "app.test",
                    headers: [
                        ("traceparent", clientParent), ("tracestate", "rojo=1"),
                    ]
                ).status == 200)
            let requests = origin.requests.sorted { $0.index < $1.index }
            try #require(requests.count == 2)
            // A new trace (sample_ratio 0): a traceparent all the same, unsampled.
            let fresh = try #require(requests[0].header("traceparent"))
            #expect(fresh.count == 55 && fresh.hasPrefix("00-") && fresh.hasSuffix("-00"), "\(fresh)")
            // The client's unsampled trace continues: same trace, Backstop's attempt span, flag 00.
            let continued = try #require(requests[1].header("traceparent"))
            #expect(continued.hasPrefix("00-\(Self.clientTrace)-") && continued.hasSuffix("-00"))
            #expect(continued != clientParent)
            #expect(requests[1].header("tracestate") == "rojo=1")
            // The server span ends before the response is written: nothing was queued, exported or dropped.
            let queue = try #require(proxy.server.runtime.tracer?.queue)
            #expect(queue.queued == 0 && queue.exported == 0)
            #expect(queue.dropped.queueFull == 0 && queue.dropped.exportFailed == 0)
        }
        try await withOriginAndProxy(origin: { _ in .text(200, "ok") }, config: { singleUpstreamConfig($0) }) {
            origin, proxy in
            #expect(proxy.server.runtime.tracer == nil)
            #expect(
                try await proxy.get(
                    "http://app.test/c", host: "app.test",
                    headers: [
                        ("traceparent", clientParent), ("tracestate", "rojo=1,congo=t61rcWkgMzE"),
                    ]
                ).status == 200)
            let request = try #require(origin.requests.first)
            #expect(request.headers(named: "traceparent") == [clientParent])
            #expect(request.header("tracestate") == "rojo=1,congo=t61rcWkgMzE")
        }
    }

    static func oauthConfig(_ receiver: Receiver, origin: TestOrigin, auth: TestAuthServer, directory: String) -> String
    {
        """
        \(Self.tracing(receiver))
        \(TokenRefreshTests.config(origin: origin, auth: auth, directory: directory))
        """
    }

    @Test(
        "a request that waits for the first token: the refresh is a span of its trace; a second request waiting on the same refresh links to it"
    )
    func refreshSpansAndLinks() async throws {
        let receiver = try await Receiver.start()
        defer { receiver.stop() }
        let otherTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
        try await TokenRefreshTests.withAuthProxy(
            entries: ["api/refresh_token": "refresh-0"],
            prepare: { $0.update { $0.answerDelay = .seconds(2) } },
            config: { Self.oauthConfig(receiver, origin: $0, auth: $1, directory: $2) }
        ) { auth, _, _, proxy in
            let first = Task {
                try await proxy.get(
                    "http://api.test/one", host: "api.test",
                    headers: [
                        ("traceparent", "00-\(Self.clientTrace)-\(Self.clientSpan)-01")
                    ])
            }
            // The first request's refresh reached the token endpoint, which answers 2 s later …
            _ = await Poll.holds(within: .seconds(10)) { auth.origin.requestCount >= 1 }
            #expect(auth.origin.requestCount == 1)
            // … so a second request arriving now finds it in flight and waits on it.
            let second = Task {
                try await proxy.get(
                    "http://api.test/two", host: "api.test",
                    headers: [
                        ("traceparent", "00-\(otherTrace)-00f067aa0ba902b7-01")
                    ])
            }
            let (one, two) = (try await first.value, try await second.value)
            #expect(one.status == 200 && two.status == 200)
            #expect(auth.tokenCalls == 1)

            let spans = try await receiver.waitForSpans(5)
            try #require(spans.count == 5, "\(receiver.process.output)")
            let firstTrace = spans.filter { $0["trace_id"] as? String == Self.clientTrace }
            let secondTrace = spans.filter { $0["trace_id"] as? String == otherTrace }
            try #require(firstTrace.count == 3 && secondTrace.count == 2)
            let firstServer = try #require(firstTrace.first { $0["kind"] as? String == "SPAN_KIND_SERVER" })
            let refresh = try #require(firstTrace.first { $0["kind"] as? String == "SPAN_KIND_INTERNAL" })
            let firstClient = try #require(firstTrace.first { $0["kind"] as? String == "SPAN_KIND_CLIENT" })
            #expect(refresh["name"] as? String == "token refresh")
            #expect(refresh["parent_span_id"] as? String == firstServer["span_id"] as? String)
            #expect(Self.string(refresh, "backstop.upstream") == "api")
            #expect(Self.string(refresh, "server.address") == "127.0.0.1")
            #expect(Self.string(refresh, "backstop.outcome") == "success")
            #expect(Self.statusCode(refresh) == "STATUS_CODE_UNSET")
            // The endpoint's 2 s are in the refresh span, and the attempt went out after it.
            #expect(Self.time(refresh, "end") - Self.time(refresh, "start") >= 2_000_000_000)
            #expect(Self.time(firstClient, "start") >= Self.time(refresh, "end"))
            #expect((firstServer["links"] as? [Any])?.isEmpty == true)
            let secondServer = try #require(secondTrace.first { $0["kind"] as? String == "SPAN_KIND_SERVER" })
            #expect(
                secondServer["links"] as? [[String: String]] == [
                    ["trace_id": Self.clientTrace, "span_id": refresh["span_id"] as? String ?? "?"]
                ])
            // No token or grant in any span.
            #expect(!receiver.process.output.contains("refresh-0"))
            #expect(!receiver.process.output.contains("access-"))
        }
    }

    @Test("a rejected token: the 401 attempt, the refresh it caused and the replay, all in the request's trace")
    func rejectedTokenReplay() async throws {
        let receiver = try await Receiver.start()
        defer { receiver.stop() }
        try await TokenRefreshTests.withAuthProxy(
            entries: ["api/refresh_token": "refresh-0", "api/access_token": "<issued>"],
            config: { Self.oauthConfig(receiver, origin: $0, auth: $1, directory: $2) }
        ) { auth, _, _, proxy in
            auth.revokeAllAccessTokens()
            let response = try await proxy.get(
                "http://api.test/data", host: "api.test",
                headers: [
                    ("traceparent", "00-\(Self.clientTrace)-\(Self.clientSpan)-01")
                ])
            #expect(response.status == 200)
            #expect(response.header("X-Backstop-Attempts") == "2")
            // The token in the store is loaded first (a refresh that adopts it), then refreshed after the 401.
            let spans = try await receiver.waitForSpans(5)
            try #require(spans.count == 5, "\(receiver.process.output)")
            #expect(spans.allSatisfy { $0["trace_id"] as? String == Self.clientTrace })
            let server = try #require(spans.first { $0["kind"] as? String == "SPAN_KIND_SERVER" })
            let refreshes = spans.filter { $0["kind"] as? String == "SPAN_KIND_INTERNAL" }
                .sorted { Self.time($0, "start") < Self.time($1, "start") }
            try #require(refreshes.count == 2)
            let (load, refresh) = (refreshes[0], refreshes[1])
            let clients = spans.filter { $0["kind"] as? String == "SPAN_KIND_CLIENT" }
                .sorted { (Self.int($0, "backstop.attempt") ?? 0) < (Self.int($1, "backstop.attempt") ?? 0) }
            try #require(clients.count == 2)
            #expect(
                (refreshes + clients).allSatisfy { $0["parent_span_id"] as? String == server["span_id"] as? String })
            #expect(Self.string(load, "backstop.outcome") == "adopted")
            #expect(Self.time(clients[0], "start") >= Self.time(load, "end"))
            #expect(Self.int(clients[0], "http.response.status_code") == 401)
            #expect(Self.string(clients[0], "backstop.outcome") == "4xx")
            #expect(Self.statusCode(clients[0]) == "STATUS_CODE_ERROR")
            #expect(Self.int(clients[1], "http.response.status_code") == 200)
            #expect(Self.string(refresh, "backstop.outcome") == "success")
            #expect(Self.time(refresh, "start") >= Self.time(clients[0], "end"))
            #expect(Self.time(clients[1], "start") >= Self.time(refresh, "end"))
            #expect(Self.int(server, "http.response.status_code") == 200)
            #expect(Self.int(server, "backstop.attempts") == 2)
        }
    }

    @Test(
        "a hung collector costs real requests nothing: 1,000 requests take no longer than with a live one; the spans it does not take are dropped and counted"
    )
    func hungCollector() async throws {
        let receiver = try await Receiver.start()
        defer { receiver.stop() }
        let hung = try await TestOrigin.start { _ in .hang }  // accepts every export and never answers it
        let origin = try await TestOrigin.start { _ in .text(200, "ok") }
        func proxy(_ endpoint: String) async throws -> ProxyHarness {
            try await ProxyHarness.start(
                "tracing: {otlp_endpoint: \"\(endpoint)\", sample_ratio: 1}\n" + singleUpstreamConfig(origin))
        }
        let live = try await proxy("http://127.0.0.1:\(receiver.port)")
        let stuck = try await proxy(hung.baseURL)
        func time(_ proxy: ProxyHarness, _ count: Int) async throws -> Duration {
            let started = ContinuousClock.now
            for i in 0..<count {
                let response = try await proxy.get("http://app.test/\(i)", host: "app.test")
                #expect(response.status == 200)
            }
            return ContinuousClock.now - started
        }
        _ = try await time(live, 50)  // warm-up
        _ = try await time(stuck, 50)
        let liveTime = try await time(live, 1000)
        let stuckTime = try await time(stuck, 1000)
        #expect(stuckTime <= liveTime * 2 + .milliseconds(500), "hung collector \(stuckTime), live \(liveTime)")
        // Every batch waits out the 5 s call timeout and is dropped.
        let failed = "backstop_spans_dropped_total{reason=\"export-failed\"}"
        _ = await Poll.holds(within: .seconds(20), every: .milliseconds(50)) {
            (TracingExportTests.metric(stuck, failed) ?? 0) > 0
        }
        #expect((TracingExportTests.metric(stuck, failed) ?? 0) > 0)
        #expect(TracingExportTests.metric(stuck, "backstop_spans_exported_total") == 0)
        await live.stop()
        await stuck.stop()
        try await origin.shutdown()
        try await hung.shutdown()
    }
}
