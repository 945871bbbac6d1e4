import W3CTraceContext

/// One finished span as it is exported: ids, name, kind, times and attributes (the OTLP `Span` message's fields
/// that Backstop fills).
public struct SpanRecord: Sendable, Equatable {
    public var traceID: TraceID
    public var spanID: SpanID
    /// nil for a trace's root span.
    public var parentSpanID: SpanID?
    /// Whether the parent lives in another process (the client's span a request continued).
    public var parentIsRemote: Bool
    /// The W3C `tracestate` in force, when there is one.
    public var traceState: String?
    public var name: String
    public var kind: SpanKind
    /// Nanoseconds since the Unix epoch.
    public var startNanos: UInt64
    public var endNanos: UInt64
    public var attributes: [SpanAttribute]
    public var status: SpanStatus
    /// Spans of other traces this one waited on (a token refresh another request started).
    public var links: [SpanLink]

    public init(
        traceID: TraceID, spanID: SpanID, parentSpanID: SpanID?, parentIsRemote: Bool = false,
        traceState: String? = nil,
        name: String, kind: SpanKind, startNanos: UInt64, endNanos: UInt64, attributes: [SpanAttribute],
        status: SpanStatus = .unset, links: [SpanLink] = []
    ) {
        self.traceID = traceID
        self.spanID = spanID
        self.parentSpanID = parentSpanID
        self.parentIsRemote = parentIsRemote
        self.traceState = traceState
        self.name = name
        self.kind = kind
        self.startNanos = startNanos
        self.endNanos = endNanos
        self.attributes = attributes
        self.status = status
        self.links = links
    }

    /// The value of attribute `key`, if set.
    public subscript(attribute key: String) -> SpanAttribute.Value? {
        attributes.first { $0.key == key }?.value
    }
}

/// A reference from one span to a span of another trace (OTLP `Span.Link`): the request that waited on a token
/// refresh links to the refresh's span when that span lives in the trace of the request that started it.
public struct SpanLink: Sendable, Equatable {
    public var traceID: TraceID
    public var spanID: SpanID

    public init(traceID: TraceID, spanID: SpanID) {
        self.traceID = traceID
        self.spanID = spanID
    }
}

/// OTLP's span kinds that Backstop emits (their numbers are the protocol's `SpanKind` values).
public enum SpanKind: Int, Sendable, Equatable {
    case `internal` = 1
    case server = 2
    case client = 3
}

/// A span's outcome: OpenTelemetry leaves a span `unset` unless it failed.
public enum SpanStatus: Sendable, Equatable {
    case unset
    case error(String)
}

/// One key/value attribute of a span or resource.
public struct SpanAttribute: Sendable, Equatable {
    public var key: String
    public var value: Value

    public init(_ key: String, _ value: Value) {
        self.key = key
        self.value = value
    }

    /// The attribute value types Backstop uses.
    public enum Value: Sendable, Equatable {
        case string(String)
        case int(Int64)
        case bool(Bool)
        case double(Double)
    }
}
