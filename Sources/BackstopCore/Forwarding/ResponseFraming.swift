/// How Backstop frames a response body for its client (RFC 9112 §6.1–6.3). curl hands over the upstream's body
/// already de-chunked, so the proxy re-frames it: the upstream's `Content-Length` when it sent one, chunked for an
/// HTTP/1.1 client, closing the connection for an HTTP/1.0 client.
public enum ResponseFraming: Sendable, Equatable {
    /// No body: `HEAD`, `1xx`, `204`, `304`. A `Content-Length` from the upstream still describes the
    /// representation and is passed on for `HEAD` and `304`; never on a `204` or `1xx`, which must not carry one.
    case bodyless
    case contentLength(Int)
    case chunked
    /// The body ends when the connection closes (`Connection: close` is sent).
    case closeDelimited

    public static func decide(
        requestIsHEAD: Bool, status: Int, contentLength: Int?, clientIsHTTP10: Bool
    )
        -> ResponseFraming
    {
        if requestIsHEAD || status == 204 || status == 304 || (100..<200).contains(status) { return .bodyless }
        if let contentLength { return .contentLength(contentLength) }
        return clientIsHTTP10 ? .closeDelimited : .chunked
    }

    /// The connection cannot carry another response after this one.
    public var endsConnection: Bool { self == .closeDelimited }
}
