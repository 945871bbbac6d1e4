import BackstopCore
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import NIOPosix
import Testing

@testable import BackstopQueue
@testable import BackstopServer

/// The deliverer's private connections (docs/reference/behaviour.md#queued-delivery), served here by a plain HTTP
/// server on the socket pair's other end in place of the proxy pipeline: a lane keeps its connection for the next
/// delivery, and one that broke, timed out or was answered `Connection: close` is replaced. Every send is bounded
/// by its lane's `exchangeLimit` (at most 5 s here); every other wait by `withTimeLimit`.
@Suite("Loopback delivery sender")
struct LoopbackDeliverySenderTests {
    /// How the fake proxy end answers a request.
    enum Mode: Sendable {
        case answer
        /// As the proxy answers a request to an upstream whose every endpoint is ejected.
        case circuitOpen
        case answerThenClose
        case silent
    }

    /// The other end of the deliverer's socket pairs: records each request's delivery headers and its connection.
    final class ProxyEnd: Sendable {
        struct Record {
            var mode = Mode.answer
            var connections: [any Channel] = []
            /// (connection index, Idempotency-Key, X-Backstop-Delivery) per request.
            var requests: [(Int, String?, String?)] = []
        }
        let record = NIOLockedValueBox(Record())
        let group = MultiThreadedEventLoopGroup.singleton

        var sender: LoopbackDeliverySender {
            LoopbackDeliverySender(group: group) { socket in
                _ = try await ClientBootstrap(group: self.group).channelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        let index = self.record.withLockedValue { record in
                            record.connections.append(channel)
                            return record.connections.count - 1
                        }
                        try channel.pipeline.syncOperations.configureHTTPServerPipeline()
                        try channel.pipeline.syncOperations.addHandler(Responder(end: self, connection: index))
                    }
                }.withConnectedSocket(socket).get()
            }
        }

        func set(_ mode: Mode) { record.withLockedValue { $0.mode = mode } }

        /// Closes every connection from this end, as a proxy that goes away would, and waits (at most 5 s) until
        /// they are closed.
        func closeAll() async throws {
            let connections = record.withLockedValue { $0.connections }
            let closed = await withTimeLimit(.seconds(5)) {
                for connection in connections { try? await connection.close() }
            }
            try #require(closed)
        }
    }

    final class Responder: ChannelInboundHandler {
        typealias InboundIn = HTTPServerRequestPart
        typealias OutboundOut = HTTPServerResponsePart
        let end: ProxyEnd
        let connection: Int

        init(end: ProxyEnd, connection: Int) {
            self.end = end
            self.connection = connection
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            switch unwrapInboundIn(data) {
            case .head(let head):
                end.record.withLockedValue {
                    $0.requests.append(
                        (
                            connection, head.headers.first(name: "Idempotency-Key"),
                            head.headers.first(name: LoopbackDeliverySender.deliveryHeader)
                        ))
                }
            case .body:
                break
            case .end:
                let mode = end.record.withLockedValue { $0.mode }
                guard mode != .silent else { return }
                var headers = HTTPHeaders([("Content-Length", "0")])
                if mode == .answerThenClose { headers.add(name: "Connection", value: "close") }
                var status = HTTPResponseStatus.noContent
                if mode == .circuitOpen {
                    status = .serviceUnavailable
                    headers.add(name: "X-Backstop-Error", value: "circuit-open")
                    headers.add(name: "Retry-After", value: "7")
                }
                context.write(
                    wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: status, headers: headers))),
                    promise: nil)
                context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
                if mode == .answerThenClose { context.close(promise: nil) }
            }
        }
    }

    static let settings = DeliveryLaneSettings(
        concurrency: 4, policy: DeliveryPolicy(maxAge: .seconds(60)), exchangeLimit: .seconds(5))
    static let delivered = DeliveryResult.response(status: 204, retryAfter: nil, rateLimitReset: nil)

    static func delivery(_ n: Int) -> ClaimedDelivery {
        ClaimedDelivery(
            id: DeliveryID(String(format: "5af14c38-9d4e-4f5b-b017-%012x", n))!, upstream: "events",
            request: QueuedRequest(method: "POST", target: "/hook", headers: [], body: Array("event \(n)".utf8)),
            attempts: 0, acceptedAt: 0, clockStart: 0, seq: n)
    }

    @Test("one lane slot sends delivery after delivery on one connection, each with its id as Idempotency-Key")
    func reusesConnection() async throws {
        let end = ProxyEnd()
        let sender = end.sender
        for n in 0..<50 {
            #expect(await sender.send(Self.delivery(n), settings: Self.settings) == Self.delivered)
        }
        #expect(sender.connectionsOpened == 1)
        let requests = end.record.withLockedValue { $0.requests }
        #expect(requests.count == 50)
        for (n, request) in requests.enumerated() {
            let id = Self.delivery(n).id.text
            #expect(request.0 == 0 && request.1 == id && request.2 == id)
        }
    }

    @Test("concurrent deliveries of a lane use at most one connection each, kept for the next ones")
    func concurrentSlots() async throws {
        let end = ProxyEnd()
        let sender = end.sender
        for round in 0..<10 {
            let results = await withTaskGroup(of: DeliveryResult.self) { group in
                for slot in 0..<4 {
                    group.addTask { await sender.send(Self.delivery(round * 4 + slot), settings: Self.settings) }
                }
                var results: [DeliveryResult] = []
                for await result in group { results.append(result) }
                return results
            }
            #expect(results == Array(repeating: Self.delivered, count: 4))
        }
        #expect((1...4).contains(sender.connectionsOpened))
        #expect(end.record.withLockedValue { $0.requests.count } == 40)
    }

    @Test("a connection the proxy closed is replaced; the delivery goes out once on the new one")
    func replacesBrokenConnection() async throws {
        let end = ProxyEnd()
        let sender = end.sender
        #expect(await sender.send(Self.delivery(1), settings: Self.settings) == Self.delivered)
        try await end.closeAll()
        #expect(await sender.send(Self.delivery(2), settings: Self.settings) == Self.delivered)
        #expect(sender.connectionsOpened == 2)
        let requests = end.record.withLockedValue { $0.requests.map { [String($0.0), $0.1 ?? "-"] } }
        #expect(requests == [["0", Self.delivery(1).id.text], ["1", Self.delivery(2).id.text]])
    }

    @Test("an answer with Connection: close ends the connection; the next delivery opens another")
    func closeAnswered() async throws {
        let end = ProxyEnd()
        end.set(.answerThenClose)
        let sender = end.sender
        #expect(await sender.send(Self.delivery(1), settings: Self.settings) == Self.delivered)
        end.set(.answer)
        #expect(await sender.send(Self.delivery(2), settings: Self.settings) == Self.delivered)
        #expect(await sender.send(Self.delivery(3), settings: Self.settings) == Self.delivered)
        #expect(sender.connectionsOpened == 2)
    }

    @Test("no answer within the exchange limit: timeout, the connection is closed, the next delivery opens another")
    func timeoutReplaces() async throws {
        let end = ProxyEnd()
        end.set(.silent)
        let sender = end.sender
        var settings = Self.settings
        settings.exchangeLimit = .milliseconds(200)
        let started = ContinuousClock.now
        #expect(await sender.send(Self.delivery(1), settings: settings) == .noResponse("timeout"))
        #expect(ContinuousClock.now - started < .seconds(4))
        end.set(.answer)
        #expect(await sender.send(Self.delivery(2), settings: Self.settings) == Self.delivered)
        #expect(sender.connectionsOpened == 2)
    }

    @Test(
        "Backstop's own circuit-open is not sent now, with the seconds until the next probe; another 5xx of its own is no answer"
    )
    func circuitOpen() async throws {
        let end = ProxyEnd()
        end.set(.circuitOpen)
        let sender = end.sender
        #expect(
            await sender.send(Self.delivery(1), settings: Self.settings)
                == .notSentNow("circuit-open", retryAfter: 7))
        end.set(.answer)
        #expect(await sender.send(Self.delivery(2), settings: Self.settings) == Self.delivered)
    }

    @Test("an idle connection is closed after the lane's connectionIdle; the next delivery opens another")
    func idleCloses() async throws {
        let end = ProxyEnd()
        let sender = end.sender
        var settings = Self.settings
        settings.connectionIdle = .milliseconds(50)
        #expect(await sender.send(Self.delivery(1), settings: settings) == Self.delivered)
        let proxySide = try #require(end.record.withLockedValue { $0.connections.first })
        let closed = await withTimeLimit(.seconds(5)) { try? await proxySide.closeFuture.get() }
        #expect(closed)
        #expect(await sender.send(Self.delivery(2), settings: settings) == Self.delivered)
        #expect(sender.connectionsOpened == 2)
    }
}
