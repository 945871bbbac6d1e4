import BackstopCore
import NIOCore
import NIOHTTP1

/// A client request's head as the proxy handles it: NIO's method and version, the target as sent, and the fields as
/// the client's bytes (`HeaderFields`: strings only for the fields read by name; the fields forwarded are copied as
/// bytes, docs/performance.md#header-fields-as-bytes).
struct ClientRequestHead: Sendable, Equatable {
    /// One reference, as NIO's `HTTPRequestHead` keeps its parts: a head is copied into a part, the connection's
    /// queue and the exchange, and a part must fit `NIOAny`'s inline storage (a larger payload is boxed, an
    /// allocation per request).
    private final class Storage: Sendable {
        let method: HTTPMethod
        let uri: String
        let version: HTTPVersion
        let headers: HeaderFields
        let isKeepAlive: Bool

        init(method: HTTPMethod, uri: String, version: HTTPVersion, headers: HeaderFields, isKeepAlive: Bool) {
            self.method = method
            self.uri = uri
            self.version = version
            self.headers = headers
            self.isKeepAlive = isKeepAlive
        }
    }

    private var storage: Storage

    var method: HTTPMethod { storage.method }
    var uri: String { storage.uri }
    var version: HTTPVersion { storage.version }
    /// Whether the connection stays open after this request: HTTP/1.1 unless `Connection` lists `close`, HTTP/1.0
    /// only when it lists `keep-alive` (the request decoder decided it on the bytes).
    var isKeepAlive: Bool { storage.isKeepAlive }
    /// Settable for the one change admission makes (taking out a delivery's own field); a change makes a new copy.
    var headers: HeaderFields {
        get { storage.headers }
        set {
            storage = Storage(
                method: storage.method, uri: storage.uri, version: storage.version, headers: newValue,
                isKeepAlive: storage.isKeepAlive)
        }
    }

    init(method: HTTPMethod, uri: String, version: HTTPVersion, headers: HeaderFields, isKeepAlive: Bool) {
        storage = Storage(method: method, uri: uri, version: version, headers: headers, isKeepAlive: isKeepAlive)
    }

    static func == (a: Self, b: Self) -> Bool {
        a.storage === b.storage
            || (a.method == b.method && a.uri == b.uri && a.version == b.version && a.headers == b.headers
                && a.isKeepAlive == b.isKeepAlive)
    }

    /// A head made in code (tests, the fuzz targets): keep-alive decided from `Connection` as the decoder decides it.
    init(version: HTTPVersion = .http1_1, method: HTTPMethod, uri: String, headers: HeaderFields = HeaderFields()) {
        let connection = headers["connection"]
        let close = connection.contains { HeaderRewriter.value($0, lists: "close") }
        let keepAlive = connection.contains { HeaderRewriter.value($0, lists: "keep-alive") }
        self.init(
            method: method, uri: uri, version: version, headers: headers,
            isKeepAlive: version.minor >= 1 ? !close : keepAlive)
    }
}

/// The parts of a client request as the request decoder hands them to the proxy handler.
typealias ClientRequestPart = HTTPPart<ClientRequestHead, ByteBuffer>
