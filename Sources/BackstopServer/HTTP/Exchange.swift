import BackstopCore
import BackstopTransport
import Logging
import NIOCore
import NIOHTTP1

/// One client request from routing to the last byte of its response: owns the attempt loop, the request body
/// (buffered for replay, or streamed once), the per-try and total timers, and the relay of the response.
///
/// Confined to the connection's event loop. Decisions about retrying come from the pure `AttemptDecider`;
/// this type only performs them.
final class Exchange {
    enum Destination {
        case upstream(UpstreamRuntime, path: String)
        case passthrough(url: String)
    }

    private enum Body {
        case none
        case buffering(ByteBuffer)
        case buffered(ByteBuffer)
        case streaming(RequestBodyStream)
    }

    private enum Phase {
        case waitingForBody
        case attempting
        case backingOff
        case relayingResponse
        case done
    }

    private let runtime: ProxyRuntime
    private let snapshot: ConfigSnapshot
    private let head: HTTPRequestHead
    private let framing: RequestFraming
    private let destination: Destination
    private let eventLoop: EventLoop
    private let handler: ProxyHandler
    private let limits: Limits
    private let timeouts: Timeouts

    private var body: Body = .none
    private var receivedBytes = 0
    private var requestComplete = false
    private var phase: Phase = .waitingForBody
    private var attempts = 0
    /// Identifies the current attempt so events of a cancelled one are ignored.
    private var attemptToken = 0
    private var transfer: CurlTransfer?
    private var perTryTimer: Scheduled<Void>?
    private var totalTimer: Scheduled<Void>?
    private var backoffTimer: Scheduled<Void>?
    private let startedAt = NIODeadline.now()
    private var responseStatus = 0
    private var responseBytes = 0

    init(
        runtime: ProxyRuntime, snapshot: ConfigSnapshot, head: HTTPRequestHead, framing: RequestFraming,
        destination: Destination, eventLoop: EventLoop, handler: ProxyHandler
    ) {
        self.runtime = runtime
        self.snapshot = snapshot
        self.head = head
        self.framing = framing
        self.destination = destination
        self.eventLoop = eventLoop
        self.handler = handler
        self.limits = snapshot.config.limits
        switch destination {
        case .upstream(let upstream, _): self.timeouts = upstream.config.timeouts
        case .passthrough: self.timeouts = Timeouts()
        }
    }

    private var upstreamName: String {
        switch destination {
        case .upstream(let upstream, _): upstream.config.name
        case .passthrough: "-"
        }
    }

    // MARK: input from the handler

    func start() {
        runtime.requestStarted()
        let total = timeouts.total
        totalTimer = eventLoop.assumeIsolated().scheduleTask(in: .init(total)) { [self] in totalDeadlinePassed() }
        if !framing.hasBody {
            body = .none
        } else if let length = framing.contentLength, length > limits.retryBuffer {
            beginStreamingBody(initial: nil)
        } else {
            body = .buffering(ByteBuffer())
        }
    }

    func receiveBody(_ chunk: ByteBuffer) {
        guard phase != .done else { return }
        receivedBytes += chunk.readableBytes
        if receivedBytes > limits.maxRequestBody {
            failLocally(.bodyTooLarge)
            return
        }
        switch body {
        case .none, .buffered:
            return
        case .buffering(var buffer):
            var chunk = chunk
            buffer.writeBuffer(&chunk)
            if buffer.readableBytes > limits.retryBuffer {
                beginStreamingBody(initial: buffer)
            } else {
                body = .buffering(buffer)
            }
        case .streaming(let stream):
            if !stream.append(chunk) { handler.holdReads() }
        }
    }

    func receiveEnd() {
        guard phase != .done else { return }
        requestComplete = true
        switch body {
        case .none:
            startAttempt()
        case .buffering(let buffer):
            body = .buffered(buffer)
            startAttempt()
        case .buffered:
            break
        case .streaming(let stream):
            stream.finish()
        }
    }

    /// The client disconnected: cancel everything, including pending retries.
    func clientGone() {
        guard phase != .done else { return }
        if case .streaming(let stream) = body { stream.fail() }
        finish(status: 499, note: "client-closed")
    }

    // MARK: attempts

    private func beginStreamingBody(initial: ByteBuffer?) {
        let loop = NIOLoopBound(handler, eventLoop: eventLoop)
        let eventLoop = self.eventLoop
        let stream = RequestBodyStream(expectedLength: framing.contentLength) {
            eventLoop.execute { loop.value.releaseReads() }
        }
        if let initial, !stream.append(initial) { handler.holdReads() }
        body = .streaming(stream)
        startAttempt()
    }

    private func startAttempt() {
        guard phase == .waitingForBody || phase == .backingOff else { return }
        phase = .attempting
        attempts += 1
        attemptToken += 1
        let token = attemptToken

        let request = makeTransportRequest()
        let bound = NIOLoopBound(self, eventLoop: eventLoop)
        transfer = runtime.transport.start(request, on: eventLoop) { events in
            bound.value.handle(events, token: token)
        }
        perTryTimer = eventLoop.assumeIsolated().scheduleTask(in: .init(timeouts.perTry)) { [self] in
            perTryDeadlinePassed(token: token)
        }
    }

    private func makeTransportRequest() -> TransportRequest {
        var pairs: [(name: String, value: String)] = []
        pairs.reserveCapacity(head.headers.count)
        for (name, value) in head.headers { pairs.append((name: name, value: value)) }
        let url: String
        let hostHeader: String
        var tls = TransportTLSOptions()
        var connectTimeout = timeouts.connect
        switch destination {
        case .upstream(let upstream, let path):
            url = upstream.config.url.origin + path
            hostHeader = upstream.config.url.hostHeader
            tls = upstream.tls
            connectTimeout = upstream.config.timeouts.connect
        case .passthrough(let passthroughURL):
            url = passthroughURL
            hostHeader = Self.authority(of: passthroughURL) ?? head.headers.first(name: "host") ?? ""
        }
        let headers = HeaderRewriter.upstreamRequestHeaders(pairs, upstreamHost: hostHeader)
        let transportBody: TransportRequestBody
        switch body {
        case .none: transportBody = .empty
        case .buffering(let buffer), .buffered(let buffer):
            transportBody = buffer.readableBytes == 0 && !framing.hasBody ? .empty : .buffered(buffer)
        case .streaming(let stream): transportBody = .streaming(stream)
        }
        return TransportRequest(
            url: url, method: head.method.rawValue, headers: headers, body: transportBody,
            connectTimeout: connectTimeout, tls: tls)
    }

    private static func authority(of url: String) -> String? {
        guard let schemeEnd = url.range(of: "://") else { return nil }
        let rest = url[schemeEnd.upperBound...]
        let end = rest.firstIndex { $0 == "/" || $0 == "?" } ?? rest.endIndex
        return String(rest[..<end])
    }

    private func handle(_ events: [TransportEvent], token: Int) {
        guard token == attemptToken, phase == .attempting || phase == .relayingResponse else { return }
        for event in events {
            guard phase != .done else { return }
            switch event {
            case .head(let responseHead):
                perTryTimer?.cancel()
                perTryTimer = nil
                deliverHead(responseHead)
            case .body(let buffer):
                guard phase == .relayingResponse, let transfer else { continue }
                let count = buffer.readableBytes
                responseBytes += count
                handler.writeResponseBody(buffer) { transfer.consumed(count) }
            case .end:
                completeResponse()
            case .failure(let failure):
                attemptFailed(failure)
            }
        }
    }

    private func deliverHead(_ upstreamHead: TransportResponseHead) {
        phase = .relayingResponse
        totalTimer?.cancel()
        totalTimer = nil
        responseStatus = upstreamHead.status
        let (headers, contentLength) = HeaderRewriter.clientResponseHeaders(
            upstreamHead.headers, attempts: attempts, upstreamVersion: upstreamHead.httpVersion)
        var httpHeaders = HTTPHeaders(headers.map { ($0.name, $0.value) })
        let bodyless = head.method == .HEAD || upstreamHead.status == 204 || upstreamHead.status == 304
            || (100..<200).contains(upstreamHead.status)
        if let contentLength {
            httpHeaders.add(name: "Content-Length", value: String(contentLength))
        } else if !bodyless && head.version.minor == 0 {
            // An HTTP/1.0 client cannot take chunked framing: delimit by closing.
            httpHeaders.replaceOrAdd(name: "Connection", value: "close")
        }
        let responseHead = HTTPResponseHead(
            version: head.version, status: HTTPResponseStatus(statusCode: upstreamHead.status), headers: httpHeaders)
        handler.writeResponseHead(responseHead)
        if bodyless || contentLength == 0 { handler.flush() }
    }

    private func completeResponse() {
        let complete = requestComplete
        if case .streaming(let stream) = body, !complete { stream.fail() }
        finish(status: responseStatus, note: nil)
        handler.writeResponseEnd(requestComplete: complete)
    }

    private func attemptFailed(_ failure: TransportFailure) {
        if phase == .relayingResponse {
            finish(status: responseStatus, note: "upstream-broke-mid-response")
            handler.abortResponse()
            return
        }
        perTryTimer?.cancel()
        perTryTimer = nil
        switch failure {
        case .timeout: failLocally(.upstreamTimeout)
        case .cancelled: failLocally(.upstreamUnreachable)
        case .requestBodyFailed: failLocally(.badRequest)
        case .connectFailure, .reset: failLocally(.upstreamUnreachable)
        }
    }

    private func perTryDeadlinePassed(token: Int) {
        guard token == attemptToken, phase == .attempting else { return }
        transfer?.cancel()
        attemptToken += 1
        attemptFailed(.timeout(detail: "per_try timeout"))
    }

    private func totalDeadlinePassed() {
        guard phase == .attempting || phase == .backingOff || phase == .waitingForBody else { return }
        transfer?.cancel()
        attemptToken += 1
        failLocally(.upstreamTimeout)
    }

    /// Answers with a Backstop error (only possible before a response head went out).
    private func failLocally(_ reason: ProxyErrorReason) {
        guard phase != .done else { return }
        if phase == .relayingResponse {
            finish(status: responseStatus, note: reason.rawValue)
            handler.abortResponse()
            return
        }
        transfer?.cancel()
        if case .streaming(let stream) = body, !requestComplete { stream.fail() }
        let complete = requestComplete
        finish(status: reason.status, note: reason.rawValue)
        handler.exchangeFailed(reason, version: head.version, requestComplete: complete)
    }

    private func finish(status: Int, note: String?) {
        guard phase != .done else { return }
        phase = .done
        perTryTimer?.cancel()
        totalTimer?.cancel()
        backoffTimer?.cancel()
        if status == 499 { transfer?.cancel() }
        transfer = nil
        runtime.requestFinished()
        if snapshot.config.log.accessLog {
            let elapsed = NIODeadline.now() - startedAt
            var metadata: Logger.Metadata = [
                "upstream": .string(upstreamName),
                "method": .string(head.method.rawValue),
                "path": .string(Self.pathWithoutQuery(head.uri)),
                "status": .stringConvertible(status),
                "attempts": .stringConvertible(attempts),
                "ms": .string(Self.milliseconds(elapsed)),
                "bytes": .stringConvertible(responseBytes),
            ]
            if let note { metadata["error"] = .string(note) }
            runtime.logger.info("request", metadata: metadata)
        }
    }

    private static func milliseconds(_ amount: TimeAmount) -> String {
        let tenths = amount.nanoseconds / 100_000
        return "\(tenths / 10).\(tenths % 10)"
    }

    private static func pathWithoutQuery(_ uri: String) -> String {
        if let q = uri.firstIndex(of: "?") { return String(uri[..<q]) }
        return uri
    }
}

extension TimeAmount {
    init(_ duration: Duration) {
        let (seconds, attoseconds) = duration.components
        let nanos = seconds.multipliedReportingOverflow(by: 1_000_000_000)
        self = nanos.overflow ? .nanoseconds(.max) : .nanoseconds(nanos.partialValue + attoseconds / 1_000_000_000)
    }
}
