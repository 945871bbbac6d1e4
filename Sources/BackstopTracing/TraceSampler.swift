import W3CTraceContext

/// Parent-based sampling with a ratio for new traces (OpenTelemetry's `parentbased_traceidratio`): a request that
/// continues a trace follows its parent's sampled flag; a new trace is sampled when its trace id's low 64 bits fall
/// below `ratio` of their range, so every service that samples by trace id agrees on the same traces.
public struct TraceSampler: Sendable, Equatable {
    /// Share of new traces sampled, 0...1.
    public let ratio: Double
    /// The low 64 bits halved are sampled below this (`ratio` × 2⁶³: 63 bits, so the product cannot overflow).
    let bound: UInt64

    public init(ratio: Double) {
        let clamped = min(max(ratio.isNaN ? 0 : ratio, 0), 1)
        self.ratio = clamped
        self.bound = clamped >= 1 ? .max : UInt64(clamped * 9_223_372_036_854_775_808.0)
    }

    /// Whether a request is recorded: the parent's flag when there is one, else the trace id's draw.
    public func isSampled(parent: IncomingTraceContext?, traceID: TraceID) -> Bool {
        if let parent { return parent.sampled }
        return isSampled(newTrace: traceID)
    }

    /// Whether a new trace (no parent) is recorded.
    public func isSampled(newTrace traceID: TraceID) -> Bool {
        if ratio >= 1 { return true }
        if ratio <= 0 { return false }
        return (Self.lowBits(traceID) >> 1) < bound
    }

    static func lowBits(_ id: TraceID) -> UInt64 {
        let b = id.bytes
        var value: UInt64 = 0
        for byte in [b.8, b.9, b.10, b.11, b.12, b.13, b.14, b.15] { value = value << 8 | UInt64(byte) }
        return value
    }
}
