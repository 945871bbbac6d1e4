import W3CTraceContext

/// The W3C trace context a client sent (`traceparent`, `tracestate`), parsed without trusting it: a request whose
/// `traceparent` is missing, repeated or malformed starts a new trace (W3C Trace Context §4.3), and a malformed or
/// oversized `tracestate` is dropped while its `traceparent` still counts.
public struct IncomingTraceContext: Sendable, Equatable {
    public var traceID: TraceID
    /// The client's span: the parent of Backstop's server span.
    public var parentSpanID: SpanID
    /// The sampled flag decides whether this request is traced (parent-based sampling).
    public var sampled: Bool
    /// `tracestate` re-serialized (entries kept in order), nil when absent or dropped.
    public var traceState: String?

    public init(traceID: TraceID, parentSpanID: SpanID, sampled: Bool, traceState: String? = nil) {
        self.traceID = traceID
        self.parentSpanID = parentSpanID
        self.sampled = sampled
        self.traceState = traceState
    }

    /// Longest `tracestate` kept (W3C asks to propagate at least 512 characters; longer ones come from a client
    /// that is not following the spec, and the value is copied into every span).
    public static let maxTraceStateBytes = 512

    /// Parses the two header values; nil when `traceparent` is absent or invalid.
    public static func parse(traceparent: String?, tracestate: String?) -> IncomingTraceContext? {
        guard let traceparent, let normalized = normalize(traceparent) else { return nil }
        var state = tracestate
        if let value = state, value.utf8.count > maxTraceStateBytes || value.isEmpty || !isWellFormed(value) {
            state = nil
        }
        let context: TraceContext
        if let parsed = try? TraceContext(traceParentHeaderValue: normalized, traceStateHeaderValue: state) {
            context = parsed
        } else if state != nil, let parsed = try? TraceContext(traceParentHeaderValue: normalized) {
            context = parsed  // a bad tracestate does not invalidate the traceparent (W3C Trace Context §3.3.1.1)
        } else {
            return nil
        }
        // Re-serialized, members are joined with ", ": a list of short members just under the limit grows past it
        // and is dropped too, so what is kept always reads back the same (found by the traceparent fuzz target).
        let serialized = context.traceStateHeaderValue
        return IncomingTraceContext(
            traceID: context.traceID, parentSpanID: context.spanID, sampled: context.flags.contains(.sampled),
            traceState: serialized.flatMap { $0.utf8.count > maxTraceStateBytes ? nil : $0 })
    }

    /// The `tracestate` grammar (W3C Trace Context §3.3.1), checked on bytes before swift-w3c-trace-context sees
    /// the value: its decoder traps (a `String` index moved out of range while it builds an error) on some
    /// malformed lists — a key longer than its limit after a member it skipped spaces for — so a client's header
    /// must not reach it unless it is well formed (found by the traceparent fuzz target). Members are separated
    /// by commas with optional spaces or tabs; empty members are allowed. A key is `lcalpha 0*255(lcalpha / DIGIT /
    /// "_" / "-" / "*" / "/")`, or `tenant@system` with a tenant of (lcalpha / DIGIT) and up to 240 more and a system
    /// of lcalpha and up to 13 more; a value is 1 to 256 printable ASCII characters other than `,` and `=`, not
    /// ending in a space.
    static func isWellFormed(_ tracestate: String) -> Bool {
        func isKeyByte(_ byte: UInt8) -> Bool {
            (0x61...0x7A).contains(byte) || (0x30...0x39).contains(byte) || byte == 0x5F || byte == 0x2D
                || byte == 0x2A || byte == 0x2F
        }
        func isLower(_ byte: UInt8) -> Bool { (0x61...0x7A).contains(byte) }
        func isKey(_ key: ArraySlice<UInt8>) -> Bool {
            guard let first = key.first, key.allSatisfy({ isKeyByte($0) || $0 == 0x40 }) else { return false }
            let parts = key.split(separator: 0x40, omittingEmptySubsequences: false)
            switch parts.count {
            case 1: return isLower(first) && key.count <= 256
            case 2:
                let (tenant, system) = (parts[0], parts[1])
                guard let tenantFirst = tenant.first, let systemFirst = system.first else { return false }
                return (isLower(tenantFirst) || (0x30...0x39).contains(tenantFirst)) && tenant.count <= 241
                    && isLower(systemFirst) && system.count <= 14
            default: return false
            }
        }
        func isValue(_ value: ArraySlice<UInt8>) -> Bool {
            guard let last = value.last, last != 0x20, value.count <= 256 else { return false }
            return value.allSatisfy { (0x20...0x7E).contains($0) && $0 != 0x2C && $0 != 0x3D }
        }
        var members = 0
        for member in Array(tracestate.utf8).split(separator: 0x2C, omittingEmptySubsequences: false) {
            var trimmed = member[...]
            while let first = trimmed.first, first == 0x20 || first == 0x09 { trimmed = trimmed.dropFirst() }
            while let last = trimmed.last, last == 0x20 || last == 0x09 { trimmed = trimmed.dropLast() }
            if trimmed.isEmpty { continue }
            // At most 32 list members (W3C Trace Context §3.3.1.1).
            members += 1
            guard members <= 32 else { return false }
            guard let equals = trimmed.firstIndex(of: 0x3D),
                isKey(trimmed[trimmed.startIndex..<equals]), isValue(trimmed[(equals + 1)...])
            else { return false }
        }
        return true
    }

    /// Finds the trace headers among a request's headers (names compared case-insensitively). Two `traceparent`
    /// headers make the request's context invalid; several `tracestate` headers are one list joined by commas.
    public static func parse<Headers: Sequence>(headers: Headers) -> IncomingTraceContext?
    where Headers.Element == (name: String, value: String) {
        var traceparent: String?
        var parents = 0
        var tracestate: String?
        for (name, value) in headers {
            guard name.utf8.count == 11 || name.utf8.count == 10 else { continue }
            if asciiCaseInsensitiveEquals(name, "traceparent") {
                parents += 1
                traceparent = value
            } else if asciiCaseInsensitiveEquals(name, "tracestate") {
                tracestate = tracestate.map { "\($0),\(value)" } ?? value
            }
        }
        guard parents == 1 else { return nil }
        return parse(traceparent: traceparent, tracestate: tracestate)
    }

    /// Version `00` as is; a later version is read as `00` from its first 55 characters when what follows them
    /// starts with `-` (W3C Trace Context §4.3, "versioning"); `ff` and anything else are invalid.
    static func normalize(_ value: String) -> String? {
        let bytes = Array(value.utf8)
        guard bytes.count >= 55, isLowerHex(bytes[0]), isLowerHex(bytes[1]) else { return nil }
        if bytes[0] == UInt8(ascii: "0") && bytes[1] == UInt8(ascii: "0") {
            return bytes.count == 55 ? value : nil
        }
        if bytes[0] == UInt8(ascii: "f") && bytes[1] == UInt8(ascii: "f") { return nil }
        guard bytes.count == 55 || bytes[55] == UInt8(ascii: "-") else { return nil }
        return "00" + String(decoding: bytes[2..<55], as: UTF8.self)
    }

    private static func isLowerHex(_ byte: UInt8) -> Bool {
        (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) || (UInt8(ascii: "a")...UInt8(ascii: "f")).contains(byte)
    }

    private static func asciiCaseInsensitiveEquals(_ name: String, _ lowercase: String) -> Bool {
        guard name.utf8.count == lowercase.utf8.count else { return false }
        for (a, b) in zip(name.utf8, lowercase.utf8) where a | 0x20 != b { return false }
        return true
    }
}
