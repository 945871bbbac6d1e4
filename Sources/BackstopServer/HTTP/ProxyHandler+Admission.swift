import BackstopCore
import BackstopTracing
import NIOCore
import NIOHTTP1

/// `.admit`: what a request head gets — `RequestAdmission`'s routing and limits, then the `clients` policy — reported
/// to the machine as `headAdmitted`. A refusal is recorded here (metrics, its span, its access line): no exchange
/// records it.
extension ProxyHandler {
    func admit(_ head: ClientRequestHead) {
        headTimer?.headReceived()
        guard let context, !machine.isClosing else { return }
        let snapshot = runtime.snapshot
        let now = self.now
        switch RequestAdmission.decide(
            head, snapshot: snapshot, draining: runtime.isDraining, intercepted: intercepted, replay: delivery)
        {
        case .reject(let reason, let close, let upstream):
            refuse(reason, head: head, close: close, upstream: upstream)
        case .connect:
            handleConnect(head, snapshot: snapshot, context: context)
        case .accept(let accepted):
            var head = head
            var clientEntry: String?
            var deliveryID: String?
            if delivery {
                // The deliverer's own request: admitted when it was queued; it names its delivery for the access line.
                deliveryID = head.headers.first(name: LoopbackDeliverySender.deliveryHeader)
                head.headers.remove(name: LoopbackDeliverySender.deliveryHeader)
                let acceptedFor = head.headers.first(name: LoopbackDeliverySender.upstreamHeader)
                head.headers.remove(name: LoopbackDeliverySender.upstreamHeader)
                // Routed again by its `Host` (a request accepted inside an intercepted connection names any host),
                // it could reach another upstream with that upstream's credential and no `clients` check: it goes to
                // the upstream it was accepted for or nowhere (403 no-route: a dead letter).
                guard acceptedFor != nil, accepted.upstreamName == acceptedFor else {
                    refuse(
                        .noRoute, head: head, close: accepted.refusalCloses, upstream: accepted.upstreamName,
                        delivery: deliveryID)
                    return
                }
                if upgradeIfAsked(head, accepted, clientEntry: clientEntry, context: context) { return }
            } else {
                switch clientDecision(head, destination: accepted.destination, snapshot: snapshot, context: context) {
                case .allow(let entry): clientEntry = entry
                case nil: clientEntry = nil
                case .deny:
                    refuse(.clientDenied, head: head, close: accepted.refusalCloses, upstream: accepted.upstreamName)
                    return
                case .challenge:
                    refuse(
                        .proxyAuthRequired, head: head, close: accepted.refusalCloses, upstream: accepted.upstreamName)
                    return
                }
                if upgradeIfAsked(head, accepted, clientEntry: clientEntry, context: context) { return }
                if let upstream = accepted.destination.upstream, case .queue = upstream.config.delivery {
                    admitQueued(head, accepted, upstream: upstream.config.name, clientEntry: clientEntry)
                    return
                }
            }
            // Every endpoint ejected, or `circuit.max_inflight` requests already in progress: answered at once,
            // before a credential is asked for or the body read (docs/reference/behaviour.md#failing-fast).
            let slot = accepted.destination.upstream?.health
            if let slot {
                switch slot.acquire() {
                case .admitted: break
                case .overloaded:
                    refuse(
                        .upstreamOverloaded, head: head, close: accepted.refusalCloses, upstream: accepted.upstreamName,
                        delivery: deliveryID)
                    return
                case .circuitOpen(let retryAfter):
                    refuse(
                        .circuitOpen, head: head, close: accepted.refusalCloses, upstream: accepted.upstreamName,
                        retryAfter: retryAfter, delivery: deliveryID)
                    return
                }
            }
            let configuration = RequestAdmission.exchangeConfiguration(head, accepted, snapshot: snapshot)
            let metrics = runtime.metrics.upstream(accepted.destination.name, known: lastUpstreamMetrics)
            lastUpstreamMetrics = metrics
            exchange = Exchange(
                head: head, target: accepted.target, destination: accepted.destination, configuration: configuration,
                environment: ExchangeEnvironment(
                    runtime: runtime, accessLog: snapshot.config.log.accessLog,
                    bufferMemory: snapshot.config.limits.bufferMemory),
                record: AccessRecord.Request(
                    client: clientAddress, method: configuration.method, host: accepted.clientHost,
                    path: accepted.target.path, clientEntry: clientEntry, delivery: deliveryID),
                metrics: metrics, now: now)
            exchange?.inflightSlot = slot
            // A local, so the closure does not capture (and retain) the whole `accepted`.
            let expectsContinue = accepted.expectsContinue
            feed { $0.headAdmitted(.forward(configuration, expectsContinue: expectsContinue), now: now, into: &$1) }
        }
    }

    /// A request to a `delivery: queue` upstream: read whole, stored, answered `202`
    /// (docs/reference/behaviour.md#queued-delivery). Without a queue (no spool could be opened) it cannot be stored.
    private func admitQueued(
        _ head: ClientRequestHead, _ accepted: RequestAdmission.Accepted, upstream: String, clientEntry: String?
    ) {
        let now = self.now
        let limits = runtime.snapshot.config.limits
        guard runtime.queue != nil else {
            refuse(.spoolFull, head: head, close: accepted.refusalCloses, upstream: accepted.upstreamName)
            return
        }
        intake = QueueIntake(
            head: head, upstream: upstream,
            record: AccessRecord.Request(
                client: clientAddress, method: head.method.rawValue, host: accepted.clientHost,
                path: accepted.target.path, clientEntry: clientEntry),
            runtime: runtime, bufferMemory: limits.bufferMemory, now: now)
        let expectsContinue = accepted.expectsContinue
        feed {
            $0.headAdmitted(
                .queue(maxBody: limits.maxRequestBody, expectsContinue: expectsContinue), now: now, into: &$1)
        }
    }

    /// The `clients` decision for a request (or `CONNECT`) to `target` (docs/reference/config.md#clients); nil when
    /// no `clients` section is in force. Inside an intercepted connection the `CONNECT`'s `Proxy-Authorization`
    /// stands for requests that carry none.
    func clientDecision(
        _ head: ClientRequestHead, destination: ExchangeDestination, snapshot: ConfigSnapshot,
        context: ChannelHandlerContext
    ) -> ClientDecision? {
        guard snapshot.clients != nil else { return nil }
        let target: ClientTarget = destination.upstream.map { .upstream($0.config.name) } ?? .unrouted
        return clientDecision(head, target: target, snapshot: snapshot, context: context)
    }

    func clientDecision(
        _ head: ClientRequestHead, target: ClientTarget, snapshot: ConfigSnapshot, context: ChannelHandlerContext
    ) -> ClientDecision? {
        guard let policy = snapshot.clients else { return nil }
        if peer == nil || (policy.usesGroups && peer?.groups == false) {
            peer = (ClientIdentification.connection(of: context.channel, groups: policy.usesGroups), policy.usesGroups)
        }
        let authorization = head.headers.first(name: "proxy-authorization") ?? intercepted?.proxyAuthorization
        return policy.decide(connection: peer!.connection, proxyAuthorization: authorization, target: target)
    }

    /// Answers a request with a Backstop error before any exchange, and ignores its body (`close`: and closes, the
    /// machine adding the client's own `Connection: close`).
    /// `upstream`: the upstream the request was routed to, when it was refused after routing (its metrics, access
    /// line and status page name it); nil before routing or for passthrough (`-`).
    private func refuse(
        _ reason: ProxyErrorReason, head: ClientRequestHead, close: Bool, upstream: String? = nil,
        retryAfter: Int? = nil, delivery: String? = nil
    ) {
        let upstreamName = upstream ?? "-"
        if let upstream {
            // Refused after routing: an answer of that upstream's, on the status page too (`upstream-overloaded`,
            // `spool-full` among its failures).
            runtime.recordAnswer(
                upstream: upstream, status: reason.status, seconds: 0, attempts: 0, now: now, cause: reason.rawValue)
        } else {
            runtime.metrics.recordRequest(upstream: upstreamName, status: reason.status, seconds: 0)
        }
        let target = RequestTarget.parse(head.uri)
        let host: String
        if let target, case .absolute(_, let urlHost, _) = target.form {
            host = urlHost
        } else {
            host = head.headers.first(name: "host") ?? "-"
        }
        let request = AccessRecord.Request(
            client: clientAddress, method: head.method.rawValue, host: host, path: AccessRecord.path(of: head.uri),
            delivery: delivery)
        let now = self.now
        traceLocalAnswer(reason, head: head, request: request, target: target, upstream: upstream)
        logLocalAnswer(
            reason, method: request.method, host: request.host, path: request.path, upstream: upstreamName,
            delivery: delivery)
        feed { $0.headAdmitted(.reject(reason, close: close, retryAfter: retryAfter), now: now, into: &$1) }
    }

    /// The server span of a request Backstop answered itself before any exchange, with the reason: a refused
    /// request is a request too (docs/reference/operations.md#tracing). `request` is made only when tracing is on.
    func traceLocalAnswer(
        _ reason: ProxyErrorReason, head: ClientRequestHead, request: @autoclosure () -> AccessRecord.Request,
        target: RequestTarget?, upstream: String?
    ) {
        guard let tracer = runtime.tracer else { return }
        let now = self.now
        tracer.startRequest(headers: head.headers, at: now).finish(
            RequestFacts(
                head, request(), target: target, status: reason.status, upstream: upstream,
                errorReason: reason.rawValue, attempts: 0), at: now)
    }

    /// `elapsed`: the request's time, when Backstop waited on it before answering (a head that never completed);
    /// other local answers are given as the head is read.
    func logLocalAnswer(
        _ reason: ProxyErrorReason, method: String, host: String, path: String, reason detail: String? = nil,
        upstream: String = "-", elapsed: Duration = .zero, delivery: String? = nil
    ) {
        runtime.logAccess(
            AccessRecord(
                request: AccessRecord.Request(
                    client: clientAddress, method: method, host: host, path: path, delivery: delivery),
                status: reason.status, error: reason.rawValue, reason: detail, upstream: upstream, attempts: 0,
                retries: [],
                elapsed: elapsed, bytes: 0), enabled: runtime.snapshot.config.log.accessLog)
    }
}
