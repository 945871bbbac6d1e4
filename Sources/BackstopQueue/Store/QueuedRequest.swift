import BackstopCore

/// A client request as it was accepted for queued delivery: what the deliverer replays through the upstream's
/// routing, auth and retry policy. Stored sealed; nothing of it is readable on disk.
public struct QueuedRequest: Sendable, Equatable {
    /// One header field, as the client sent it.
    public struct Header: Sendable, Equatable {
        public var name: String
        public var value: String
        public init(_ name: String, _ value: String) {
            self.name = name
            self.value = value
        }
    }

    public var method: String
    /// The request target as received (origin-form `/path?query` or absolute-form URL).
    public var target: String
    public var headers: [Header]
    public var body: [UInt8]

    public init(method: String, target: String, headers: [Header], body: [UInt8]) {
        self.method = method
        self.target = target
        self.headers = headers
        self.body = body
    }

    /// The path of `target` without its query (which may carry secrets): what `deliveries list` shows.
    public var path: String {
        var rest = Substring(target)
        if let scheme = rest.range(of: "://") {
            rest = rest[scheme.upperBound...]
            rest = rest.firstIndex(of: "/").map { rest[$0...] } ?? "/"
        }
        if let query = rest.firstIndex(where: { $0 == "?" || $0 == "#" }) { rest = rest[..<query] }
        return rest.isEmpty ? "/" : String(rest)
    }

    /// The headers to send for delivery `id`, so every try of it carries the same key and the upstream can
    /// deduplicate: always an `Idempotency-Key` — the client's own, else the value of the upstream's key header
    /// (`headerName`, `retry.retry_non_idempotent_with_key`) when the client sent that, else the delivery's id — and,
    /// when `headerName` is another header, that one too, with the same value. Names compare case-insensitively.
    public func headersForDelivery(id: DeliveryID, headerName: String = "Idempotency-Key") -> [Header] {
        let standard = "Idempotency-Key"
        func isKeyHeader(_ name: String) -> Bool {
            name.caseInsensitiveEquals(standard) || name.caseInsensitiveEquals(headerName)
        }
        // An empty key is no key: unrelated requests would share it. It gives way to the delivery id.
        let kept = headers.filter { !(isKeyHeader($0.name) && $0.value.isEmpty) }
        func value(_ name: String) -> String? {
            kept.first(where: { $0.name.caseInsensitiveEquals(name) })?.value
        }
        let key = value(standard) ?? value(headerName) ?? id.text
        var out = kept
        if value(standard) == nil { out.append(Header(standard, key)) }
        if !headerName.caseInsensitiveEquals(standard), value(headerName) == nil { out.append(Header(headerName, key)) }
        return out
    }
}

/// The binary form of a sealed queue entry's parts (before sealing, after opening). Length-prefixed fields with
/// a format byte in front; decoding checks every length against what is left, so a damaged entry that somehow
/// opened cannot make it read out of bounds.
/// Package-visible for the `queued-head` fuzz target.
package enum QueuedRequestCodec {
    static let headFormat: UInt8 = 1

    /// `format ‖ method ‖ target ‖ count ‖ (name ‖ value)*`, each string as a 4-byte big-endian length and UTF-8.
    package static func encodeHead(_ request: QueuedRequest) -> [UInt8] {
        var out: [UInt8] = [headFormat]
        func put(_ value: Int) { withUnsafeBytes(of: UInt32(value).bigEndian) { out.append(contentsOf: $0) } }
        func put(_ text: String) {
            put(text.utf8.count)
            out.append(contentsOf: text.utf8)
        }
        put(request.method)
        put(request.target)
        put(request.headers.count)
        for header in request.headers {
            put(header.name)
            put(header.value)
        }
        return out
    }

    /// The method, target and headers, or nil when `bytes` is not a head this version wrote.
    package static func decodeHead(
        _ bytes: [UInt8]
    ) -> (method: String, target: String, headers: [QueuedRequest.Header])? {
        var reader = ByteReader(bytes: bytes[...])
        guard reader.byte() == headFormat, let method = reader.string(), let target = reader.string(),
            let count = reader.length(), count <= reader.remaining / 8
        else { return nil }
        var headers: [QueuedRequest.Header] = []
        headers.reserveCapacity(count)
        for _ in 0..<count {
            guard let name = reader.string(), let value = reader.string() else { return nil }
            headers.append(QueuedRequest.Header(name, value))
        }
        guard reader.remaining == 0 else { return nil }
        return (method, target, headers)
    }

    private struct ByteReader {
        var bytes: ArraySlice<UInt8>
        var remaining: Int { bytes.count }

        mutating func byte() -> UInt8? { bytes.popFirst() }

        mutating func length() -> Int? {
            guard bytes.count >= 4 else { return nil }
            let value = bytes.prefix(4).reduce(0) { $0 << 8 | Int($1) }
            bytes = bytes.dropFirst(4)
            return value
        }

        mutating func string() -> String? {
            guard let count = length(), count <= bytes.count else { return nil }
            let text = String(validating: bytes.prefix(count), as: UTF8.self)
            bytes = bytes.dropFirst(count)
            return text
        }
    }
}
