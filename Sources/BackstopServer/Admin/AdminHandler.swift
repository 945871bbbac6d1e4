import BackstopCore
import BackstopStatus
import NIOCore
import NIOHTTP1

/// The admin endpoints: `/healthz` (200 while the process runs), `/readyz` (200 once serving, 503 while
/// draining), `/metrics` (Prometheus text), `/status` (the status page) and `/status.json` (the same facts).
final class AdminHandler: ChannelInboundHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private let state: AdminState
    private let headTimer: HeadTimeoutHandler
    private var requestHead: HTTPRequestHead?

    init(state: AdminState, headTimer: HeadTimeoutHandler) {
        self.state = state
        self.headTimer = headTimer
    }

    /// `IdleStateHandler` reports a connection that sent nothing for `client_idle_timeout`: close it. A head that
    /// did not complete within `header_timeout` gets 408 first.
    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if event is IdleStateHandler.IdleStateEvent {
            context.close(promise: nil)
            return
        }
        if event is HeadTimeoutHandler.Expired {
            requestHead = nil
            let body = "request head not complete within limits.header_timeout\n"
            var headers = HTTPHeaders()
            headers.add(name: "Content-Type", value: "text/plain; charset=utf-8")
            headers.add(name: "Content-Length", value: String(body.utf8.count))
            headers.add(name: "Connection", value: "close")
            // Backstop's own answer, named as on a proxy listener (docs/reference/errors.md).
            headers.add(name: "X-Backstop-Error", value: ProxyErrorReason.requestTimeout.rawValue)
            context.write(
                wrapOutboundOut(
                    .head(
                        HTTPResponseHead(
                            version: .http1_1, status: .requestTimeout,
                            headers: headers))), promise: nil)
            context.write(
                wrapOutboundOut(.body(.byteBuffer(context.channel.allocator.buffer(string: body)))),
                promise: nil)
            let channel = context.channel
            context.writeAndFlush(wrapOutboundOut(.end(nil))).whenComplete { _ in channel.close(promise: nil) }
            return
        }
        context.fireUserInboundEventTriggered(event)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            headTimer.headReceived()
            requestHead = head
        case .body: break
        case .end:
            guard let head = requestHead else { return }
            requestHead = nil
            let (status, body, contentType): (HTTPResponseStatus, String, String)
            var extraHeaders: [(String, String)] = []
            switch AdminRoute(method: head.method, uri: head.uri) {
            case .healthz:
                (status, body, contentType) = (.ok, "ok\n", "text/plain; charset=utf-8")
            case .readyz:
                let ready = state.isReady()
                (status, body, contentType) =
                    ready
                    ? (.ok, "ready\n", "text/plain; charset=utf-8")
                    : (.serviceUnavailable, "not ready\n", "text/plain; charset=utf-8")
            case .metrics:
                (status, body, contentType) = (.ok, state.metricsText(), "text/plain; version=0.0.4; charset=utf-8")
            case .statusPage:
                if let snapshot = state.statusSnapshot() {
                    (status, body, contentType) = (.ok, StatusPage.render(snapshot), "text/html; charset=utf-8")
                    extraHeaders = Self.statusPageHeaders
                } else {
                    (status, body, contentType) = (.serviceUnavailable, "stopping\n", "text/plain; charset=utf-8")
                }
            case .statusJSON:
                if let snapshot = state.statusSnapshot() {
                    (status, body, contentType) = (.ok, StatusJSON.render(snapshot), "application/json")
                    extraHeaders = [("Cache-Control", "no-store"), ("X-Content-Type-Options", "nosniff")]
                } else {
                    (status, body, contentType) = (.serviceUnavailable, "stopping\n", "text/plain; charset=utf-8")
                }
            case .methodNotAllowed(let allow):
                (status, body, contentType) = (.methodNotAllowed, "method not allowed\n", "text/plain; charset=utf-8")
                extraHeaders = [("Allow", allow)]
            case .notFound:
                (status, body, contentType) = (.notFound, "not found\n", "text/plain; charset=utf-8")
            }
            var headers = HTTPHeaders()
            headers.add(name: "Content-Type", value: contentType)
            headers.add(name: "Content-Length", value: String(body.utf8.count))
            for (name, value) in extraHeaders { headers.add(name: name, value: value) }
            if !head.isKeepAlive { headers.add(name: "Connection", value: "close") }
            context.write(
                wrapOutboundOut(.head(HTTPResponseHead(version: head.version, status: status, headers: headers))),
                promise: nil)
            if head.method != .HEAD {
                var buffer = context.channel.allocator.buffer(capacity: body.utf8.count)
                buffer.writeString(body)
                context.write(wrapOutboundOut(.body(.byteBuffer(buffer))), promise: nil)
            }
            let keepAlive = head.isKeepAlive
            let channel = context.channel
            context.writeAndFlush(wrapOutboundOut(.end(nil))).whenComplete { _ in
                if !keepAlive { channel.close(promise: nil) }
            }
            headTimer.awaitNextHead()
        }
    }
}

/// What the admin endpoints report; supplied by the daemon.
struct AdminState: Sendable {
    var isReady: @Sendable () -> Bool
    var metricsText: @Sendable () -> String
    /// nil once the server is gone.
    var statusSnapshot: @Sendable () -> StatusSnapshot?
}

extension AdminHandler {
    /// The status page may load nothing and run nothing; it is never cached, framed or sniffed as another type.
    static let statusPageHeaders: [(String, String)] = [
        ("Content-Security-Policy", StatusPage.contentSecurityPolicy),
        ("Cache-Control", "no-store"),
        ("X-Content-Type-Options", "nosniff"),
        ("X-Frame-Options", "DENY"),
        ("Referrer-Policy", "no-referrer"),
    ]
}
