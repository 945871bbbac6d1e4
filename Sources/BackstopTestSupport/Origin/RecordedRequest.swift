/// One request as a `TestOrigin` received it, recorded once its end arrived.
public struct RecordedRequest: Sendable {
    /// 0-based position in the order the origin read request heads, across all connections.
    public let index: Int
    public let method: String
    /// The raw request-target, e.g. `/a/b?q=1`.
    public let uri: String
    /// e.g. `HTTP/1.1`.
    public let version: String
    /// Header fields in wire order, names as sent.
    public let headers: [(name: String, value: String)]
    /// The complete (de-chunked) request body.
    public let body: [UInt8]
    /// Identifies the TCP connection (1-based, in accept order) the request arrived on.
    public let connectionID: Int
    /// When the request head was read.
    public let arrivedAt: ContinuousClock.Instant

    public init(
        index: Int,
        method: String,
        uri: String,
        version: String,
        headers: [(name: String, value: String)],
        body: [UInt8],
        connectionID: Int,
        arrivedAt: ContinuousClock.Instant
    ) {
        self.index = index
        self.method = method
        self.uri = uri
        self.version = version
        self.headers = headers
        self.body = body
        self.connectionID = connectionID
        self.arrivedAt = arrivedAt
    }

    /// The first value of header `name` (case-insensitive), or nil.
    public func header(_ name: String) -> String? {
        HeaderLookup.values(named: name, in: headers).first
    }

    /// Every value of header `name` (case-insensitive), in wire order.
    public func headers(named name: String) -> [String] {
        HeaderLookup.values(named: name, in: headers)
    }

    /// The body decoded as UTF-8 (lossy), for readable assertions.
    public var bodyString: String {
        String(decoding: body, as: UTF8.self)
    }
}
