import BackstopCore
import NIOHTTP1

/// Decides, from a request head alone, whether Backstop answers it itself or hands it to an exchange, and where
/// the exchange goes (docs/reference/behaviour.md: accepting requests, routing, refused methods, loops). Pure.
enum RequestAdmission {
    /// A request that gets an exchange.
    struct Accepted {
        var framing: RequestFraming
        var target: RequestTarget
        var destination: ExchangeDestination
        /// The URL host (absolute form) or the `Host` header (origin form), for the access line.
        var clientHost: String
        /// The `Upgrade` value of a request that asks for a protocol upgrade: an HTTP/1.1 request with a non-empty
        /// `Upgrade` and `upgrade` listed in `Connection` (RFC 9110 §7.8; docs/reference/behaviour.md#upgrades). Nil
        /// for any other request, which is forwarded as usual (`Upgrade` is hop-by-hop and dropped).
        var upgrade: String? = nil
        /// It has a body and asks `Expect: 100-continue` for it.
        var expectsContinue = false

        /// Whether a refusal before the body is read closes the connection (`RequestFraming.refusalCloses`).
        var refusalCloses: Bool { framing.refusalCloses(expectsContinue: expectsContinue) }

        /// The upstream it was routed to (nil for passthrough): what a refusal after routing names.
        var upstreamName: String? { destination.upstream?.config.name }
    }

    enum Decision {
        case accept(Accepted)
        /// Answer with this error; `close` when the rest of the request cannot be trusted or is not read; `upstream`:
        /// the upstream it was routed to, when it was refused after routing (its metrics and access line name it).
        case reject(ProxyErrorReason, close: Bool, upstream: String? = nil)
        /// `CONNECT`: a connection-level event, decided by `ConnectPolicy` (docs/reference/https-clients.md).
        case connect
    }

    /// `intercepted`: the request came inside an intercepted `CONNECT`, and is for that host only.
    /// `replay`: the request is a queued delivery's, replayed by the deliverer as it was stored (admitted then).
    static func decide(
        _ head: ClientRequestHead, snapshot: ConfigSnapshot, draining: Bool, intercepted: InterceptedConnection? = nil,
        replay: Bool = false
    ) -> Decision {
        let limits = snapshot.config.limits
        if draining { return .reject(.shuttingDown, close: true) }
        if head.method.isCONNECT { return .connect }
        // One pass over the fields finds everything admission needs: each lookup by name was a pass of its own.
        let headerBytes = head.uri.utf8.count + head.headers.lineBytes
        var via = 0
        var hostHeader: String?
        var hostFields = 0
        var upgrade: String?
        var connectionListsUpgrade = false
        var expectContinue = false
        var lengthFields: [String] = []
        var codingFields: [String] = []
        // On the bytes: a string only for the few fields admission reads.
        let fields = head.headers
        for i in fields.indices {
            let kind = fields.withName(at: i) { name -> AdmissionField? in
                switch name.count {
                case 3 where HeaderName.equals(name, "via"): .via
                case 4 where HeaderName.equals(name, "host"): .host
                case 6 where HeaderName.equals(name, "expect"): .expect
                case 7 where HeaderName.equals(name, "upgrade"): .upgrade
                case 10 where HeaderName.equals(name, "connection"): .connection
                case 14 where HeaderName.equals(name, "content-length"): .contentLength
                case 17 where HeaderName.equals(name, "transfer-encoding"): .transferEncoding
                default: nil
                }
            }
            guard let kind else { continue }
            let value = fields.value(at: i)
            switch kind {
            case .via: via += HeaderRewriter.backstopViaEntries(inValue: value)
            case .host:
                hostFields += 1
                if hostHeader == nil { hostHeader = value }
            case .upgrade: if upgrade == nil { upgrade = value }
            case .expect: expectContinue = expectContinue || value.caseInsensitiveEquals("100-continue")
            case .connection:
                connectionListsUpgrade = connectionListsUpgrade || HeaderRewriter.value(value, lists: "upgrade")
            case .contentLength: lengthFields.append(value)
            case .transferEncoding: codingFields.append(value)
            }
        }
        if headerBytes > limits.maxHeaderBytes { return .reject(.headersTooLarge, close: true) }
        // Two `Host` lines: a proxy and the upstream could each take another one as the authority (RFC 9112 §3.2
        // asks a server for 400, as nginx answers; docs/reference/behaviour.md#request-syntax).
        if hostFields > 1 { return .reject(.badRequest, close: true) }
        guard
            let framing = lengthFields.isEmpty && codingFields.isEmpty
                ? RequestFraming(contentLength: nil, chunked: false)
                : RequestFraming(contentLengthFields: lengthFields, transferEncodingFields: codingFields)
        else { return .reject(.badRequest, close: true) }
        // An HTTP/1.0 request's 100-continue is ignored (RFC 9110 §10.1.1): such a client sends its body anyway.
        let expectsContinue = expectContinue && framing.hasBody && head.version.minor >= 1
        let refusalCloses = framing.refusalCloses(expectsContinue: expectsContinue)
        if let length = framing.contentLength, length > limits.maxRequestBody {
            return .reject(.bodyTooLarge, close: true)
        }
        guard var target = RequestTarget.parse(head.uri), !target.hasDotSegment else {
            return .reject(.badRequest, close: true)
        }
        // An HTTP/1.1 request must name its host (RFC 9112 §3.2): one sent to an API base URL without `Host` is
        // malformed, not merely unrouted. (An absolute-form target names it; HTTP/1.0 had no `Host`; inside an
        // interception the CONNECT named it; a replayed delivery was admitted when it was stored.)
        if hostFields == 0, target.form == .origin, head.version.minor >= 1, intercepted == nil, !replay {
            return .reject(.badRequest, close: true)
        }
        if let intercepted {
            guard let inside = interceptedTarget(target, intercepted) else {
                return .reject(.noRoute, close: refusalCloses)
            }
            target = inside
        }
        if via >= HeaderRewriter.viaLoopLimit { return .reject(.loopDetected, close: true) }
        let destination: ExchangeDestination
        switch snapshot.router.route(target: target, hostHeader: hostHeader) {
        case .noRoute:
            return .reject(.noRoute, close: refusalCloses)
        case .upstream(let index, let path):
            let upstream = snapshot.upstreams[index]
            // After a reload, the host may no longer belong to an intercepting upstream.
            if intercepted != nil, !upstream.config.intercept { return .reject(.noRoute, close: refusalCloses) }
            // Without the configured client certificate the request would go out as someone else, or be refused in
            // the handshake after its retries: nothing is sent (docs/reference/config.md#client-certificates).
            if upstream.clientCertificateUnusable {
                return .reject(.tokenUnavailable, close: refusalCloses, upstream: upstream.config.name)
            }
            // TRACE echoes the request, injected credential included, back to the client.
            if head.method.isTRACE, upstream.config.auth != .none {
                return .reject(.methodNotAllowed, close: refusalCloses, upstream: upstream.config.name)
            }
            if !upstream.config.upgrades, upgrade != nil {
                return .reject(.upgradeNotAllowed, close: refusalCloses, upstream: upstream.config.name)
            }
            destination = .upstream(upstream, path: path)
        case .passthrough(let url):
            destination = .passthrough(url: url)
        }
        let clientHost: String
        if case .absolute(_, let host, _) = target.form { clientHost = host } else { clientHost = hostHeader ?? "-" }
        let requested = head.version == .http1_1 && connectionListsUpgrade && upgrade.map { !$0.isEmpty } == true
        return .accept(
            Accepted(
                framing: framing, target: target, destination: destination, clientHost: clientHost,
                upgrade: requested ? upgrade : nil, expectsContinue: expectsContinue))
    }

    /// A request inside an intercepted connection as the absolute-form `https://host[:port]/…` request it stands for;
    /// nil when it names another host.
    private static func interceptedTarget(
        _ target: RequestTarget, _ intercepted: InterceptedConnection
    ) -> RequestTarget? {
        let connect = intercepted.target
        switch target.form {
        case .origin:
            return RequestTarget(
                form: .absolute(scheme: "https", host: connect.host, port: connect.port == 443 ? nil : connect.port),
                path: target.path, query: target.query)
        case .absolute(_, let host, _) where host == connect.host:
            return RequestTarget(
                form: .absolute(scheme: "https", host: connect.host, port: connect.port == 443 ? nil : connect.port),
                path: target.path, query: target.query)
        case .absolute, .asterisk, .authority:
            return nil
        }
    }

    /// The state machine's configuration for an accepted request.
    static func exchangeConfiguration(
        _ head: ClientRequestHead, _ accepted: Accepted, snapshot: ConfigSnapshot
    )
        -> ExchangeStateMachine.Configuration
    {
        let upstream = accepted.destination.upstream
        let credential = upstream?.auth.credentialKind ?? .none
        let keyHeader = upstream?.config.retry.retryNonIdempotentWithKey
        let bodyMustBeKept: Bool =
            if case .awsSigV4(let source)? = upstream?.auth { source.payload == .signed } else { false }
        let method = head.method.rawValue
        let retryBuffer = snapshot.config.limits.retryBuffer
        var hedge: ExchangeStateMachine.HedgePlan?
        // Hedging off (`hedge.max: 0`, the default) costs one comparison. A body is replayable only if kept whole:
        // one announced above `retry_buffer` streams (a chunked one is checked by the machine when the copy is due).
        if let upstream, upstream.config.hedge.max > 0,
            upstream.config.hedge.applies(
                method: method, bodyReplayable: (accepted.framing.contentLength ?? 0) <= retryBuffer)
        {
            hedge = ExchangeStateMachine.HedgePlan(
                after: upstream.health.hedgeDelay(upstream.config.hedge.after), max: upstream.config.hedge.max)
        }
        return ExchangeStateMachine.Configuration(
            method: method, hasBody: accepted.framing.hasBody,
            declaredLength: accepted.framing.contentLength,
            retryBuffer: retryBuffer, maxRequestBody: snapshot.config.limits.maxRequestBody,
            timeouts: upstream?.config.timeouts ?? Timeouts(),
            hasIdempotencyKey: keyHeader.map { head.headers.contains(name: $0) } ?? false, credential: credential,
            retry: upstream?.retryPolicy, bodyMustBeKept: bodyMustBeKept, choosesEndpoint: upstream != nil,
            networkReturn: upstream?.config.retry.onNetworkChange ?? false, hedge: hedge)
    }
}

/// The fields admission reads, by name.
private enum AdmissionField {
    case via, host, expect, upgrade, connection, contentLength, transferEncoding
}
