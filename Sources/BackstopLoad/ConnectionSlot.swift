import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import NIOTLS

/// What one event loop's connections counted.
struct LoopResult: Sendable {
    var requests: UInt64 = 0
    var errors: UInt64 = 0
    var latencies = LatencyHistogram()
    /// The first few error descriptions, for stderr.
    var samples: [String] = []

    mutating func merge(_ other: LoopResult) {
        requests += other.requests
        errors += other.errors
        latencies.merge(other.latencies)
        for sample in other.samples where samples.count < 5 { samples.append(sample) }
    }
}

/// The connections of one event loop and their shared counters. Confined to `loop`: created, used and finished there.
final class LoopDriver {
    let loop: any EventLoop
    let plan: LoadPlan
    var result = LoopResult()
    private var slots: [ConnectionSlot] = []
    private var open = 0
    private var stopping = false
    private let finished: EventLoopPromise<LoopResult>

    init(loop: any EventLoop, plan: LoadPlan) {
        self.loop = loop
        self.plan = plan
        self.finished = loop.makePromise(of: LoopResult.self)
    }

    /// Opens `connections` connections now, stops them all at `deadline`; the future holds the counts once every
    /// connection is closed.
    func run(connections: Int, until deadline: NIODeadline) -> EventLoopFuture<LoopResult> {
        loop.preconditionInEventLoop()
        open = connections
        slots = (0..<connections).map { _ in ConnectionSlot(driver: self) }
        if connections == 0 { finished.succeed(result) }
        for slot in slots { slot.connect() }
        loop.assumeIsolated().scheduleTask(deadline: deadline) { self.stop() }
        return finished.futureResult
    }

    var isStopping: Bool { stopping }

    func countError(_ description: String) {
        guard !stopping else { return }
        result.errors += 1
        if result.samples.count < 5 { result.samples.append(description) }
    }

    func countResponse(status: HTTPResponseStatus, sentAt: NIODeadline) {
        guard !stopping else { return }
        let elapsed = NIODeadline.now().uptimeNanoseconds &- sentAt.uptimeNanoseconds
        result.latencies.record(microseconds: elapsed / 1000)
        if (200..<300).contains(status.code) {
            result.requests += 1
        } else {
            countError("status \(status.code)")
        }
    }

    /// A slot that has closed its last connection after the stop.
    func slotFinished() {
        open -= 1
        if open == 0 {
            slots = []
            finished.succeed(result)
        }
    }

    private func stop() {
        stopping = true
        for slot in slots { slot.stop() }
    }
}

/// One client connection, kept busy with one request at a time; replaced by a new one after an error or a server
/// close until the stop. Confined to its driver's loop.
final class ConnectionSlot {
    /// Strong: the driver lives until its last slot is finished, then drops its slots.
    private let driver: LoopDriver
    private var channel: (any Channel)?
    private var connecting = false
    private var stopped = false
    /// This connection already counted its error (one per connection).
    private var failed = false
    private var sentAt: NIODeadline?

    init(driver: LoopDriver) { self.driver = driver }

    private var plan: LoadPlan { driver.plan }

    func connect() {
        guard !stopped else { return }
        connecting = true
        failed = false
        sentAt = nil
        ClientBootstrap(group: driver.loop)
            .connectTimeout(plan.timeout)
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .connect(host: plan.peerHost, port: plan.peerPort)
            .assumeIsolated()
            .whenComplete { result in
                self.connecting = false
                switch result {
                case .success(let channel):
                    self.channel = channel
                    channel.closeFuture.assumeIsolated().whenComplete { _ in self.closed() }
                    if self.stopped {
                        channel.close(promise: nil)
                        return
                    }
                    do {
                        try self.configure(channel)
                    } catch {
                        self.fail("pipeline: \(error)")
                    }
                case .failure(let error):
                    self.countError("connect: \(error)")
                    self.retryLater()
                }
            }
    }

    func stop() {
        stopped = true
        if let channel {
            channel.close(promise: nil)
        } else if !connecting {
            driver.slotFinished()
        }
    }

    /// Counts an error for this connection (once) and closes it; a new one follows unless stopped.
    func fail(_ description: String) {
        countError(description)
        channel?.close(promise: nil)
    }

    private func countError(_ description: String) {
        guard !failed, !stopped else { return }
        failed = true
        driver.countError(description)
    }

    private func configure(_ channel: any Channel) throws {
        let pipeline = channel.pipeline.syncOperations
        try pipeline.addHandler(IdleStateHandler(readTimeout: plan.timeout))
        if let authority = plan.tunnelAuthority {
            try pipeline.addHandler(ConnectTunnelHandler(slot: self, authority: authority))
        } else {
            try addSession(to: channel)
        }
    }

    /// TLS (when planned), the HTTP/1.1 codec and the request loop; the first request goes once TLS is up.
    private func addSession(to channel: any Channel) throws {
        let pipeline = channel.pipeline.syncOperations
        if let tls = plan.tls {
            try pipeline.addHandler(NIOSSLClientHandler(context: tls, serverHostname: plan.serverHostname))
        }
        try pipeline.addHTTPClientHandlers()
        try pipeline.addHandler(RequestLoopHandler(slot: self, startsAfterHandshake: plan.tls != nil))
    }

    /// The proxy answered 2xx to CONNECT: the tunnel handler gives way to the TLS session.
    func tunnelEstablished(_ context: ChannelHandlerContext) {
        do {
            try addSession(to: context.channel)
            context.pipeline.syncOperations.removeHandler(context: context).assumeIsolated().whenFailure { error in
                self.fail("removing the tunnel handler: \(error)")
            }
        } catch {
            fail("pipeline: \(error)")
        }
    }

    /// Sends the next request unless the run is over.
    func sendRequest(_ context: ChannelHandlerContext) {
        guard !stopped else { return }
        sentAt = .now()
        context.write(NIOAny(HTTPClientRequestPart.head(plan.request)), promise: nil)
        context.writeAndFlush(NIOAny(HTTPClientRequestPart.end(nil)), promise: nil)
    }

    /// A complete response: counted, then the next request, or a new connection when the server wants this one
    /// closed.
    func responseEnded(_ context: ChannelHandlerContext, status: HTTPResponseStatus, keepAlive: Bool) {
        guard let sentAt else {
            fail("a response nobody asked for")
            return
        }
        self.sentAt = nil
        driver.countResponse(status: status, sentAt: sentAt)
        if keepAlive {
            sendRequest(context)
        } else {
            context.close(promise: nil)
        }
    }

    private func closed() {
        channel = nil
        if stopped {
            driver.slotFinished()
            return
        }
        if sentAt != nil { countError("connection closed with a request in flight") }
        if failed { retryLater() } else { connect() }
    }

    /// Reconnects after a pause, so a refusing peer does not turn the run into a busy loop.
    private func retryLater() {
        if stopped {
            driver.slotFinished()
            return
        }
        connecting = true
        driver.loop.assumeIsolated().scheduleTask(in: .milliseconds(50)) {
            self.connecting = false
            if self.stopped { self.driver.slotFinished() } else { self.connect() }
        }
    }
}

/// Sends `CONNECT authority` and waits for the proxy's answer head; on 2xx hands over to the TLS session.
final class ConnectTunnelHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer

    private let slot: ConnectionSlot
    private let authority: String
    private var received: ByteBuffer?

    init(slot: ConnectionSlot, authority: String) {
        self.slot = slot
        self.authority = authority
    }

    func handlerAdded(context: ChannelHandlerContext) {
        guard context.channel.isActive else { return }
        let request = "CONNECT \(authority) HTTP/1.1\r\nHost: \(authority)\r\n\r\n"
        context.writeAndFlush(NIOAny(context.channel.allocator.buffer(string: request)), promise: nil)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var bytes = unwrapInboundIn(data)
        if received == nil { received = bytes } else { received!.writeBuffer(&bytes) }
        guard let buffer = received else { return }
        let view = buffer.readableBytesView
        guard let end = view.firstRange(of: [13, 10, 13, 10]) else {
            if buffer.readableBytes > 16_384 { slot.fail("CONNECT answer head over 16 KiB") }
            return
        }
        let head = String(decoding: view[view.startIndex..<end.lowerBound], as: UTF8.self)
        let statusLine = head.split(separator: "\r\n", maxSplits: 1).first ?? ""
        let parts = statusLine.split(separator: " ", maxSplits: 2)
        guard parts.count >= 2, parts[0].hasPrefix("HTTP/1."), let code = Int(parts[1]), (200..<300).contains(code)
        else {
            slot.fail("CONNECT refused: \(statusLine)")
            return
        }
        guard end.upperBound == view.endIndex else {
            slot.fail("bytes after the CONNECT answer, before the TLS handshake")
            return
        }
        received = nil
        slot.tunnelEstablished(context)
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let idle = event as? IdleStateHandler.IdleStateEvent, case .read = idle {
            slot.fail("timeout waiting for the CONNECT answer")
        }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        slot.fail("tunnel: \(error)")
    }
}

/// Keeps one request in flight: the first after the TLS handshake (or at once over plain HTTP), the next as soon as
/// a response ends.
final class RequestLoopHandler: ChannelInboundHandler {
    typealias InboundIn = HTTPClientResponsePart

    private let slot: ConnectionSlot
    private let startsAfterHandshake: Bool
    private var head: HTTPResponseHead?

    init(slot: ConnectionSlot, startsAfterHandshake: Bool) {
        self.slot = slot
        self.startsAfterHandshake = startsAfterHandshake
    }

    func handlerAdded(context: ChannelHandlerContext) {
        if !startsAfterHandshake, context.channel.isActive { slot.sendRequest(context) }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            self.head = head
        case .body:
            break
        case .end:
            guard let head else { return }
            self.head = nil
            slot.responseEnded(context, status: head.status, keepAlive: head.isKeepAlive)
        }
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let tls = event as? TLSUserEvent, case .handshakeCompleted = tls, startsAfterHandshake {
            slot.sendRequest(context)
        } else if let idle = event as? IdleStateHandler.IdleStateEvent, case .read = idle {
            slot.fail("timeout: nothing read for the request in flight")
        }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        slot.fail("\(error)")
    }
}
