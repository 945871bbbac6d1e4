/// The lifecycle of one raw upstream HTTP/1.1 connection (docs/performance.md#libcurl-as-the-connection): curl
/// connects it, the transport writes a request's head and body and reads the response, then the connection goes
/// idle in the pool for the next request to the same endpoint, or is closed. Pure: `HTTP1Connections` performs the
/// actions and reports what the socket and `HTTP1ResponseReader` found as events.
///
/// Writing and reading overlap: an upstream may answer before the request body is sent (a 413 to an upload). Such
/// a connection is closed after the response, since the rest of the request would be read as the next one.
struct HTTP1ConnectionMachine: Equatable {
    enum Phase: Equatable {
        /// curl resolves, connects and does TLS.
        case connecting
        case writingHead
        case writingBody
        /// The request is written; no final head yet.
        case awaitingHead
        /// The final head arrived and the request is written.
        case readingBody
        /// The response is complete; the transfer has not let go of the connection yet. `reusable`: it goes idle then.
        case done(reusable: Bool)
        /// In the pool, waiting for the next request.
        case idle
        /// Broken (the transfer was told why); closed when the transfer lets go.
        case failed
        /// Closed.
        case dead
    }

    enum Event: Equatable {
        case connected
        case connectFailed(TransportFailure)
        /// The head went out; `bodyFollows`: a body is to be written after it.
        case headWritten(bodyFollows: Bool)
        case bodyWritten
        /// Bytes of a response arrived (the first ones decide whether a failure may be resent).
        case responseBytes
        case headArrived
        case responseEnded(reusable: Bool)
        /// The response could not be read as sent (`HTTP1ResponseReader.Event.invalid`).
        case responseInvalid(String)
        /// The connection ended before the response did.
        case responseTruncated(String)
        case sendFailed(String)
        case receiveFailed(String)
        /// The client's request body stream broke.
        case requestBodyFailed
        /// The transfer let go of the connection (it ended, was cancelled or timed out).
        case detached
        /// epoll reported the idle connection readable: the upstream closed it (or sent what nobody asked for).
        case readableWhileIdle
    }

    enum Action: Equatable {
        case none
        case writeRequest
        /// Report the transfer's completion (`TransferTable.completed`).
        case complete(TransferCompletion)
        /// Put the connection in the idle pool.
        case park
        case close
    }

    private(set) var phase = Phase.connecting
    /// The connection served an earlier request (the stale-connection rule applies to this one).
    private(set) var reused = false
    /// The current request may be sent once more on a new connection (it may be repeated and its body rewinds).
    private var mayResend: Bool
    private var headArrived = false
    private var responseStarted = false
    private var requestWritten = false

    /// A request is being written or its response read: the socket's bytes are this request's.
    var isExchanging: Bool {
        switch phase {
        case .writingHead, .writingBody, .awaitingHead, .readingBody: true
        case .connecting, .done, .idle, .failed, .dead: false
        }
    }

    /// A new connection, for a request that `mayResend` (see `reuse`).
    init(mayResend: Bool) { self.mayResend = mayResend }

    /// An idle connection takes the next request: write it.
    mutating func reuse(mayResend: Bool) -> Action {
        precondition(phase == .idle, "reuse while \(phase)")
        self.mayResend = mayResend
        reused = true
        headArrived = false
        responseStarted = false
        requestWritten = false
        phase = .writingHead
        return .writeRequest
    }

    mutating func handle(_ event: Event) -> Action {
        switch (phase, event) {
        case (.connecting, .connected):
            phase = .writingHead
            return .writeRequest
        case (.connecting, .connectFailed(let failure)):
            phase = .failed
            return .complete(.failed(failure, resendable: false))
        case (.writingHead, .headWritten(let bodyFollows)):
            if bodyFollows {
                phase = .writingBody
            } else {
                requestWritten = true
                phase = headArrived ? .readingBody : .awaitingHead
            }
            return .none
        case (.writingBody, .bodyWritten):
            requestWritten = true
            phase = headArrived ? .readingBody : .awaitingHead
            return .none
        case (.writingHead, .responseBytes), (.writingBody, .responseBytes), (.awaitingHead, .responseBytes),
            (.readingBody, .responseBytes):
            responseStarted = true
            return .none
        case (.writingHead, .headArrived), (.writingBody, .headArrived):
            responseStarted = true
            headArrived = true
            return .none
        case (.awaitingHead, .headArrived):
            responseStarted = true
            headArrived = true
            phase = .readingBody
            return .none
        case (.writingHead, .responseEnded(let reusable)), (.writingBody, .responseEnded(let reusable)),
            (.awaitingHead, .responseEnded(let reusable)), (.readingBody, .responseEnded(let reusable)):
            // Answered before the whole request went out: the rest of it would be read as the next request.
            phase = .done(reusable: reusable && requestWritten)
            return .complete(.succeeded(headDelivered: true))
        case (.writingHead, .responseInvalid(let why)), (.writingBody, .responseInvalid(let why)),
            (.awaitingHead, .responseInvalid(let why)), (.readingBody, .responseInvalid(let why)):
            phase = .failed
            // Before the head reached the requester it is refused as a whole; after, the body broke off.
            let failure: TransportFailure = headArrived ? .reset(detail: why) : .badResponse(detail: why)
            return .complete(.failed(failure, resendable: false))
        case (.writingHead, .responseTruncated(let why)), (.writingBody, .responseTruncated(let why)),
            (.awaitingHead, .responseTruncated(let why)), (.readingBody, .responseTruncated(let why)),
            (.writingHead, .receiveFailed(let why)), (.writingBody, .receiveFailed(let why)),
            (.awaitingHead, .receiveFailed(let why)), (.readingBody, .receiveFailed(let why)):
            return broke(why, sending: false)
        case (.writingHead, .sendFailed(let why)), (.writingBody, .sendFailed(let why)),
            (.awaitingHead, .sendFailed(let why)), (.readingBody, .sendFailed(let why)):
            return broke(why, sending: true)
        case (.writingHead, .requestBodyFailed), (.writingBody, .requestBodyFailed):
            phase = .failed
            return .complete(.failed(.requestBodyFailed, resendable: false))
        case (.done(let reusable), .detached):
            phase = reusable ? .idle : .dead
            return reusable ? .park : .close
        case (.connecting, .detached), (.writingHead, .detached), (.writingBody, .detached),
            (.awaitingHead, .detached), (.readingBody, .detached), (.failed, .detached):
            // Mid-exchange (cancelled, timed out) or broken: nothing else can use it.
            phase = .dead
            return .close
        case (.idle, .readableWhileIdle):
            phase = .dead
            return .close
        default:
            // What no longer matters where the connection stands (bytes after a broken response, a second
            // failure, an event for a connection already given up).
            return .none
        }
    }

    /// The connection broke while the request was in flight: the keep-alive race when it was reused and nothing
    /// of a response came back (`StaleConnection`), else the upstream's answer.
    private mutating func broke(_ why: String, sending: Bool) -> Action {
        phase = .failed
        let resendable =
            mayResend
            && StaleConnection.shouldResend(
                failedSending: sending, failedReceiving: !sending, connectionWasReused: reused,
                responseBytes: responseStarted ? 1 : 0, alreadyResent: false)
        return .complete(.failed(.reset(detail: why), resendable: resendable))
    }
}
