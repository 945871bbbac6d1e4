import Testing
import W3CTraceContext

@testable import BackstopTracing

/// Reading a client's `traceparent`/`tracestate` (W3C Trace Context level 1), hostile input included.
@Suite("Incoming trace context")
struct IncomingTraceContextTests {
    static let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    static let traceID = TraceID(
        bytes: (0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36))
    static let spanID = SpanID(bytes: (0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7))

    @Test("a valid traceparent and tracestate are read; the sampled flag is bit 0 of the flags")
    func valid() {
        #expect(
            IncomingTraceContext.parse(traceparent: Self.parent, tracestate: "rojo=00f067aa0ba902b7, congo=t61rcWkgMzE")
                == IncomingTraceContext(
                    traceID: Self.traceID, parentSpanID: Self.spanID, sampled: true,
                    traceState: "rojo=00f067aa0ba902b7, congo=t61rcWkgMzE"))
        let unsampled = IncomingTraceContext.parse(
            traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-02", tracestate: nil)
        #expect(unsampled?.sampled == false)
        #expect(unsampled?.traceState == nil)
    }

    @Test(
        "invalid traceparents start a new trace",
        arguments: [
            "", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",  // too short
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",  // version 00 with more fields
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  // zero trace id
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  // zero span id
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",  // uppercase hex
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  // forbidden version
            "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  // not hex
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",  // wrong delimiters
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",  // later version, no '-' after 55 characters
        ])
    func invalid(_ value: String) {
        #expect(IncomingTraceContext.parse(traceparent: value, tracestate: "a=b") == nil)
    }

    @Test("a later version is read as 00 from its first 55 characters")
    func laterVersion() {
        let context = IncomingTraceContext.parse(
            traceparent: "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future-adds", tracestate: nil
        )
        #expect(context == IncomingTraceContext(traceID: Self.traceID, parentSpanID: Self.spanID, sampled: true))
    }

    @Test("a malformed or oversized tracestate is dropped; the traceparent still counts")
    func badTraceState() {
        for state in ["=nokey", "UPPER=1", "a=b,,c=\u{1}", String(repeating: "a=b,", count: 200) + "a=b", ""] {
            let context = IncomingTraceContext.parse(traceparent: Self.parent, tracestate: state)
            #expect(context == IncomingTraceContext(traceID: Self.traceID, parentSpanID: Self.spanID, sampled: true))
        }
    }

    @Test("a malformed tracestate never reaches the decoder, which traps on some (a long key after a spaced member)")
    func traceStateThatTrapsTheDecoder() throws {
        let key = String(repeating: "a", count: 260)
        for state in [
            "a=1,   \(key)@x=1", "a=1, , b=2,", "a=1,\t" + key + "=2", "k=v a", "k@=1", "@s=1", "k=a=b",
        ] {
            let context = try #require(IncomingTraceContext.parse(traceparent: Self.parent, tracestate: state))
            #expect(context.traceState == nil || state == "a=1, , b=2," || state == "k=v a", "\(state)")
        }
        #expect(IncomingTraceContext.isWellFormed("a=1, , b=2,"))
        #expect(IncomingTraceContext.isWellFormed("t0@sys=v, x=y \t"))
        #expect(!IncomingTraceContext.isWellFormed("a=1,   \(key)@x=1"))
        #expect(!IncomingTraceContext.isWellFormed(String(repeating: "a", count: 257) + "=1"))
        #expect(!IncomingTraceContext.isWellFormed("a=" + String(repeating: "v", count: 257)))
    }

    @Test("a tracestate that grows past 512 bytes when re-serialized (', ' between members) is dropped too")
    func traceStateGrowingPastLimit() throws {
        // 100 members of 4 bytes (distinct two-letter keys) joined by "," are 499 bytes; by ", " they would be 598.
        let letters = Array("abcdefghijklmnopqrstuvwxyz")
        let members = (0..<100).map { "\(letters[$0 / 26])\(letters[$0 % 26])=1" }
        let state = members.joined(separator: ",")
        #expect(state.utf8.count <= IncomingTraceContext.maxTraceStateBytes)
        let context = try #require(IncomingTraceContext.parse(traceparent: Self.parent, tracestate: state))
        #expect(context.traceState == nil)
        // Fewer members fit either way and are kept, reading back the same.
        let short = members.prefix(10).joined(separator: ",")
        let kept = try #require(IncomingTraceContext.parse(traceparent: Self.parent, tracestate: short))
        #expect(kept.traceState == members.prefix(10).joined(separator: ", "))
        #expect(IncomingTraceContext.parse(traceparent: Self.parent, tracestate: kept.traceState) == kept)
    }

    @Test("from headers: names in any case, tracestate headers joined, two traceparents invalidate the context")
    func headers() {
        let one: [(name: String, value: String)] = [
            (name: "Host", value: "a"), (name: "TraceParent", value: Self.parent), (name: "tracestate", value: "a=1"),
            (name: "TRACESTATE", value: "b=2"),
        ]
        #expect(IncomingTraceContext.parse(headers: one)?.traceState == "a=1, b=2")
        let two = one + [(name: "traceparent", value: Self.parent)]
        #expect(IncomingTraceContext.parse(headers: two) == nil)
        #expect(IncomingTraceContext.parse(headers: [(name: "Host", value: "a")]) == nil)
    }
}

/// Parent-based sampling with a ratio for new traces.
@Suite("Trace sampler")
struct TraceSamplerTests {
    static func id(low: UInt64) -> TraceID {
        var bytes: [UInt8] = Array(repeating: 0xab, count: 8)
        for shift in stride(from: 56, through: 0, by: -8) {
            bytes.append(UInt8(truncatingIfNeeded: low >> UInt64(shift)))
        }
        return TraceID(
            bytes: (
                bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[6], bytes[7],
                bytes[8], bytes[9], bytes[10], bytes[11], bytes[12], bytes[13], bytes[14], bytes[15]
            ))
    }

    @Test("a parent's flag decides whatever the ratio")
    func parentDecides() {
        let sampledParent = IncomingTraceContext(traceID: Self.id(low: .max), parentSpanID: .null, sampled: true)
        let unsampledParent = IncomingTraceContext(traceID: Self.id(low: 0), parentSpanID: .null, sampled: false)
        #expect(TraceSampler(ratio: 0).isSampled(parent: sampledParent, traceID: sampledParent.traceID))
        #expect(!TraceSampler(ratio: 1).isSampled(parent: unsampledParent, traceID: unsampledParent.traceID))
    }

    @Test("new traces: 1 samples all, 0 none, a ratio compares the low 64 bits halved with ratio × 2⁶³")
    func ratio() {
        #expect(TraceSampler(ratio: 1).isSampled(newTrace: Self.id(low: .max)))
        #expect(!TraceSampler(ratio: 0).isSampled(newTrace: Self.id(low: 0)))
        let quarter = TraceSampler(ratio: 0.25)
        // The low 64 bits halved must fall below 2⁶¹: below 2⁶² is sampled.
        #expect(quarter.isSampled(newTrace: Self.id(low: (1 << 62) - 2)))
        #expect(!quarter.isSampled(newTrace: Self.id(low: 1 << 62)))
        #expect(!TraceSampler(ratio: .nan).isSampled(newTrace: Self.id(low: 0)))
        #expect(TraceSampler(ratio: 7).ratio == 1)
    }
}
