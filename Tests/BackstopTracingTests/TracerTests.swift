import BackstopCore
import Logging
import Testing
import W3CTraceContext

@testable import BackstopTracing

/// A sender the test controls: accepts, refuses, or never answers (a collector that is down or hung).
final class TestSender: SpanBatchSending {
    enum Mode { case accept, refuse, hang }
    let mode: Mode
    init(_ mode: Mode) { self.mode = mode }

    func send(_ body: [UInt8]) async -> String? {
        switch mode {
        case .accept: return nil
        case .refuse: return "collector answered 503"
        case .hang:
            try? await Task.sleep(for: .seconds(3600))
            return "cancelled"
        }
    }
}

func makeQueue(
    _ sender: TestSender, capacity: Int = 2048, batchSize: Int = 512, interval: Duration = .seconds(1)
)
    -> SpanExportQueue
{
    SpanExportQueue(
        encoder: OTLPEncoder(serviceName: "backstop", serviceVersion: "test"), sender: sender,
        logger: Logger(label: "test") { _ in SwiftLogNoOpLogHandler() }, capacity: capacity, batchSize: batchSize,
        interval: interval)
}

/// A request's spans: ids and parents, the `traceparent` each attempt sends, times from the injected clock.
@Suite("Tracer")
struct TracerTests {
    static let parentHeader = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

    static func facts(
        attempt: Int, status: Int?, outcome: String, retry: String? = nil, backoff: Int64? = nil
    )
        -> AttemptFacts
    {
        AttemptFacts(
            method: "GET", url: "https://api.test:8443/v2/items?key=secret", upstream: "api",
            endpoint: "https://api.test:8443", attempt: attempt, status: status, outcome: outcome, retryReason: retry,
            backoffMilliseconds: backoff, protocolVersion: status == nil ? nil : "1.1")
    }

    @Test("a retried request continuing a client's trace: one server span, one client span per attempt")
    func retriedRequest() throws {
        let clock = ManualClock(start: .seconds(1000), wall: 1_800_000_000)
        let queue = makeQueue(TestSender(.accept))
        let tracer = Tracer(sampleRatio: 0, queue: queue, clock: clock, seed: 7)
        var trace = tracer.startRequest(
            headers: [(name: "traceparent", value: Self.parentHeader), (name: "tracestate", value: "rojo=1")],
            at: clock.monotonic())
        #expect(trace.sampled)  // the parent's flag, whatever the ratio
        clock.advance(by: .milliseconds(5))
        let first = trace.startAttempt(at: clock.monotonic())
        clock.advance(by: .milliseconds(20))
        trace.endAttempt(
            first, Self.facts(attempt: 1, status: 503, outcome: "5xx", retry: "503", backoff: 100),
            at: clock.monotonic())
        clock.advance(by: .milliseconds(100))
        let second = trace.startAttempt(at: clock.monotonic())
        clock.advance(by: .milliseconds(10))
        trace.endAttempt(second, Self.facts(attempt: 2, status: 200, outcome: "2xx"), at: clock.monotonic())
        clock.advance(by: .milliseconds(1))
        trace.finish(
            RequestFacts(method: "GET", path: "/v2/items?key=secret", status: 200, upstream: "api", attempts: 2),
            at: clock.monotonic())

        let traceID = try #require(IncomingTraceContext.parse(traceparent: Self.parentHeader, tracestate: nil)).traceID
        #expect(trace.traceID == traceID)
        #expect(first.traceparent == "00-\(traceID)-\(first.spanID)-01")
        #expect(second.traceparent == "00-\(traceID)-\(second.spanID)-01")
        #expect(first.spanID != second.spanID && first.spanID != trace.spanID)

        let spans = queue.pendingSpans
        try #require(spans.count == 3)
        let base: UInt64 = 1_800_000_000_000_000_000
        #expect(
            spans[0]
                == SpanRecord(
                    traceID: traceID, spanID: first.spanID, parentSpanID: trace.spanID, traceState: "rojo=1",
                    name: "GET",
                    kind: .client, startNanos: base + 5_000_000, endNanos: base + 25_000_000,
                    attributes: [
                        SpanAttribute("http.request.method", .string("GET")),
                        SpanAttribute("url.full", .string("https://api.test:8443/v2/items")),
                        SpanAttribute("server.address", .string("api.test")),
                        SpanAttribute("server.port", .int(8443)),
                        SpanAttribute("http.response.status_code", .int(503)),
                        SpanAttribute("network.protocol.version", .string("1.1")),
                        SpanAttribute("backstop.upstream", .string("api")),
                        SpanAttribute("backstop.endpoint", .string("https://api.test:8443")),
                        SpanAttribute("backstop.attempt", .int(1)),
                        SpanAttribute("backstop.outcome", .string("5xx")),
                        SpanAttribute("backstop.retry_reason", .string("503")),
                        SpanAttribute("backstop.backoff_ms", .int(100)),
                        SpanAttribute("backstop.hedge", .bool(false)),
                        SpanAttribute("error.type", .string("503")),
                    ], status: .error("503")))
        #expect(spans[1].parentSpanID == trace.spanID)
        #expect(spans[1][attribute: "http.request.resend_count"] == .int(1))
        #expect(spans[1][attribute: "backstop.retry_reason"] == nil)
        #expect(spans[1].status == .unset)
        #expect(spans[1].startNanos == base + 125_000_000 && spans[1].endNanos == base + 135_000_000)
        #expect(
            spans[2]
                == SpanRecord(
                    traceID: traceID, spanID: trace.spanID,
                    parentSpanID: SpanID(bytes: (0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7)), parentIsRemote: true,
                    traceState: "rojo=1", name: "GET", kind: .server, startNanos: base, endNanos: base + 136_000_000,
                    attributes: [
                        SpanAttribute("http.request.method", .string("GET")),
                        SpanAttribute("url.scheme", .string("http")),
                        SpanAttribute("url.path", .string("/v2/items")),
                        SpanAttribute("network.protocol.version", .string("1.1")),
                        SpanAttribute("http.response.status_code", .int(200)),
                        SpanAttribute("backstop.upstream", .string("api")),
                        SpanAttribute("backstop.attempts", .int(2)),
                    ]))
    }

    @Test("an unsampled parent: nothing recorded, attempts still carry the trace with flag 00")
    func unsampledParent() {
        let clock = ManualClock()
        let queue = makeQueue(TestSender(.accept))
        let tracer = Tracer(sampleRatio: 1, queue: queue, clock: clock, seed: 1)
        var trace = tracer.startRequest(
            headers: [(name: "traceparent", value: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")],
            at: clock.monotonic())
        let attempt = trace.startAttempt(at: clock.monotonic())
        trace.endAttempt(attempt, Self.facts(attempt: 1, status: 200, outcome: "2xx"), at: clock.monotonic())
        trace.finish(RequestFacts(method: "GET", path: "/", status: 200), at: clock.monotonic())
        #expect(!trace.sampled)
        #expect(attempt.traceparent == "00-4bf92f3577b34da6a3ce929d0e0e4736-\(attempt.spanID)-00")
        #expect(queue.pendingSpans.isEmpty)
    }

    @Test("without a traceparent the ratio decides and the server span is a root; the same seed, the same ids")
    func newTraces() {
        let clock = ManualClock()
        func run(seed: UInt64, ratio: Double) -> (sampled: Int, first: RequestTrace) {
            let tracer = Tracer(sampleRatio: ratio, queue: makeQueue(TestSender(.accept)), clock: clock, seed: seed)
            let first = tracer.startRequest(parent: nil, at: clock.monotonic())
            var sampled = first.sampled ? 1 : 0
            for _ in 1..<4000 where tracer.startRequest(parent: nil, at: clock.monotonic()).sampled { sampled += 1 }
            return (sampled, first)
        }
        #expect(run(seed: 3, ratio: 1).sampled == 4000)
        #expect(run(seed: 3, ratio: 0).sampled == 0)
        let quarter = run(seed: 3, ratio: 0.25)
        #expect((900...1100).contains(quarter.sampled))
        #expect(run(seed: 3, ratio: 0.25).sampled == quarter.sampled)
        #expect(run(seed: 3, ratio: 0.25).first.traceID == quarter.first.traceID)
        #expect(run(seed: 4, ratio: 0.25).first.traceID != quarter.first.traceID)

        let queue = makeQueue(TestSender(.accept))
        let tracer = Tracer(sampleRatio: 1, queue: queue, clock: clock, seed: 9)
        tracer.startRequest(parent: nil, at: clock.monotonic())
            .finish(
                RequestFacts(method: "BREW", path: "/pot", status: 502, errorReason: "upstream-unreachable"),
                at: clock.monotonic())
        let span = queue.pendingSpans.first
        #expect(span?.parentSpanID == nil && span?.parentIsRemote == false)
        #expect(span?.name == "HTTP")
        #expect(span?[attribute: "http.request.method"] == .string("_OTHER"))
        #expect(span?[attribute: "http.request.method_original"] == .string("BREW"))
        #expect(span?[attribute: "error.type"] == .string("upstream-unreachable"))
        #expect(span?.status == .error("upstream-unreachable"))
    }

    @Test("a token refresh: a child of the request that waited on it, or a root span of its own")
    func refresh() {
        let clock = ManualClock()
        let queue = makeQueue(TestSender(.accept))
        let tracer = Tracer(sampleRatio: 1, queue: queue, clock: clock, seed: 5)
        let request = tracer.startRequest(parent: nil, at: clock.monotonic())
        let child = tracer.startRefresh(parent: request, at: clock.monotonic())
        clock.advance(by: .milliseconds(40))
        child.finish(
            RefreshFacts(upstream: "api", tokenEndpointHost: "auth.test", outcome: "failure", failure: "invalid_grant"),
            at: clock.monotonic())
        tracer.startRefresh(parent: nil, at: clock.monotonic())
            .finish(
                RefreshFacts(upstream: "api", tokenEndpointHost: "auth.test", outcome: "success"), at: clock.monotonic()
            )
        let spans = queue.pendingSpans
        #expect(spans.count == 2)
        #expect(spans.first?.traceID == request.traceID && spans.first?.parentSpanID == request.spanID)
        #expect(spans.first?.kind == .internal && spans.first?.name == "token refresh")
        #expect(spans.first.map { $0.endNanos - $0.startNanos } == 40_000_000)
        #expect(
            spans.first?.attributes == [
                SpanAttribute("backstop.upstream", .string("api")),
                SpanAttribute("server.address", .string("auth.test")),
                SpanAttribute("backstop.outcome", .string("failure")),
                SpanAttribute("error.type", .string("invalid_grant")),
            ])
        #expect(spans.last?.parentSpanID == nil && spans.last?.traceID != request.traceID)
        #expect(spans.last?.status == .unset)
    }

    @Test(
        "a request that waited on another trace's refresh links to it once; its own refresh and unsampled ones are not linked"
    )
    func waitedOnRefresh() {
        let clock = ManualClock()
        let queue = makeQueue(TestSender(.accept))
        let tracer = Tracer(sampleRatio: 1, queue: queue, clock: clock, seed: 9)
        let starter = tracer.startRequest(parent: nil, at: clock.monotonic())
        let refresh = tracer.startRefresh(parent: starter, at: clock.monotonic())
        var waiter = tracer.startRequest(parent: nil, at: clock.monotonic())
        waiter.waited(on: refresh.link)
        waiter.waited(on: refresh.link)
        var own = starter
        own.waited(on: refresh.link)
        var unsampled = tracer.startRequest(
            headers: [(name: "traceparent", value: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")],
            at: clock.monotonic())
        unsampled.waited(on: refresh.link)
        #expect(waiter.links == [SpanLink(traceID: starter.traceID, spanID: refresh.spanID)])
        #expect(own.links.isEmpty)
        #expect(unsampled.links.isEmpty)
        waiter.finish(RequestFacts(method: "GET", path: "/", status: 200), at: clock.monotonic())
        #expect(queue.pendingSpans.map(\.links) == [[SpanLink(traceID: starter.traceID, spanID: refresh.spanID)]])
    }

    @Test(
        "an attempt that failed whatever its status (a response broken off after its head) is an error of that failure")
    func failureAfterHead() {
        var facts = Self.facts(attempt: 1, status: 200, outcome: "2xx")
        facts.failure = "upstream-broke-mid-response"
        let (attributes, status) = SpanAttributes.client(facts)
        #expect(status == .error("upstream-broke-mid-response"))
        #expect(
            attributes.filter { $0.key == "error.type" } == [
                SpanAttribute("error.type", .string("upstream-broke-mid-response"))
            ])
        #expect(attributes.contains(SpanAttribute("http.response.status_code", .int(200))))
    }

    @Test(
        "authorities split into host and port: names, IPv4, bracketed IPv6, no port; a port that is not a number is nil"
    )
    func authorities() {
        #expect(SpanAttributes.split(authority: "app.test:8080").map { "\($0.0) \($0.1 ?? -1)" } == "app.test 8080")
        #expect(SpanAttributes.split(authority: "app.test").map { "\($0.0) \($0.1 ?? -1)" } == "app.test -1")
        #expect(SpanAttributes.split(authority: "127.0.0.1:53210").map { "\($0.0) \($0.1 ?? -1)" } == "127.0.0.1 53210")
        #expect(SpanAttributes.split(authority: "[::1]:53210").map { "\($0.0) \($0.1 ?? -1)" } == "::1 53210")
        #expect(SpanAttributes.split(authority: "[::1]").map { "\($0.0) \($0.1 ?? -1)" } == "::1 -1")
        #expect(SpanAttributes.split(authority: "app.test:x") == nil)
        #expect(
            SpanAttributes.hostAndPort("https://auth.test/oauth/token").map { "\($0.0) \($0.1)" } == "auth.test 443")
    }
}

@Suite("Attempt headers")
struct AttemptHeaderTests {
    @Test(
        "the attempt's traceparent replaces every one the client sent; tracestate stays when the client's trace is continued, and goes when the trace starts anew"
    )
    func replacesTraceparent() {
        let clock = ManualClock()
        let tracer = Tracer(sampleRatio: 1, queue: makeQueue(TestSender(.accept)), clock: clock, seed: 2)
        let sent: HeaderFields = [
            (name: "Host", value: "a"), (name: "TraceParent", value: "00-x"), (name: "tracestate", value: "a=1"),
            (name: "traceparent", value: "00-y"),
        ]
        var anew = tracer.startRequest(parent: nil, at: clock.monotonic())
        let attempt = anew.startAttempt(at: clock.monotonic())
        var headers = sent
        attempt.settingTraceparent(in: &headers)
        #expect(headers.map { "\($0.name): \($0.value)" } == ["Host: a", "traceparent: \(attempt.traceparent)"])
        #expect(attempt.traceparent.hasPrefix("00-\(anew.traceID)-"))
        #expect(attempt.traceparent.count == 55)

        let parent = IncomingTraceContext.parse(
            traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", tracestate: "a=1")
        var continued = tracer.startRequest(parent: parent, at: clock.monotonic())
        let kept = continued.startAttempt(at: clock.monotonic())
        headers = sent
        kept.settingTraceparent(in: &headers)
        #expect(
            headers.map { "\($0.name): \($0.value)" } == [
                "Host: a", "tracestate: a=1", "traceparent: \(kept.traceparent)",
            ])
        // Over 32 members: ignored, so not sent on either.
        let crowded = (1...33).map { "k\($0)=v" }.joined(separator: ",")
        let overfull = IncomingTraceContext.parse(
            traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", tracestate: crowded)
        #expect(overfull != nil && overfull?.traceState == nil)
        #expect(
            IncomingTraceContext.parse(
                traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                tracestate: (1...32).map { "k\($0)=v" }.joined(separator: ","))?.traceState != nil)
    }
}
