import BackstopCore
import BackstopTracing
import NIOCore
import NIOHTTP1

/// `CONNECT` (docs/reference/https-clients.md): a connection-level event. The handler answers a refusal itself,
/// or sets up a blind tunnel or TLS interception and then hands the channel over and leaves the pipeline.
extension ProxyHandler {
    static let connectEstablished: StaticString = "HTTP/1.1 200 Connection Established\r\n\r\n"

    func handleConnect(_ head: ClientRequestHead, snapshot: ConfigSnapshot, context: ChannelHandlerContext) {
        if intercepted != nil {
            // Inside an intercepted connection there is nothing further to tunnel to.
            refuseConnect(
                .badRequest, host: "-", tunnelResult: .badRequest, detail: "CONNECT inside an intercepted connection",
                head: head)
            return
        }
        let decision = snapshot.connectPolicy.decide(authority: head.uri)
        var clientEntry: String?
        switch decision {
        case .refuse: break
        case .tunnel(let target), .intercept(_, let target):
            // Decided before anything is resolved or relayed (docs/reference/config.md#clients).
            let wanted: ClientTarget =
                if case .intercept(let index, _) = decision {
                    .upstream(snapshot.upstreams[index].config.name)
                } else {
                    .unrouted
                }
            switch clientDecision(head, target: wanted, snapshot: snapshot, context: context) {
            case .allow(let entry): clientEntry = entry
            case nil: break
            case .deny:
                refuseConnect(.clientDenied, host: target.host, tunnelResult: .denied, detail: nil, head: head)
                return
            case .challenge:
                refuseConnect(.proxyAuthRequired, host: target.host, tunnelResult: .denied, detail: nil, head: head)
                return
            }
        }
        switch decision {
        case .refuse(let reason):
            let result: TunnelMetrics.Result? =
                switch reason {
                case .badRequest: .badRequest
                case .tunnelDenied: .denied
                default: nil
                }
            refuseConnect(
                reason, host: ConnectTarget.parse(head.uri)?.host ?? "-", tunnelResult: result, detail: nil,
                body: reason == .tunnelDenied ? Self.notAllowedBody : nil, head: head)
        case .tunnel(let target):
            openTunnel(to: target, snapshot: snapshot, context: context, clientEntry: clientEntry)
        case .intercept(let index, let target):
            intercept(
                target, upstream: snapshot.upstreams[index], snapshot: snapshot, context: context,
                clientEntry: clientEntry, proxyAuthorization: head.headers.first(name: "proxy-authorization"))
        }
    }

    /// The bodies of the two `tunnel-denied` refusals, which say which rule refused (docs/reference/errors.md).
    static let notAllowedBody = "CONNECT to this host and port is not allowed: no tunnels.allow pattern matches it"
    static let deniedAddressBody =
        "CONNECT to this host is not allowed: every address it resolves to is in "
        + "tunnels.deny_addresses"

    /// Answers a `CONNECT` with a Backstop error and closes: while admitting it, or once setting up its tunnel
    /// failed (`afterUpgrade`).
    /// `head`: the `CONNECT` refused while admitting it, whose server span this records (a refused request is a
    /// request too: docs/reference/operations.md#tracing).
    private func refuseConnect(
        _ reason: ProxyErrorReason, host: String, tunnelResult: TunnelMetrics.Result?, detail: String?,
        body: String? = nil, afterUpgrade: Bool = false, head: ClientRequestHead? = nil
    ) {
        if let tunnelResult { runtime.tunnelMetrics.record(tunnelResult) }
        runtime.metrics.recordRequest(upstream: "-", status: reason.status, seconds: 0)
        logLocalAnswer(reason, method: "CONNECT", host: host, path: "-", reason: detail)
        let now = self.now
        if let head {
            traceLocalAnswer(
                reason, head: head,
                request: AccessRecord.Request(
                    client: clientAddress, method: head.method.rawValue, host: host, path: "-", delivery: nil),
                target: RequestTarget.parse(head.uri), upstream: nil)
        }
        if afterUpgrade {
            feed { $0.answerLocally(reason, close: true, message: body, now: now, into: &$1) }
        } else {
            feed { $0.headAdmitted(.reject(reason, close: true, message: body), now: now, into: &$1) }
        }
    }

    // MARK: blind tunnels

    private func openTunnel(
        to target: ConnectTarget, snapshot: ConfigSnapshot, context: ChannelHandlerContext, clientEntry: String?
    ) {
        let now = self.now
        feed { $0.headAdmitted(.upgrade, now: now, into: &$1) }
        let policy = snapshot.connectPolicy
        let accessLog = snapshot.config.log.accessLog
        let loopBound = NIOLoopBound(self, eventLoop: context.eventLoop)
        TunnelConnector.connect(
            target, policy: policy, destinationGuard: runtime.destinationGuard, eventLoop: context.eventLoop
        ).whenComplete { result in
            let handler = loopBound.value
            switch result {
            case .success(let (upstream, address)):
                handler.tunnelConnected(
                    upstream, address: address, target: target, idleTimeout: policy.tunnelIdleTimeout,
                    accessLog: accessLog, clientEntry: clientEntry)
            case .failure(let error):
                let failure = error as? TunnelConnector.Failure ?? .unreachable("\(error)")
                guard handler.context?.channel.isActive == true else { return }
                let result: TunnelMetrics.Result =
                    switch failure {
                    case .denied: .denied
                    case .loop: .loopDetected
                    case .unreachable: .unreachable
                    }
                if failure.reason.status >= 500 {
                    // A tunnel that could not be opened is a failure of its target's: on the status page with no
                    // upstream, the target as its endpoint (docs/reference/operations.md#status-page).
                    handler.runtime.recordFailure(
                        upstream: "-", endpoint: target.authority, status: failure.reason.status,
                        cause: "\(failure.reason.rawValue): \(failure.detail)")
                }
                handler.refuseConnect(
                    failure.reason, host: target.host, tunnelResult: result, detail: failure.detail,
                    body: failure.reason == .tunnelDenied ? Self.deniedAddressBody : nil, afterUpgrade: true)
            }
        }
    }

    private func tunnelConnected(
        _ upstream: Channel, address: SocketAddress, target: ConnectTarget, idleTimeout: Duration, accessLog: Bool,
        clientEntry: String?
    ) {
        guard let context, context.channel.isActive else {
            upstream.close(promise: nil)
            return
        }
        let runtime = self.runtime
        let relay = TunnelRelay(
            description: TunnelRelay.Description(
                client: clientAddress, target: target, address: address.displayString, clientEntry: clientEntry),
            eventLoop: context.eventLoop, clock: runtime.clock, idleTimeout: idleTimeout, logger: runtime.logger,
            accessLog: accessLog, metrics: runtime.tunnelMetrics, onClose: { runtime.clientDisconnected() })
        do {
            try upstream.pipeline.syncOperations.addHandler(relay.upstreamSide)
            try context.channel.syncOptions?.setOption(.allowRemoteHalfClosure, value: true)
            runtime.tunnelMetrics.record(TunnelMetrics.Result.established)
            let channel = context.channel
            let loopBound = NIOLoopBound(relay, eventLoop: context.eventLoop)
            try handOver(context, to: [relay.clientSide]).whenSuccess { loopBound.value.flushUpstream() }
            try upstream.syncOptions?.setOption(.autoRead, value: true)
            channel.read()
        } catch {
            upstream.close(promise: nil)
            context.close(promise: nil)
        }
    }

    // MARK: hand-over

    /// Answers `200`, then puts `handlers` where the HTTP decoder was and leaves the pipeline. The decoder goes last:
    /// bytes the client sent after the `CONNECT` head (without waiting for the answer) reach the first new handler
    /// by the time the returned future succeeds.
    @discardableResult
    func handOver(_ context: ChannelHandlerContext, to handlers: [ChannelHandler]) throws -> EventLoopFuture<Void> {
        cancelTimer()
        machine.handedOver()
        var answer = context.channel.allocator.buffer(capacity: 40)
        answer.writeStaticString(Self.connectEstablished)
        context.writeAndFlush(wrapOutboundOut(answer), promise: nil)
        let pipeline = context.pipeline.syncOperations
        let decoder = try pipeline.handler(type: ClientRequestDecoder.self)
        try pipeline.addHandlers(handlers, position: .after(decoder))
        let decoderRemoved = context.eventLoop.makePromise(of: Void.self)
        pipeline.removeHandler(context: context, promise: nil)
        if let headTimer { pipeline.removeHandler(headTimer, promise: nil) }
        pipeline.removeHandler(decoder, promise: decoderRemoved)
        return decoderRemoved.futureResult
    }
}

extension ProxyHandler {
    /// Interception: answer `200`, then terminate the client's TLS with a leaf for the `CONNECT` host and handle
    /// every request inside with a new handler of our own kind (docs/reference/https-clients.md#interception).
    func intercept(
        _ target: ConnectTarget, upstream: UpstreamRuntime, snapshot: ConfigSnapshot, context: ChannelHandlerContext,
        clientEntry: String? = nil, proxyAuthorization: String? = nil
    ) {
        guard let authority = snapshot.intercept else {
            // Cannot happen: a snapshot with an intercepting upstream always has its authority (start and reload
            // refuse a config without one).
            refuseConnect(.tunnelDenied, host: target.host, tunnelResult: nil, detail: "no interception CA loaded")
            return
        }
        let now = self.now
        feed { $0.headAdmitted(.upgrade, now: now, into: &$1) }
        let intercepted = InterceptedConnection(
            target: target, upstreamName: upstream.config.name, client: clientAddress, clientEntry: clientEntry,
            proxyAuthorization: proxyAuthorization)
        let observer = InterceptTLSObserver(
            intercepted: intercepted, authority: authority, runtime: runtime, accessLog: snapshot.config.log.accessLog)
        let channel = context.channel
        // The decoder is still delivering this CONNECT (its end comes next): change the pipeline once it is done.
        let loopBound = NIOLoopBound((self, observer, intercepted), eventLoop: context.eventLoop)
        context.eventLoop.execute {
            let (handler, observer, intercepted) = loopBound.value
            guard let context = handler.context, channel.isActive else { return }
            handler.installInterception(context, observer: observer, intercepted: intercepted, snapshot: snapshot)
        }
    }

    private func installInterception(
        _ context: ChannelHandlerContext, observer: InterceptTLSObserver, intercepted: InterceptedConnection,
        snapshot: ConfigSnapshot
    ) {
        let channel = context.channel
        let headTimer = HeadTimeoutHandler(timeout: snapshot.config.limits.headerTimeout, now: runtime.clock.monotonic)
        let decoder = ClientRequestDecoder(
            maxHeadBytes: ClientRequestDecoder.maxHeadBytes(snapshot.config.limits), forwardsLeftOverBytes: false)
        let proxy = ProxyHandler(
            runtime: runtime, idleTimeout: machine.idleTimeout, headTimer: headTimer, intercepted: intercepted)
        decoder.deliver(to: proxy)
        do {
            try handOver(
                context, to: [observer.makeClientHelloHandler(channel: channel), observer, headTimer, decoder, proxy])
            channel.read()
        } catch {
            channel.close(promise: nil)
        }
    }
}
