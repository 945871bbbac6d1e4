import W3CTraceContext

/// Encodes spans as an OTLP `ExportTraceServiceRequest` in protobuf's binary format (opentelemetry-proto v1:
/// collector/trace/v1, trace/v1, common/v1, resource/v1). Hand-written for the few messages Backstop sends, so the
/// daemon needs neither swift-protobuf nor generated code; the tests decode its output with the reference Python
/// classes (`opentelemetry-proto`).
public struct OTLPEncoder: Sendable {
    /// The resource every span shares (`service.name`, `service.version`, `telemetry.sdk.*`).
    public let resource: [SpanAttribute]
    /// The instrumentation scope's name and version.
    public let scopeName: String
    public let scopeVersion: String

    public init(serviceName: String, serviceVersion: String) {
        resource = [
            SpanAttribute("service.name", .string(serviceName)),
            SpanAttribute("service.version", .string(serviceVersion)),
            SpanAttribute("telemetry.sdk.name", .string("backstop")),
            SpanAttribute("telemetry.sdk.language", .string("swift")),
        ]
        scopeName = "backstop"
        scopeVersion = serviceVersion
    }

    /// One request body: every span under one resource and one scope.
    public func encode(_ spans: some Collection<SpanRecord>) -> [UInt8] {
        var scopeSpans = ProtoWriter()
        scopeSpans.message(1) { scope in
            scope.string(1, scopeName)
            scope.string(2, scopeVersion)
        }
        for span in spans { scopeSpans.message(2) { Self.encode(span, into: &$0) } }

        var resourceSpans = ProtoWriter()
        resourceSpans.message(1) { r in
            for attribute in resource { r.message(1) { Self.encode(attribute, into: &$0) } }
        }
        resourceSpans.bytes(2, scopeSpans.buffer)

        var request = ProtoWriter()
        request.bytes(1, resourceSpans.buffer)
        return request.buffer
    }

    static func encode(_ span: SpanRecord, into w: inout ProtoWriter) {
        w.bytes(1, withUnsafeBytes(of: span.traceID.bytes) { Array($0) })
        w.bytes(2, withUnsafeBytes(of: span.spanID.bytes) { Array($0) })
        if let state = span.traceState { w.string(3, state) }
        if let parent = span.parentSpanID { w.bytes(4, withUnsafeBytes(of: parent.bytes) { Array($0) }) }
        w.string(5, span.name)
        w.varint(6, UInt64(span.kind.rawValue))
        w.fixed64(7, span.startNanos)
        w.fixed64(8, span.endNanos)
        for attribute in span.attributes { w.message(9) { encode(attribute, into: &$0) } }
        for link in span.links {
            w.message(13) { l in
                l.bytes(1, withUnsafeBytes(of: link.traceID.bytes) { Array($0) })
                l.bytes(2, withUnsafeBytes(of: link.spanID.bytes) { Array($0) })
            }
        }
        if case .error(let message) = span.status {
            w.message(15) { status in
                status.string(2, message)
                status.varint(3, 2)  // STATUS_CODE_ERROR
            }
        }
        // SpanFlags: the sampled bit, "has is_remote" (0x100) and "is_remote" (0x200) for the parent.
        var flags: UInt32 = 0x01 | 0x100
        if span.parentIsRemote { flags |= 0x200 }
        w.fixed32(16, flags)
    }

    static func encode(_ attribute: SpanAttribute, into w: inout ProtoWriter) {
        w.string(1, attribute.key)
        w.message(2) { value in
            switch attribute.value {
            case .string(let s): value.string(1, s, always: true)
            case .bool(let b): value.varint(2, b ? 1 : 0, always: true)
            case .int(let i): value.varint(3, UInt64(bitPattern: i), always: true)
            case .double(let d): value.fixed64(4, d.bitPattern, always: true)
            }
        }
    }
}

/// Protobuf's wire format, the parts OTLP spans use: varints, fixed64/fixed32 and length-delimited fields.
struct ProtoWriter {
    var buffer: [UInt8] = []

    mutating func tag(_ field: Int, _ wireType: UInt8) { rawVarint(UInt64(field) << 3 | UInt64(wireType)) }

    mutating func rawVarint(_ value: UInt64) {
        var v = value
        while v >= 0x80 {
            buffer.append(UInt8(truncatingIfNeeded: v) | 0x80)
            v >>= 7
        }
        buffer.append(UInt8(v))
    }

    /// A varint field; proto3 leaves zero values out unless `always` (a oneof member must be written).
    mutating func varint(_ field: Int, _ value: UInt64, always: Bool = false) {
        guard value != 0 || always else { return }
        tag(field, 0)
        rawVarint(value)
    }

    mutating func fixed64(_ field: Int, _ value: UInt64, always: Bool = false) {
        guard value != 0 || always else { return }
        tag(field, 1)
        withUnsafeBytes(of: value.littleEndian) { buffer.append(contentsOf: $0) }
    }

    mutating func fixed32(_ field: Int, _ value: UInt32) {
        guard value != 0 else { return }
        tag(field, 5)
        withUnsafeBytes(of: value.littleEndian) { buffer.append(contentsOf: $0) }
    }

    mutating func bytes(_ field: Int, _ value: [UInt8]) {
        tag(field, 2)
        rawVarint(UInt64(value.count))
        buffer.append(contentsOf: value)
    }

    mutating func string(_ field: Int, _ value: String, always: Bool = false) {
        guard !value.isEmpty || always else { return }
        tag(field, 2)
        rawVarint(UInt64(value.utf8.count))
        buffer.append(contentsOf: value.utf8)
    }

    /// A nested message, written to its own buffer first for its length prefix.
    mutating func message(_ field: Int, _ body: (inout ProtoWriter) -> Void) {
        var inner = ProtoWriter()
        body(&inner)
        bytes(field, inner.buffer)
    }
}
