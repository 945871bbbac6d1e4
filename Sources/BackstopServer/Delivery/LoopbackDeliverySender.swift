import BackstopCore
import BackstopQueue
import NIOCore
import NIOHTTP1
import NIOPosix

#if canImport(Glibc)
import Glibc
#endif

/// Sends a queued delivery through the daemon's own request path (docs/reference/behaviour.md#queued-delivery):
/// one end of a private socket pair is served by a proxy pipeline like an accepted client connection (marked as
/// the deliverer's: no `clients` check, no queueing, `delivery=` in its access line), and this sender writes the
/// stored request into the other end and reads the answer. So a delivery gets exactly what a client's request gets
/// — routing, `auth` with its refresh on `401`, the `retry` policy and budget, endpoints and circuits, spans,
/// metrics — from the one implementation of each, with no listener involved and nothing reachable from outside.
public struct LoopbackDeliverySender: DeliverySending {
    /// Serves the proxy's end of a new socket pair (takes ownership of the descriptor, closing it on failure).
    public typealias ServeProxyEnd = @Sendable (NIOBSDSocket.Handle) async throws -> Void

    /// The request header that names the delivery on the private connection (never forwarded).
    public static let deliveryHeader = "X-Backstop-Delivery"

    private let group: any EventLoopGroup
    private let serveProxyEnd: ServeProxyEnd

    public init(group: any EventLoopGroup, serveProxyEnd: @escaping ServeProxyEnd) {
        self.group = group
        self.serveProxyEnd = serveProxyEnd
    }

    public func send(_ delivery: ClaimedDelivery, settings: DeliveryLaneSettings) async -> DeliveryResult {
        var pair: [CInt] = [-1, -1]
        guard socketpair(AF_UNIX, CInt(SOCK_STREAM.rawValue | SOCK_CLOEXEC.rawValue), 0, &pair) == 0 else {
            return .noResponse("local-socket-failed")
        }
        do {
            try await serveProxyEnd(pair[0])
        } catch {
            close(pair[1])
            return .noResponse("local-socket-failed")
        }
        let channel: NIOAsyncChannel<HTTPClientResponsePart, HTTPClientRequestPart>
        do {
            channel = try await ClientBootstrap(group: group).withConnectedSocket(pair[1]) { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHTTPClientHandlers()
                    return try NIOAsyncChannel<HTTPClientResponsePart, HTTPClientRequestPart>(
                        wrappingChannelSynchronously: channel)
                }
            }
        } catch {
            return .noResponse("local-socket-failed")
        }
        let request = Self.requestParts(delivery, idempotencyHeader: settings.idempotencyHeader)
        // The exchange ends itself within the upstream's `timeouts.total`; the limit only guards against a
        // connection that never answers. Running out of it closes the connection, which ends the exchange.
        return await withTaskGroup(of: DeliveryResult?.self) { group in
            group.addTask {
                do {
                    return try await channel.executeThenClose { inbound, outbound in
                        try await outbound.write(.head(request.head))
                        if !request.body.isEmpty {
                            try await outbound.write(.body(.byteBuffer(ByteBuffer(bytes: request.body))))
                        }
                        try await outbound.write(.end(nil))
                        return try await Self.readAnswer(inbound)
                    }
                } catch {
                    return .noResponse("no-answer")
                }
            }
            group.addTask {
                try? await Task.sleep(for: settings.exchangeLimit)
                return nil
            }
            let first = await group.next() ?? nil
            group.cancelAll()
            return first ?? .noResponse("timeout")
        }
    }

    /// Headers the deliverer never replays: hop-by-hop ones, those about a body that is now stored whole, and the
    /// client's proxy credentials.
    static let droppedHeaders: Set<String> = [
        "connection", "keep-alive", "proxy-connection", "proxy-authorization", "te", "trailer", "transfer-encoding",
        "upgrade", "content-length", "expect", deliveryHeader.lowercased(),
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
        let body = delivery.request.body
        if !body.isEmpty || HTTPMethod(rawValue: delivery.request.method).expectsRequestBody {
            headers.add(name: "Content-Length", value: String(body.count))
        }
        let head = HTTPRequestHead(
            version: .http1_1, method: HTTPMethod(rawValue: delivery.request.method), uri: delivery.request.target,
            headers: headers)
        return (head, body)
    }

    /// Reads the answer to the end (its body is discarded): the upstream's status and hints, or — when Backstop
    /// answered itself with a `5xx` (`X-Backstop-Error`: unreachable, timed out, budget spent, token unavailable,
    /// circuit open) — no answer, labelled with the reason.
    static func readAnswer(
        _ inbound: NIOAsyncChannelInboundStream<HTTPClientResponsePart>
    ) async throws
        -> DeliveryResult
    {
        var result = DeliveryResult.noResponse("no-answer")
        var sawHead = false
        for try await part in inbound {
            switch part {
            case .head(let head):
                // An interim 1xx is not the answer.
                if head.status.code < 200 { continue }
                sawHead = true
                let code = Int(head.status.code)
                if let reason = head.headers.first(name: "x-backstop-error"), code >= 500 {
                    result = .noResponse(reason)
                } else {
                    result = .response(
                        status: code, retryAfter: head.headers.first(name: "retry-after"),
                        rateLimitReset: head.headers.first(name: "x-ratelimit-reset"))
                }
            case .body:
                break
            case .end:
                if sawHead { return result }
            }
        }
        // The connection closed before the answer ended: what came is not a whole answer.
        return .noResponse("no-answer")
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
