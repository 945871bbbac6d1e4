import BackstopCore
import Logging
import NIOCore
import NIOEmbedded
import Testing

@testable import BackstopServer

/// `TunnelRelay` and its glue handlers on two embedded channels sharing one loop: bytes both ways, backpressure,
/// half-close, the idle timeout, and one close for the pair.
@Suite("Tunnel relay")
struct TunnelRelayTests {
    /// Counts `read` calls that reach the channel, and records `close` modes instead of closing (to see a
    /// half-close, which embedded channels do not model).
    final class ChannelSpy: ChannelOutboundHandler {
        typealias OutboundIn = Any
        var reads = 0
        var closes: [CloseMode] = []
        var passCloses = false

        func read(context: ChannelHandlerContext) {
            reads += 1
            context.read()
        }

        func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
            closes.append(mode)
            if passCloses || mode == .all { context.close(mode: mode, promise: promise) } else { promise?.succeed(()) }
        }
    }

    struct Pair {
        let loop: EmbeddedEventLoop
        let clock: ManualClock
        let relay: TunnelRelay
        let client: EmbeddedChannel
        let upstream: EmbeddedChannel
        let clientSpy: ChannelSpy
        let upstreamSpy: ChannelSpy
        let metrics: TunnelMetrics
        let closes: Counter
    }

    final class Counter { var value = 0 }

    static func pair(idle: Duration = .seconds(10)) throws -> Pair {
        let loop = EmbeddedEventLoop()
        let clock = ManualClock()
        let metrics = TunnelMetrics()
        metrics.record(TunnelMetrics.Result.established)
        let closes = Counter()
        let relay = TunnelRelay(
            description: TunnelRelay.Description(
                client: "127.0.0.1:1", target: ConnectTarget(host: "a.test", port: 443), address: "192.0.2.1:443"),
            eventLoop: loop, clock: clock, idleTimeout: idle,
            logger: Logger(label: "test") { _ in SwiftLogNoOpLogHandler() },
            accessLog: false, metrics: metrics, onClose: { closes.value += 1 })
        let clientSpy = ChannelSpy()
        let upstreamSpy = ChannelSpy()
        let client = EmbeddedChannel(loop: loop)
        let upstream = EmbeddedChannel(loop: loop)
        try client.pipeline.syncOperations.addHandlers([clientSpy, relay.clientSide])
        try upstream.pipeline.syncOperations.addHandlers([upstreamSpy, relay.upstreamSide])
        let address = try SocketAddress(ipAddress: "127.0.0.1", port: 1)
        try client.connect(to: address).wait()
        try upstream.connect(to: address).wait()
        return Pair(
            loop: loop, clock: clock, relay: relay, client: client, upstream: upstream, clientSpy: clientSpy,
            upstreamSpy: upstreamSpy, metrics: metrics, closes: closes)
    }

    @Test func bytesGoBothWaysAndAreCounted() throws {
        let p = try Self.pair()
        try p.client.writeInbound(ByteBuffer(string: "hello"))
        #expect(try p.upstream.readOutbound(as: ByteBuffer.self) == ByteBuffer(string: "hello"))
        try p.upstream.writeInbound(ByteBuffer(string: "world!"))
        #expect(try p.client.readOutbound(as: ByteBuffer.self) == ByteBuffer(string: "world!"))
        #expect(p.relay.bytesUp == 5)
        #expect(p.relay.bytesDown == 6)
        #expect(p.metrics.render().contains("backstop_tunnel_bytes_total{direction=\"up\"} 5\n"))
    }

    @Test func aSideIsReadOnlyWhileTheOtherCanWrite() throws {
        let p = try Self.pair()
        p.client.read()
        #expect(p.clientSpy.reads == 1)
        p.upstream.isWritable = false
        p.upstream.pipeline.fireChannelWritabilityChanged()
        p.client.read()
        #expect(p.clientSpy.reads == 1, "held while the upstream is not writable")
        p.upstream.isWritable = true
        p.upstream.pipeline.fireChannelWritabilityChanged()
        #expect(p.clientSpy.reads == 2, "the held read is issued once the upstream drains")
        p.upstream.pipeline.fireChannelWritabilityChanged()
        #expect(p.clientSpy.reads == 2, "and only once")
    }

    @Test func aHalfCloseIsPassedOnAsAHalfClose_theSecondClosesBoth() throws {
        let p = try Self.pair()
        p.client.pipeline.fireUserInboundEventTriggered(ChannelEvent.inputClosed)
        #expect(p.upstreamSpy.closes == [.output])
        #expect(p.clientSpy.closes.isEmpty)
        p.upstream.pipeline.fireUserInboundEventTriggered(ChannelEvent.inputClosed)
        #expect(p.clientSpy.closes.contains(.all) || p.clientSpy.closes.contains(.output))
        #expect(p.upstreamSpy.closes.contains(.all), "both directions done: the upstream closes")
    }

    @Test func idleForTheTimeoutClosesBothOnce_activityPostponesIt() throws {
        let p = try Self.pair(idle: .seconds(10))
        p.clock.advance(by: .seconds(6))
        p.loop.advanceTime(by: .seconds(6))
        try p.client.writeInbound(ByteBuffer(string: "x"))
        _ = try p.upstream.readOutbound(as: ByteBuffer.self)
        p.clock.advance(by: .seconds(5))
        p.loop.advanceTime(by: .seconds(5))
        #expect(p.client.isActive && p.upstream.isActive, "activity at 6 s moved the deadline to 16 s")
        p.clock.advance(by: .seconds(6))
        p.loop.advanceTime(by: .seconds(6))
        #expect(!p.client.isActive && !p.upstream.isActive)
        #expect(p.closes.value == 1)
        #expect(p.metrics.openTunnels == 0)
    }

    @Test func eitherSideClosingClosesTheOtherAndEndsTheTunnelOnce() throws {
        let p = try Self.pair()
        _ = try p.upstream.close().wait()
        #expect(!p.client.isActive)
        #expect(p.closes.value == 1)
        #expect(p.metrics.openTunnels == 0)
    }
}
