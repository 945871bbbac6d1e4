import BackstopCore
import BackstopTestSupport
import Foundation
import Testing
import W3CTraceContext

@testable import BackstopTracing

/// The bounded queue between requests and the collector: drops are counted, never waited for.
@Suite("Span export queue")
struct SpanExportQueueTests {
    static func span(_ n: Int) -> SpanRecord {
        var random = SplitMix64(seed: UInt64(n))
        return SpanRecord(
            traceID: TraceID.random(using: &random), spanID: SpanID.random(using: &random), parentSpanID: nil,
            name: "GET", kind: .server, startNanos: 1, endNanos: 2, attributes: [SpanAttribute("n", .int(Int64(n)))])
    }

    @Test("a full queue drops and counts what does not fit")
    func fullQueue() {
        let queue = makeQueue(TestSender(.accept), capacity: 4, batchSize: 2)
        for n in 0..<6 { queue.submit(Self.span(n)) }
        #expect(queue.queued == 4)
        #expect(queue.dropped == (queueFull: 2, exportFailed: 0))
        #expect(queue.pendingSpans.map { $0[attribute: "n"] } == (0..<4).map { .int(Int64($0)) })
    }

    @Test("accepted batches are counted as exported; a refused batch is dropped and counted")
    func exportOutcomes() async {
        let good = makeQueue(TestSender(.accept), batchSize: 2, interval: .milliseconds(10))
        let goodRun = Task { await good.run() }
        for n in 0..<5 { good.submit(Self.span(n)) }
        #expect(await Poll.holds { good.exported == 5 })
        good.shutdown()
        await goodRun.value
        #expect(good.isFinished)
        good.submit(Self.span(9))
        #expect(good.dropped == (queueFull: 1, exportFailed: 0))

        let refused = makeQueue(TestSender(.refuse), batchSize: 2, interval: .milliseconds(10))
        let refusedRun = Task { await refused.run() }
        for n in 0..<3 { refused.submit(Self.span(n)) }
        #expect(await Poll.holds { refused.dropped.exportFailed == 3 })
        #expect(refused.exported == 0)
        refused.shutdown()
        await refusedRun.value
    }

    @Test("a hung collector costs submitters nothing: 200,000 submissions take no longer than with a live one")
    func deadCollectorCostsNothing() async {
        func time(_ mode: TestSender.Mode) async -> (Duration, SpanExportQueue) {
            let queue = makeQueue(TestSender(mode), interval: .milliseconds(1))
            let run = Task { await queue.run() }
            let spans = (0..<64).map(Self.span)
            let clock = ContinuousClock()
            let elapsed = clock.measure {
                for n in 0..<200_000 { queue.submit(spans[n & 63]) }
            }
            if mode == .hang {
                // The exporter holds one batch in its hung send; the queue behind it is full, the rest dropped.
                #expect(await Poll.holds { queue.queued == queue.capacity })
            }
            run.cancel()
            await run.value
            return (elapsed, queue)
        }
        let (live, _) = await time(.accept)
        let (dead, deadQueue) = await time(.hang)
        #expect(deadQueue.dropped.queueFull >= 200_000 - 2 * deadQueue.capacity)
        // Submitting is a lock and an append or a counter either way; generous slack for a loaded machine.
        #expect(dead <= live * 3 + .milliseconds(50), "dead \(dead), live \(live)")
    }
}

/// The hand-written protobuf, decoded by the reference classes (`opentelemetry-proto`, PyPI) through
/// scripts/otlp-receiver.py.
@Suite("OTLP encoder")
struct OTLPEncoderTests {
    static var script: String {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("scripts/otlp-receiver.py").path
    }

    static func decode(_ body: [UInt8]) async throws -> [[String: Any]] {
        let path = NSTemporaryDirectory() + "otlp-\(UUID().uuidString).bin"
        try Data(body).write(to: URL(fileURLWithPath: path))
        defer { try? FileManager.default.removeItem(atPath: path) }
        let result = try await TestProcess.run("/usr/bin/env", ["python3", script, "--decode", path])
        #expect(result.status == 0, "\(result.standardError)")
        return try result.standardOutput.split(separator: "\n").map {
            try JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] ?? [:]
        }
    }

    @Test("spans, attributes of every type, status, flags, links and resource decode as written")
    func decodesWithReferenceClasses() async throws {
        var random = SplitMix64(seed: 11)
        let traceID = TraceID.random(using: &random)
        let parent = SpanID.random(using: &random)
        var server = SpanRecord(
            traceID: traceID, spanID: SpanID.random(using: &random), parentSpanID: parent, parentIsRemote: true,
            traceState: "rojo=1", name: "GET", kind: .server, startNanos: 1_800_000_000_000_000_000,
            endNanos: 1_800_000_000_123_456_789,
            attributes: [
                SpanAttribute("s", .string("ünïcode ✓")), SpanAttribute("i", .int(-42)),
                SpanAttribute("big", .int(.max)),
                SpanAttribute("b", .bool(true)), SpanAttribute("f", .bool(false)), SpanAttribute("d", .double(0.25)),
                SpanAttribute("empty", .string("")), SpanAttribute("zero", .int(0)),
            ], status: .error("upstream-timeout"))
        let linkedTrace = TraceID.random(using: &random)
        let linkedSpan = SpanID.random(using: &random)
        server.links = [SpanLink(traceID: linkedTrace, spanID: linkedSpan)]
        let client = SpanRecord(
            traceID: traceID, spanID: SpanID.random(using: &random), parentSpanID: server.spanID, name: "POST",
            kind: .client, startNanos: 5, endNanos: 6, attributes: [])
        let spans = try await Self.decode(
            OTLPEncoder(serviceName: "edge", serviceVersion: "1.2.3").encode([server, client]))
        try #require(spans.count == 2)
        let first = spans[0]
        #expect(first["trace_id"] as? String == "\(traceID)")
        #expect(first["span_id"] as? String == "\(server.spanID)")
        #expect(first["parent_span_id"] as? String == "\(parent)")
        #expect(first["trace_state"] as? String == "rojo=1")
        #expect(first["name"] as? String == "GET")
        #expect(first["kind"] as? String == "SPAN_KIND_SERVER")
        #expect((first["start"] as? NSNumber)?.uint64Value == 1_800_000_000_000_000_000)
        #expect((first["end"] as? NSNumber)?.uint64Value == 1_800_000_000_123_456_789)
        #expect((first["flags"] as? NSNumber)?.intValue == 0x301)
        #expect(first["scope"] as? String == "backstop")
        let attributes = first["attributes"] as? [String: Any] ?? [:]
        #expect(attributes["s"] as? String == "ünïcode ✓")
        #expect((attributes["i"] as? NSNumber)?.int64Value == -42)
        #expect((attributes["big"] as? NSNumber)?.int64Value == .max)
        #expect(attributes["b"] as? Bool == true)
        #expect(attributes["f"] as? Bool == false)
        #expect((attributes["d"] as? NSNumber)?.doubleValue == 0.25)
        #expect(attributes["empty"] as? String == "")
        #expect((attributes["zero"] as? NSNumber)?.intValue == 0)
        #expect(first["status"] as? [String: String] == ["code": "STATUS_CODE_ERROR", "message": "upstream-timeout"])
        #expect(
            first["resource"] as? [String: String] == [
                "service.name": "edge", "service.version": "1.2.3", "telemetry.sdk.name": "backstop",
                "telemetry.sdk.language": "swift",
            ])
        #expect(first["links"] as? [[String: String]] == [["trace_id": "\(linkedTrace)", "span_id": "\(linkedSpan)"]])
        let second = spans[1]
        #expect(second["links"] as? [[String: String]] == [])
        #expect(second["parent_span_id"] as? String == "\(server.spanID)")
        #expect(second["kind"] as? String == "SPAN_KIND_CLIENT")
        #expect(second["status"] as? [String: String] == ["code": "STATUS_CODE_UNSET", "message": ""])
        #expect((second["flags"] as? NSNumber)?.intValue == 0x101)
    }
}
