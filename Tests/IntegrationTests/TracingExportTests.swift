import BackstopServer
import BackstopTestSupport
import BackstopTracing
import Foundation
import Testing

/// The daemon's span export against a real OTLP/HTTP receiver (scripts/otlp-receiver.py, decoding with the
/// reference `opentelemetry-proto` classes), and against a collector that is down (docs/reference/operations.md#tracing).
/// Spans are made through the tracer the runtime holds, with the calls the exchange makes.
@Suite("Tracing export", .serialized)
struct TracingExportTests {
    static var receiverScript: String {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("scripts/otlp-receiver.py").path
    }

    static let clientParent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

    static func proxy(collectorPort: Int) async throws -> ProxyHarness {
        try await ProxyHarness.start(
            """
            tracing: {otlp_endpoint: "http://127.0.0.1:\(collectorPort)", service_name: backstop-it, sample_ratio: 1}
            upstreams:
              - {name: api, match: {hosts: [api.test]}, url: "http://127.0.0.1:1"}
            """)
    }

    /// One client request as the exchange traces it: two attempts (the first retried after a 503), then the answer.
    /// Returns the two attempts' `traceparent` values.
    @discardableResult
    static func traceRetriedRequest(_ tracer: Tracer) -> [String] {
        let origin = ContinuousClock.now
        func now() -> Duration { ContinuousClock.now - origin + .seconds(1) }
        var trace = tracer.startRequest(headers: [(name: "traceparent", value: clientParent)], at: now())
        var sent: [String] = []
        for (attempt, status) in [(1, 503), (2, 200)] {
            let span = trace.startAttempt(at: now())
            sent.append(span.traceparent)
            trace.endAttempt(
                span,
                AttemptFacts(
                    method: "GET", url: "http://127.0.0.1:1/items?token=x", upstream: "api",
                    endpoint: "http://127.0.0.1:1",
                    attempt: attempt, status: status, outcome: status == 503 ? "5xx" : "2xx",
                    retryReason: status == 503 ? "503" : nil, backoffMilliseconds: status == 503 ? 25 : nil,
                    protocolVersion: "1.1"), at: now())
        }
        trace.finish(
            RequestFacts(
                method: "GET", path: "/items?token=x", serverAddress: "api.test", serverPort: 80,
                clientAddress: "127.0.0.1", status: 200, upstream: "api", attempts: 2), at: now())
        return sent
    }

    static func metric(_ proxy: ProxyHarness, _ line: String) -> Int? {
        proxy.server.metricsText().split(separator: "\n").first { $0.hasPrefix(line + " ") }
            .flatMap { Int($0.split(separator: " ").last ?? "") }
    }

    @Test("a retried request exports one trace: the server span under the client's span, a client span per attempt")
    func exportsToReceiver() async throws {
        let port = try FreePort.reserveClosedPort()
        let receiver = try DaemonProcess.start(
            binary: "/usr/bin/env", arguments: ["python3", Self.receiverScript, String(port)])
        defer { receiver.send(signal: SIGKILL) }
        try await receiver.waitUntilListening(port: port)
        let proxy = try await Self.proxy(collectorPort: port)
        let tracer = try #require(proxy.server.runtime.tracer)
        let sent = Self.traceRetriedRequest(tracer)
        try await receiver.waitForOutput(timeout: .seconds(15)) {
            $0.components(separatedBy: "\"trace_id\"").count - 1 >= 3
        }
        let spans = receiver.output.split(separator: "\n").compactMap {
            try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
        }.filter { $0["trace_id"] != nil }
        try #require(spans.count == 3, "\(receiver.output)")
        #expect(!receiver.output.contains("unexpected request"))
        let server = try #require(spans.first { $0["kind"] as? String == "SPAN_KIND_SERVER" })
        let clients = spans.filter { $0["kind"] as? String == "SPAN_KIND_CLIENT" }
        #expect(spans.allSatisfy { $0["trace_id"] as? String == "0af7651916cd43dd8448eb211c80319c" })
        #expect(server["parent_span_id"] as? String == "b7ad6b7169203331")
        #expect((server["resource"] as? [String: Any])?["service.name"] as? String == "backstop-it")
        let serverAttributes = server["attributes"] as? [String: Any] ?? [:]
        #expect(serverAttributes["url.path"] as? String == "/items")
        #expect((serverAttributes["http.response.status_code"] as? NSNumber)?.intValue == 200)
        #expect(clients.count == 2)
        for (index, client) in clients.enumerated() {
            #expect(client["parent_span_id"] as? String == server["span_id"] as? String)
            // The traceparent sent upstream names this attempt's own span.
            #expect(sent[index] == "00-0af7651916cd43dd8448eb211c80319c-\(client["span_id"] as? String ?? "")-01")
            let attributes = client["attributes"] as? [String: Any] ?? [:]
            #expect((attributes["backstop.attempt"] as? NSNumber)?.intValue == index + 1)
            #expect(attributes["backstop.upstream"] as? String == "api")
            #expect(attributes["backstop.endpoint"] as? String == "http://127.0.0.1:1")
            #expect(attributes["url.full"] as? String == "http://127.0.0.1:1/items")
            #expect(attributes["backstop.hedge"] as? Bool == false)
        }
        let first = clients[0]["attributes"] as? [String: Any] ?? [:]
        #expect(first["backstop.retry_reason"] as? String == "503")
        #expect((first["backstop.backoff_ms"] as? NSNumber)?.intValue == 25)
        #expect(first["backstop.outcome"] as? String == "5xx")
        #expect(!receiver.output.contains("token=x"))
        _ = await Poll.holds(within: .seconds(5), every: .milliseconds(10)) {
            Self.metric(proxy, "backstop_spans_exported_total") == 3
        }
        #expect(Self.metric(proxy, "backstop_spans_exported_total") == 3)
        await proxy.stop()
    }

    @Test("a dead collector costs the traced requests nothing, and its spans are counted as dropped")
    func deadCollector() async throws {
        let livePort = try FreePort.reserveClosedPort()
        let receiver = try DaemonProcess.start(
            binary: "/usr/bin/env", arguments: ["python3", Self.receiverScript, String(livePort)])
        defer { receiver.send(signal: SIGKILL) }
        try await receiver.waitUntilListening(port: livePort)
        let live = try await Self.proxy(collectorPort: livePort)
        let dead = try await Self.proxy(collectorPort: try FreePort.reserveClosedPort())
        func time(_ proxy: ProxyHarness) throws -> Duration {
            let tracer = try #require(proxy.server.runtime.tracer)
            return ContinuousClock().measure { for _ in 0..<1000 { Self.traceRetriedRequest(tracer) } }
        }
        _ = try time(live)  // warm-up
        let liveTime = try time(live)
        let deadTime = try time(dead)
        #expect(deadTime <= liveTime * 3 + .milliseconds(50), "dead \(deadTime), live \(liveTime)")
        _ = await Poll.holds(within: .seconds(15), every: .milliseconds(20)) {
            (Self.metric(dead, "backstop_spans_dropped_total{reason=\"export-failed\"}") ?? 0) > 0
        }
        let failed = Self.metric(dead, "backstop_spans_dropped_total{reason=\"export-failed\"}") ?? 0
        let full = Self.metric(dead, "backstop_spans_dropped_total{reason=\"queue-full\"}") ?? 0
        #expect(failed > 0)
        #expect(failed + full <= 3000)
        #expect(Self.metric(dead, "backstop_spans_exported_total") == 0)
        await live.stop()
        await dead.stop()
    }
}
