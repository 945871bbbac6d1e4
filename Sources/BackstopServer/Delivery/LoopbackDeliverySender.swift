import BackstopCore
import BackstopQueue
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import NIOPosix
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Sends a queued delivery through the daemon's own request path (docs/reference/behaviour.md#queued-delivery):
/// one end of a private socket pair is served by a proxy pipeline like an accepted client connection (marked as
/// the deliverer's: no `clients` check, no queueing, `delivery=` in its access line), and this sender writes the
/// stored request into the other end and reads the answer. So a delivery gets exactly what a client's request gets
/// — routing, `auth` with its refresh on `401`, the `retry` policy and budget, endpoints and circuits, spans,
/// metrics — from the one implementation of each, with no listener involved and nothing reachable from outside.
///
/// A connection is kept alive for the lane's next delivery (docs/performance.md#queued-delivery): a socket pair and
/// two pipelines per delivery cost more than the delivery itself. Each lane keeps at most as many idle connections as
/// it had deliveries in flight; one is closed after `DeliveryLaneSettings.connectionIdle` unused, when an exchange
/// times out or fails, and when the proxy's answer says the connection ends.
public final class LoopbackDeliverySender: DeliverySending {
    /// Serves the proxy's end of a new socket pair (takes ownership of the descriptor, closing it on failure).
    public typealias ServeProxyEnd = @Sendable (NIOBSDSocket.Handle) async throws -> Void

    /// The request header that names the delivery on the private connection (never forwarded).
    public static let deliveryHeader = "X-Backstop-Delivery"
    /// The request header that names the upstream the delivery was accepted for (never forwarded): the request is
    /// sent there or nowhere, whatever its `Host` now routes to.
    public static let upstreamHeader = "X-Backstop-Delivery-Upstream"

    private let group: any EventLoopGroup
    private let serveProxyEnd: ServeProxyEnd
    /// Idle kept-alive connections by upstream; one in use is in no list.
    private let idle = NIOLockedValueBox<[String: [DeliveryConnection]]>([:])
    private let opened = Atomic<Int>(0)

    public init(group: any EventLoopGroup, serveProxyEnd: @escaping ServeProxyEnd) {
        self.group = group
        self.serveProxyEnd = serveProxyEnd
    }

    /// How many private connections this sender has opened (each served by one call of `serveProxyEnd`).
    var connectionsOpened: Int { opened.load(ordering: .relaxed) }

    public func send(_ delivery: ClaimedDelivery, settings: DeliveryLaneSettings) async -> DeliveryResult {
        let request = Self.requestParts(delivery, idempotencyHeader: settings.idempotencyHeader)
        // A kept connection the proxy closed meanwhile takes nothing of the request: the next one (at most a fresh
        // one) is tried then. Once any of it was written, its outcome is the try's, whatever it is.
        while true {
            let connection: DeliveryConnection
            if let kept = takeIdle(upstream: delivery.upstream) {
                connection = kept
            } else {
                switch await connect() {
                case .success(let fresh): connection = fresh
                case .failure: return .noResponse("local-socket-failed")
                }
            }
            let answer = await connection.exchange(
                request, limit: settings.exchangeLimit, idle: settings.connectionIdle)
            guard answer.written else {
                if answer.fresh || Task.isCancelled { return answer.result }
                continue
            }
            if answer.reusable && !Task.isCancelled {
                idle.withLockedValue { $0[delivery.upstream, default: []].append(connection) }
            }
            return answer.result
        }
    }

    /// The most recently used idle connection of `upstream` still open (the others closed are dropped).
    private func takeIdle(upstream: String) -> DeliveryConnection? {
        idle.withLockedValue { idle in
            while let connection = idle[upstream]?.popLast() {
                if connection.channel.isActive { return connection }
            }
            return nil
        }
    }

    private func connect() async -> Result<DeliveryConnection, any Error> {
        var pair: [CInt] = [-1, -1]
        guard socketpair(AF_UNIX, CInt(SOCK_STREAM.rawValue | SOCK_CLOEXEC.rawValue), 0, &pair) == 0 else {
            return .failure(IOError(errnoCode: errno, reason: "socketpair"))
        }
        do {
            try await serveProxyEnd(pair[0])
        } catch {
            close(pair[1])
            return .failure(error)
        }
        opened.add(1, ordering: .relaxed)
        do {
            // `withConnectedSocket` owns the descriptor from here, closing it on failure.
            let channel = try await ClientBootstrap(group: group).channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHTTPClientHandlers()
                    try channel.pipeline.syncOperations.addHandler(DeliveryAnswerHandler())
                }
            }.withConnectedSocket(pair[1]).get()
            return .success(DeliveryConnection(channel: channel))
        } catch {
            return .failure(error)
        }
    }

    /// Headers the deliverer never replays: hop-by-hop ones, those about a body that is now stored whole, and the
    /// client's proxy credentials.
    static let droppedHeaders: Set<String> = [
        "connection", "keep-alive", "proxy-connection", "proxy-authorization", "te", "trailer", "transfer-encoding",
        "upgrade", "content-length", "expect", deliveryHeader.lowercased(), upstreamHeader.lowercased(),
    ]

    /// The request the deliverer writes for `delivery`: the client's method, target and headers (minus
    /// `droppedHeaders`), the idempotency key, the delivery id, and the body framed by `Content-Length`.
    static func requestParts(
        _ delivery: ClaimedDelivery, idempotencyHeader: String
    ) -> (head: HTTPRequestHead, body: [UInt8]) {
        var headers = HTTPHeaders()
        for header in delivery.request.headersForDelivery(id: delivery.id, headerName: idempotencyHeader)
        where !droppedHeaders.contains(header.name.lowercased()) {
            headers.add(name: header.name, value: header.value)
        }
        headers.add(name: deliveryHeader, value: delivery.id.text)
        headers.add(name: upstreamHeader, value: delivery.upstream)
        let body = delivery.request.body
        if !body.isEmpty || HTTPMethod(rawValue: delivery.request.method).expectsRequestBody {
            headers.add(name: "Content-Length", value: String(body.count))
        }
        let head = HTTPRequestHead(
            version: .http1_1, method: HTTPMethod(rawValue: delivery.request.method), uri: delivery.request.target,
            headers: headers)
        return (head, body)
    }
}

/// One of the deliverer's private connections: its client end, which carries one exchange at a time.
final class DeliveryConnection: Sendable {
    let channel: any Channel
    /// False until the first exchange ended: a fresh connection that takes nothing is not replaced by another.
    private let used = Atomic<Bool>(false)

    init(channel: any Channel) { self.channel = channel }

    /// Writes `request` and reads its answer; within `limit` (else the connection is closed, which ends the
    /// exchange). Cancelling the calling task closes the connection too. A connection that stays open is closed
    /// after `idle` unless another exchange starts first.
    func exchange(
        _ request: (head: HTTPRequestHead, body: [UInt8]), limit: Duration, idle: Duration
    ) async -> DeliveryAnswerHandler.Answer {
        let fresh = !used.exchange(true, ordering: .relaxed)
        let channel = self.channel
        let promise = channel.eventLoop.makePromise(of: DeliveryAnswerHandler.Answer.self)
        channel.eventLoop.execute {
            do {
                let handler = try channel.pipeline.syncOperations.handler(type: DeliveryAnswerHandler.self)
                handler.start(request, limit: limit, idle: idle, fresh: fresh, promise: promise)
            } catch {
                promise.succeed(.init(result: .noResponse("no-answer"), written: false, reusable: false, fresh: fresh))
            }
        }
        return await withTaskCancellationHandler {
            (try? await promise.futureResult.get())
                ?? .init(result: .noResponse("no-answer"), written: false, reusable: false, fresh: fresh)
        } onCancel: {
            channel.close(promise: nil)
        }
    }
}

/// Writes one delivery's request at a time and reads its answer (the body is discarded): the upstream's status and
/// hints, or — when Backstop answered itself with a `5xx` (`X-Backstop-Error`: unreachable, timed out, budget spent,
/// token unavailable, circuit open) — no answer, labelled with the reason. Runs on its channel's event loop.
final class DeliveryAnswerHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPClientResponsePart
    typealias OutboundOut = HTTPClientRequestPart

    /// How one exchange ended. `written`: some of the request left (its outcome is the try's); `reusable`: the
    /// connection stays open for the next.
    struct Answer: Sendable {
        var result: DeliveryResult
        var written: Bool
        var reusable: Bool
        var fresh: Bool
    }

    private var context: ChannelHandlerContext?
    private var pending: EventLoopPromise<Answer>?
    private var fresh = false
    private var written = false
    private var timedOut = false
    private var result = DeliveryResult.noResponse("no-answer")
    private var sawHead = false
    private var keepAlive = false
    private var idle: Duration = .zero
    private var limitTimer: Scheduled<Void>?
    private var idleTimer: Scheduled<Void>?

    func handlerAdded(context: ChannelHandlerContext) { self.context = context }

    func handlerRemoved(context: ChannelHandlerContext) {
        finish(reusable: false)
        self.context = nil
    }

    func start(
        _ request: (head: HTTPRequestHead, body: [UInt8]), limit: Duration, idle: Duration, fresh: Bool,
        promise: EventLoopPromise<Answer>
    ) {
        idleTimer?.cancel()
        idleTimer = nil
        guard let context, context.channel.isActive, pending == nil else {
            promise.succeed(Answer(result: .noResponse("no-answer"), written: false, reusable: false, fresh: fresh))
            return
        }
        pending = promise
        self.fresh = fresh
        self.idle = idle
        written = false
        timedOut = false
        sawHead = false
        keepAlive = false
        result = .noResponse("no-answer")
        // The exchange ends itself within the upstream's `timeouts.total`; the limit only guards against a
        // connection that never answers. Running out of it closes the connection, which ends the exchange.
        let loop = context.eventLoop.assumeIsolated()
        limitTimer = loop.scheduleTask(in: TimeAmount(limit)) { [self] in
            timedOut = true
            self.context?.close(promise: nil)
        }
        let headWritten = context.eventLoop.makePromise(of: Void.self)
        headWritten.futureResult.assumeIsolated().whenSuccess { [self] _ in written = true }
        context.write(wrapOutboundOut(.head(request.head)), promise: headWritten)
        if !request.body.isEmpty {
            context.write(
                wrapOutboundOut(.body(.byteBuffer(context.channel.allocator.buffer(bytes: request.body)))), promise: nil
            )
        }
        context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard pending != nil else { return }
        switch unwrapInboundIn(data) {
        case .head(let head):
            // An interim 1xx is not the answer.
            if head.status.code < 200 { return }
            sawHead = true
            keepAlive = head.isKeepAlive
            let code = Int(head.status.code)
            if let reason = head.headers.first(name: "x-backstop-error"), code >= 500 {
                // An answer that cannot be relayed (a `101` nobody asked for, conflicting framing) on every attempt
                // is the upstream's way of answering this request: sent again, it would be answered the same.
                if reason == ProxyErrorReason.badUpstreamResponse.rawValue {
                    result = .undeliverable(reason)
                } else if reason == ProxyErrorReason.circuitOpen.rawValue,
                    let seconds = head.headers.first(name: "retry-after").flatMap(Int.init), seconds >= 0
                {
                    result = .notSentNow(reason, retryAfter: Double(seconds))
                } else {
                    result = .noResponse(reason)
                }
            } else {
                result = .response(
                    status: code, retryAfter: head.headers.first(name: "retry-after"),
                    rateLimitReset: head.headers.first(name: "x-ratelimit-reset"))
            }
        case .body:
            break
        case .end:
            guard sawHead else { return }
            // Read to its end, the answer is whole: answered, even when the connection ends with it.
            written = true
            finish(reusable: keepAlive)
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        if pending != nil {
            if sawHead, case .response(let status, _, _) = result, (200..<300).contains(status) {
                // A `2xx` head is the upstream's acceptance, a delivery, whatever became of its body (one slower
                // than `timeouts.total`, cut by the proxy): sent again, it would be accepted again.
                written = true
            } else {
                // The connection closed before the answer ended: what came is not a whole answer.
                result = .noResponse(timedOut ? "timeout" : "no-answer")
            }
            finish(reusable: false)
        }
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        context.close(promise: nil)
    }

    private func finish(reusable: Bool) {
        limitTimer?.cancel()
        limitTimer = nil
        guard let promise = pending else { return }
        pending = nil
        let reusable = reusable && (context?.channel.isActive ?? false)
        // Taken before closing: the close runs `channelInactive` at once.
        let answer = Answer(result: result, written: written, reusable: reusable, fresh: fresh)
        if reusable, let context {
            let idle = self.idle
            idleTimer = context.eventLoop.assumeIsolated().scheduleTask(in: TimeAmount(idle)) { [weak self] in
                self?.context?.close(promise: nil)
            }
        } else {
            context?.close(promise: nil)
        }
        promise.succeed(answer)
    }
}

extension HTTPMethod {
    /// Methods whose requests normally carry a body: a queued one with an empty body still says `Content-Length: 0`.
    fileprivate var expectsRequestBody: Bool {
        switch self {
        case .POST, .PUT, .PATCH: true
        default: false
        }
    }
}
