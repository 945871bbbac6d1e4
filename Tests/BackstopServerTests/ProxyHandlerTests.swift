import BackstopCore
import BackstopTransport
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
import NIOHTTP1
import Testing

@testable import BackstopServer

/// `ProxyHandler` and `Exchange` in an `EmbeddedChannel` with a scripted transport and a manual clock: requests in,
/// bytes out, transfers started and answered by the test. No sockets, no threads, no sleeps.
@Suite("Proxy handler (embedded)")
struct ProxyHandlerTests {
    /// A transport that records each transfer and lets the test answer it. Like curl's, a transfer holds its event
    /// sink and the transport keeps no strong reference once it is started: when the exchange lets go of it, it
    /// is gone (a leak shows as a transfer still alive after its exchange ended).
    final class ScriptedTransport: TransferStarting, Sendable {
        struct Started {
            let request: TransportRequest
            weak var transfer: ScriptedTransfer?
            var handle: ScriptedTransfer { transfer! }
            var sink: @Sendable ([TransportEvent]) -> Void { transfer!.sink }
        }

        private let started = NIOLockedValueBox<[Started]>([])
        var transfers: [Started] { started.withLockedValue { $0 } }

        func start(
            _ request: TransportRequest, on eventLoop: EventLoop,
            sink: @escaping @Sendable ([TransportEvent]) -> Void
        ) -> any TransferHandle {
            let handle = ScriptedTransfer(sink: sink)
            started.withLockedValue { $0.append(Started(request: request, transfer: handle)) }
            return handle
        }
    }

    final class ScriptedTransfer: TransferHandle, Sendable {
        let sink: @Sendable ([TransportEvent]) -> Void
        private let state = NIOLockedValueBox((cancelled: false, consumed: 0, abandoned: nil as Duration?))
        init(sink: @escaping @Sendable ([TransportEvent]) -> Void) { self.sink = sink }
        var cancelled: Bool { state.withLockedValue { $0.cancelled } }
        var abandoned: Duration? { state.withLockedValue { $0.abandoned } }
        func cancel() { state.withLockedValue { $0.cancelled = true } }
        func consumed(_ bytes: Int) { state.withLockedValue { $0.consumed += bytes } }
        func abandon(within limit: Duration) { state.withLockedValue { $0.abandoned = limit } }
    }

    /// A channel with the request decoder and a proxy handler for `yaml`'s config.
    struct Harness {
        let channel: EmbeddedChannel
        let transport: ScriptedTransport
        let clock: ManualClock

        init(_ yaml: String) throws {
            let config = try ConfigLoader.parse(
                yaml: "version: 1\nlisten: [127.0.0.1:0]\n" + yaml, file: "t.yaml",
                baseDirectory: "/")
            let upstreams = config.upstreams.map { UpstreamRuntime(config: $0, auth: .none) }
            transport = ScriptedTransport()
            clock = ManualClock()
            let runtime = ProxyRuntime(
                snapshot: ConfigSnapshot(config: config, upstreams: upstreams), transport: transport,
                logger: Logger(label: "test") { _ in SwiftLogNoOpLogHandler() }, clock: clock)
            channel = EmbeddedChannel()
            let headTimer = HeadTimeoutHandler(timeout: config.limits.headerTimeout, now: clock.monotonic)
            try channel.pipeline.syncOperations.addHandler(headTimer)
            try channel.pipeline.syncOperations.addHandler(ByteToMessageHandler(HTTPRequestDecoder()))
            try channel.pipeline.syncOperations.addHandler(
                ProxyHandler(runtime: runtime, idleTimeout: config.limits.clientIdleTimeout, headTimer: headTimer))
            // Connecting makes the channel active, as an accepted one is.
            try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 40000)).wait()
        }

        func send(_ text: String) throws { try channel.writeInbound(ByteBuffer(string: text)) }

        /// Everything written to the client so far.
        func output() throws -> String {
            var text = ""
            while let buffer = try channel.readOutbound(as: ByteBuffer.self) { text += String(buffer: buffer) }
            return text
        }

        /// Answers transfer `index` with a complete response.
        func answer(_ index: Int, status: Int = 200, body: String = "ok", contentLength: Bool = true) {
            let started = transport.transfers[index]
            started.sink([
                .head(UpstreamResponseHead(status: status, contentLength: contentLength ? body.utf8.count : nil)),
                .body(ByteBuffer(string: body)), .end,
            ])
            channel.embeddedEventLoop.run()
        }

        /// Moves the manual clock and the event loop's time together.
        func advance(by amount: Duration) {
            clock.advance(by: amount)
            channel.embeddedEventLoop.advanceTime(by: .nanoseconds(amount.nanosecondsClamped))
        }
    }

    static let upstream = """
        upstreams:
          - name: app
            match: {hosts: [app.test]}
            url: http://origin.test:8000/base
            retry: {attempts: 2, backoff: {strategy: constant, base: 100ms, max: 1s, jitter: none}}
        limits: {client_idle_timeout: 30s}
        """

    @Test func aRequestIsForwardedAndItsResponseRelayedWithTheAttemptCount() throws {
        let h = try Harness(Self.upstream)
        try h.send(
            "GET http://app.test/x?y=1 HTTP/1.1\r\nHost: app.test\r\nConnection: keep-alive, X-Drop\r\nX-Drop: 1\r\n\r\n"
        )
        #expect(h.transport.transfers.count == 1)
        let request = h.transport.transfers[0].request
        #expect(request.url == "http://origin.test:8000/base/x?y=1")
        #expect(request.headers.first { $0.name == "Host" }?.value == "origin.test:8000")
        #expect(request.headers.contains { $0.name == "Via" && $0.value == "1.1 backstop" })
        #expect(!request.headers.contains { $0.name.lowercased() == "x-drop" || $0.name.lowercased() == "connection" })
        h.answer(0, body: "hello")
        let out = try h.output()
        #expect(out.hasPrefix("HTTP/1.1 200 OK\r\n"))
        #expect(out.contains("X-Backstop-Attempts: 1\r\n"))
        #expect(out.contains("Content-Length: 5\r\n"))
        #expect(out.hasSuffix("\r\n\r\nhello"))
        #expect(h.channel.isActive)
        // The finished exchange let go of its transfer (whose sink holds the exchange): nothing is left alive.
        #expect(h.transport.transfers[0].transfer == nil)
    }

    @Test func pipelinedRequestsAreAnsweredInOrder_theSecondStartsAfterTheFirstEnds() throws {
        let h = try Harness(Self.upstream)
        try h.send(
            "GET http://app.test/1 HTTP/1.1\r\nHost: app.test\r\n\r\nGET http://app.test/2 HTTP/1.1\r\nHost: app.test\r\n\r\n"
        )
        #expect(h.transport.transfers.count == 1, "one request at a time")
        h.answer(0, body: "first")
        #expect(h.transport.transfers.count == 2)
        #expect(h.transport.transfers[1].request.url.hasSuffix("/base/2"))
        h.answer(1, body: "second")
        let out = try h.output()
        let first = try #require(out.range(of: "first"))
        let second = try #require(out.range(of: "second"))
        #expect(first.lowerBound < second.lowerBound)
    }

    @Test func a503IsRetriedWhenTheTimerFires_theClientSeesOneResponse() throws {
        let h = try Harness(Self.upstream)
        try h.send("GET http://app.test/r HTTP/1.1\r\nHost: app.test\r\n\r\n")
        let first = h.transport.transfers[0].handle
        h.answer(0, status: 503, body: "busy")
        #expect(first.abandoned != nil, "a small retried response is left to finish")
        #expect(try h.output().isEmpty, "the retried response never reaches the client")
        h.advance(by: .milliseconds(99))
        #expect(h.transport.transfers.count == 1)
        h.advance(by: .milliseconds(1))
        #expect(h.transport.transfers.count == 2)
        h.answer(1, body: "done")
        let out = try h.output()
        #expect(out.contains("X-Backstop-Attempts: 2\r\n"))
        #expect(out.hasSuffix("done"))
    }

    @Test func noRouteIsAnsweredLocally_theConnectionStaysUsable() throws {
        let h = try Harness(Self.upstream)
        try h.send("GET http://other.test/ HTTP/1.1\r\nHost: other.test\r\n\r\n")
        let refused = try h.output()
        #expect(refused.hasPrefix("HTTP/1.1 403 Forbidden\r\n"))
        #expect(refused.contains("X-Backstop-Error: no-route\r\n"))
        #expect(h.transport.transfers.isEmpty)
        try h.send("GET http://app.test/ok HTTP/1.1\r\nHost: app.test\r\n\r\n")
        #expect(h.transport.transfers.count == 1)
    }

    @Test func anIdleConnectionIsClosedAtClientIdleTimeout() throws {
        let h = try Harness(Self.upstream)
        h.advance(by: .seconds(29))
        #expect(h.channel.isActive)
        h.advance(by: .seconds(1))
        #expect(!h.channel.isActive)
    }

    @Test func aHeadTrickledPastHeaderTimeoutGets408_eachRequestGetsItsOwnClock() throws {
        let h = try Harness(Self.upstream.replacing("30s}", with: "30s, header_timeout: 5s}"))
        // A complete request resets the clock: the next head's first byte starts a new one.
        h.advance(by: .seconds(4))
        try h.send("GET http://app.test/1 HTTP/1.1\r\nHost: app.test\r\n\r\n")
        h.answer(0, body: "ok")
        _ = try h.output()
        h.advance(by: .seconds(4))
        // One byte every second never stalls the connection (client_idle_timeout is 30 s) but the head never ends.
        for byte in "GET http://app.test/2 HT" {
            try h.send(String(byte))
            h.advance(by: .milliseconds(200))
        }
        #expect(try h.output().isEmpty)
        #expect(h.channel.isActive)
        h.advance(by: .milliseconds(200))
        let out = try h.output()
        #expect(out.hasPrefix("HTTP/1.1 408 Request Timeout\r\n"))
        #expect(out.contains("X-Backstop-Error: request-timeout\r\n"))
        #expect(!h.channel.isActive)
        #expect(h.transport.transfers.count == 1)
    }

    @Test func headDeadlineTransitions() {
        var d = HeadDeadline(timeout: .seconds(10))
        #expect(d.timerFired(now: .seconds(100)) == .wait(next: nil))
        #expect(d.bytesArrived(now: .seconds(1)) == .seconds(11))
        #expect(d.bytesArrived(now: .seconds(2)) == nil, "later bytes of the same head do not move the deadline")
        #expect(d.timerFired(now: .seconds(10)) == .wait(next: .seconds(11)))
        d.headReceived()
        #expect(d.state == .between)
        #expect(d.bytesArrived(now: .seconds(12)) == nil, "body bytes start no clock")
        #expect(d.timerFired(now: .seconds(30)) == .wait(next: nil))
        d.awaitNextHead()
        #expect(d.bytesArrived(now: .seconds(40)) == .seconds(50))
        #expect(d.timerFired(now: .seconds(50)) == .expired)
        #expect(d.state == .expired)
        d.awaitNextHead()
        d.headReceived()
        #expect(d.state == .expired, "expired is terminal")
    }

    @Test func aStalledBodyGets408AndTheTransferIsNeverStarted() throws {
        let h = try Harness(Self.upstream)
        try h.send("POST http://app.test/p HTTP/1.1\r\nHost: app.test\r\nContent-Length: 10\r\n\r\nabc")
        h.advance(by: .seconds(30))
        let out = try h.output()
        #expect(out.hasPrefix("HTTP/1.1 408 Request Timeout\r\n"))
        #expect(out.contains("X-Backstop-Error: request-timeout\r\n"))
        #expect(h.transport.transfers.isEmpty)
    }

    @Test func aClientDisconnectCancelsTheTransfer() throws {
        let h = try Harness(Self.upstream)
        try h.send("GET http://app.test/slow HTTP/1.1\r\nHost: app.test\r\n\r\n")
        let transfer = h.transport.transfers[0].handle  // held here: the exchange lets go of it when it ends
        #expect(!transfer.cancelled)
        _ = try h.channel.finish(acceptAlreadyClosed: true)
        #expect(transfer.cancelled)
    }

    @Test func aBodyLongerThanItsContentLengthClosesTheConnectionAfterTheAnnouncedBytes() throws {
        let h = try Harness(Self.upstream)
        try h.send("GET http://app.test/lie HTTP/1.1\r\nHost: app.test\r\n\r\n")
        let transfer = h.transport.transfers[0].handle
        transfer.sink([
            .head(UpstreamResponseHead(status: 200, contentLength: 3)),
            .body(ByteBuffer(string: "abcINJECTED")),
        ])
        h.channel.embeddedEventLoop.run()
        let out = try h.output()
        #expect(out.hasSuffix("\r\n\r\nabc"))
        #expect(!out.contains("INJECTED"))
        #expect(!h.channel.isActive)
        #expect(transfer.cancelled)
    }
}
