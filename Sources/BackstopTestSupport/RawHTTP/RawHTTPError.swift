/// Failures of `RawHTTP` and `RawHTTPConnection`.
public enum RawHTTPError: Error, CustomStringConvertible, Equatable {
    /// Nothing satisfied the wait within the timeout.
    case timeout(Duration, waitingFor: String)
    /// The TCP / unix connection could not be opened.
    case connectFailed(String)
    /// The connection failed at the socket level (e.g. reset by peer, broken pipe).
    case connectionError(String)
    /// The peer closed the connection cleanly before the awaited response.
    case closedBeforeResponse(responsesReceived: Int)
    /// The bytes received are not a valid HTTP/1.1 response (or the body was cut short).
    case malformedResponse(String)
    /// A response arrived that no request asked for: the peer answered some request twice.
    case unsolicitedResponse

    public var description: String {
        switch self {
        case .timeout(let duration, let what):
            return "RawHTTP: timed out after \(duration) waiting for \(what)"
        case .connectFailed(let detail):
            return "RawHTTP: connect failed: \(detail)"
        case .connectionError(let detail):
            return "RawHTTP: connection error: \(detail)"
        case .closedBeforeResponse(let count):
            return "RawHTTP: connection closed by peer after \(count) complete response(s)"
        case .malformedResponse(let detail):
            return "RawHTTP: malformed response: \(detail)"
        case .unsolicitedResponse:
            return "RawHTTP: a response arrived that no request asked for"
        }
    }

    /// True for socket-level failures, which is what an origin or proxy reset looks like to a client.
    public var isConnectionError: Bool {
        if case .connectionError = self {
            return true
        }
        return false
    }
}
