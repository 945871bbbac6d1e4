import BackstopCore
import NIOConcurrencyHelpers
import W3CTraceContext

/// Starts the traces of client requests and token refreshes and hands finished spans to the export queue. One per
/// daemon while `tracing` is configured; without it the runtime holds none, and the exchange's optional calls
/// cost one nil check (docs/reference/operations.md#tracing).
public final class Tracer: Sendable {
    public let sampler: TraceSampler
    public let queue: SpanExportQueue
    let clock: any BackstopClock
    /// Seeds one small generator per trace; the only lock a request takes for its ids.
    private let seeds: NIOLockedValueBox<SplitMix64>

    /// `seed` makes every id and sampling draw repeatable in tests; the daemon passes a random one.
    public init(sampleRatio: Double, queue: SpanExportQueue, clock: any BackstopClock, seed: UInt64) {
        self.sampler = TraceSampler(ratio: sampleRatio)
        self.queue = queue
        self.clock = clock
        self.seeds = NIOLockedValueBox(SplitMix64(seed: seed))
    }

    /// The trace of a client request whose head arrived at `monotonic` (a `BackstopClock.monotonic()` reading):
    /// continues the client's `traceparent` when it sent a valid one, else starts a new trace.
    public func startRequest<Headers: Sequence>(headers: Headers, at monotonic: Duration) -> RequestTrace
    where Headers.Element == (name: String, value: String) {
        startRequest(parent: IncomingTraceContext.parse(headers: headers), at: monotonic)
    }

    /// As `startRequest(headers:at:)`, from an already parsed context (nil: a new trace).
    public func startRequest(parent: IncomingTraceContext?, at monotonic: Duration) -> RequestTrace {
        var random = SplitMix64(seed: seeds.withLockedValue { $0.next() })
        let traceID = parent?.traceID ?? TraceID.random(using: &random)
        let sampled = sampler.isSampled(parent: parent, traceID: traceID)
        let spanID = Self.spanID(&random)
        return RequestTrace(
            tracer: self, traceID: traceID, spanID: spanID, parent: parent, sampled: sampled, random: random,
            epoch: TraceEpoch(clock: clock, monotonic: monotonic), start: monotonic)
    }

    /// A token refresh's span: a child of the request that started it, or a new trace (sampled by the ratio) for a
    /// refresh that no request waited on (`refresh_ahead`).
    public func startRefresh(parent: RequestTrace?, at monotonic: Duration) -> SpanTimer {
        if let parent {
            var random = SplitMix64(seed: seeds.withLockedValue { $0.next() })
            return SpanTimer(
                tracer: parent.sampled ? self : nil, traceID: parent.traceID, spanID: Self.spanID(&random),
                parentSpanID: parent.spanID, traceState: parent.traceState, epoch: parent.epoch, start: monotonic)
        }
        var random = SplitMix64(seed: seeds.withLockedValue { $0.next() })
        let traceID = TraceID.random(using: &random)
        return SpanTimer(
            tracer: sampler.isSampled(newTrace: traceID) ? self : nil, traceID: traceID, spanID: Self.spanID(&random),
            parentSpanID: nil, traceState: nil, epoch: TraceEpoch(clock: clock, monotonic: monotonic), start: monotonic)
    }

    /// A random non-zero span id (zero is invalid in W3C trace context).
    static func spanID(_ random: inout SplitMix64) -> SpanID {
        var id = SpanID.random(using: &random)
        while id == .null { id = SpanID.random(using: &random) }
        return id
    }
}

/// Converts monotonic readings to Unix-epoch nanoseconds with one wall-clock reading per trace, so a span's
/// duration is monotonic even when the wall clock steps.
public struct TraceEpoch: Sendable, Equatable {
    let wallNanos: UInt64
    let monotonic: Duration

    init(clock: any BackstopClock, monotonic: Duration) {
        let wall = clock.wall()
        self.wallNanos = wall.isFinite && wall > 0 && wall < 1.8e10 ? UInt64(wall * 1e9) : 0
        self.monotonic = monotonic
    }

    /// Unix-epoch nanoseconds of the monotonic reading `at`.
    func nanos(_ at: Duration) -> UInt64 {
        let offset = (at - monotonic).nanosecondsClamped
        return offset >= 0 ? wallNanos &+ UInt64(offset) : wallNanos &- min(wallNanos, UInt64(-offset))
    }
}

/// The trace of one client request: its server span and the client spans of its attempts. A value the exchange
/// owns (no lock); finished spans go to the export queue only when the request is sampled.
public struct RequestTrace: Sendable {
    let tracer: Tracer
    public let traceID: TraceID
    /// The server span's id: the parent of every attempt's span.
    public let spanID: SpanID
    public let parent: IncomingTraceContext?
    /// Whether spans are recorded. An unsampled request still sends each attempt a `traceparent` (flag `00`), so
    /// the upstream keeps the client's trace.
    public let sampled: Bool
    var random: SplitMix64
    let epoch: TraceEpoch
    let start: Duration
    /// Spans of other traces this request waited on (a token refresh another request started).
    public private(set) var links: [SpanLink] = []

    var traceState: String? { parent?.traceState }

    /// This request waited on `span` (a token refresh): its server span links to it, unless the span is already
    /// in this trace (the refresh this request started is its child).
    public mutating func waited(on span: SpanLink) {
        guard sampled, span.traceID != traceID, !links.contains(span) else { return }
        links.append(span)
    }

    /// The span of an attempt about to be sent: its id names it in the `traceparent` the upstream receives.
    public mutating func startAttempt(at monotonic: Duration) -> AttemptSpan {
        AttemptSpan(
            spanID: Tracer.spanID(&random), traceID: traceID, sampled: sampled, start: monotonic,
            keepsTraceState: traceState != nil)
    }

    /// Records an attempt's client span, ended at `monotonic`, with what it came to.
    public func endAttempt(_ attempt: AttemptSpan, _ facts: AttemptFacts, at monotonic: Duration) {
        guard sampled else { return }
        let (attributes, status) = SpanAttributes.client(facts)
        tracer.queue.submit(
            SpanRecord(
                traceID: traceID, spanID: attempt.spanID, parentSpanID: spanID, traceState: traceState,
                name: SpanAttributes.spanName(method: facts.method), kind: .client,
                startNanos: epoch.nanos(attempt.start),
                endNanos: epoch.nanos(monotonic), attributes: attributes, status: status))
    }

    /// Records the server span: the request was answered (or abandoned) at `monotonic`.
    public func finish(_ facts: RequestFacts, at monotonic: Duration) {
        guard sampled else { return }
        let (attributes, status) = SpanAttributes.server(facts)
        tracer.queue.submit(
            SpanRecord(
                traceID: traceID, spanID: spanID, parentSpanID: parent?.parentSpanID, parentIsRemote: parent != nil,
                traceState: traceState, name: SpanAttributes.spanName(method: facts.method), kind: .server,
                startNanos: epoch.nanos(start), endNanos: epoch.nanos(monotonic), attributes: attributes,
                status: status,
                links: links))
    }
}

/// One attempt's span while it is in flight.
public struct AttemptSpan: Sendable, Equatable {
    public let spanID: SpanID
    let traceID: TraceID
    let sampled: Bool
    let start: Duration
    /// The request continues the client's trace with a well-formed `tracestate`, which then goes upstream as sent.
    var keepsTraceState = false

    /// The `traceparent` value this attempt sends upstream (replacing the client's): this span as the parent.
    public var traceparent: String {
        TraceContext(traceID: traceID, spanID: spanID, flags: sampled ? .sampled : [], state: TraceState())
            .traceParentHeaderValue
    }
}

/// A span timed by its owner and recorded by `finish` (token refreshes). `tracer` is nil when unsampled.
public struct SpanTimer: Sendable {
    let tracer: Tracer?
    public let traceID: TraceID
    public let spanID: SpanID
    let parentSpanID: SpanID?
    let traceState: String?
    let epoch: TraceEpoch
    let start: Duration

    /// Whether `finish` records anything.
    public var sampled: Bool { tracer != nil }

    /// How a request that waited on this refresh refers to it.
    public var link: SpanLink { SpanLink(traceID: traceID, spanID: spanID) }

    /// Records the refresh span, ended at `monotonic`.
    public func finish(_ facts: RefreshFacts, at monotonic: Duration) {
        guard let tracer else { return }
        let (attributes, status) = SpanAttributes.refresh(facts)
        tracer.queue.submit(
            SpanRecord(
                traceID: traceID, spanID: spanID, parentSpanID: parentSpanID, traceState: traceState,
                name: "token refresh", kind: .internal, startNanos: epoch.nanos(start),
                endNanos: epoch.nanos(monotonic),
                attributes: attributes, status: status))
    }
}

extension AttemptSpan {
    /// An attempt's upstream headers with this span's `traceparent` in place of any the client sent (every
    /// `traceparent` field removed, one added). `tracestate` is left as the client sent it when the request continues
    /// the client's trace and it is well-formed; otherwise it is removed, as W3C Trace Context asks of a trace
    /// started anew or a `tracestate` that could not be read.
    public func settingTraceparent(in headers: inout HeaderFields) {
        headers.remove(name: "traceparent")
        headers.append(name: "traceparent", value: traceparent)
        if !keepsTraceState { headers.remove(name: "tracestate") }
    }
}
