/// A response's status line and headers, available before its body has finished.
public struct RawHTTPResponseHead: Sendable {
    public let status: Int
    public let reason: String
    /// e.g. `HTTP/1.1`.
    public let version: String
    /// Header fields in wire order.
    public let headers: [(name: String, value: String)]

    public init(status: Int, reason: String, version: String, headers: [(name: String, value: String)]) {
        self.status = status
        self.reason = reason
        self.version = version
        self.headers = headers
    }

    /// The first value of header `name` (case-insensitive), or nil.
    public func header(_ name: String) -> String? {
        HeaderLookup.values(named: name, in: headers).first
    }

    /// Every value of header `name` (case-insensitive), in wire order.
    public func headers(named name: String) -> [String] {
        HeaderLookup.values(named: name, in: headers)
    }
}

/// A complete response read by `RawHTTP` / `RawHTTPConnection` (body de-chunked).
public struct RawHTTPResponse: Sendable {
    public let head: RawHTTPResponseHead
    public let body: [UInt8]

    public init(head: RawHTTPResponseHead, body: [UInt8]) {
        self.head = head
        self.body = body
    }

    public var status: Int { head.status }
    public var reason: String { head.reason }
    public var version: String { head.version }
    public var headers: [(name: String, value: String)] { head.headers }

    /// The first value of header `name` (case-insensitive), or nil.
    public func header(_ name: String) -> String? {
        head.header(name)
    }

    /// Every value of header `name` (case-insensitive), in wire order.
    public func headers(named name: String) -> [String] {
        head.headers(named: name)
    }

    /// The body decoded as UTF-8 (lossy), for readable assertions.
    public var bodyString: String {
        String(decoding: body, as: UTF8.self)
    }
}
