import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL

/// A scriptable HTTP/1.1 origin on 127.0.0.1 with an ephemeral port, for proxy integration tests.
///
/// Each test starts its own instance (they run in parallel on the shared NIO event loop group) and calls
/// `shutdown()` at the end. The script sees each request once its body has fully arrived and decides the response.
public final class TestOrigin: Sendable {
    /// Decides the response to each request; called once per request, possibly concurrently.
    public typealias Script = @Sendable (RecordedRequest) -> OriginAction

    /// The bound TCP port.
    public let port: Int
    /// `http://127.0.0.1:PORT`, or `https://localhost:PORT` for a TLS origin (the test certificate names `localhost`).
    public let baseURL: String

    private let state: OriginState
    private let serverChannel: any Channel
    private let acceptLoop: Task<Void, Never>

    private init(
        port: Int, baseURL: String, state: OriginState, serverChannel: any Channel,
        acceptLoop: Task<Void, Never>
    ) {
        self.port = port
        self.baseURL = baseURL
        self.state = state
        self.serverChannel = serverChannel
        self.acceptLoop = acceptLoop
    }

    /// Starts an origin on 127.0.0.1:0 (or on `host`, port 0).
    /// - Parameters:
    ///   - host: the address to listen on (a test namespace's veth address, say).
    ///   - tls: serve HTTPS with this certificate and key.
    ///   - sendsContinue: answer `Expect: 100-continue` with an interim `100 Continue`.
    ///   - script: the response for each request.
    ///   - keepsRequests: false keeps only the count (`requests` stays empty), for long runs such as the soak.
    public static func start(
        host: String = "127.0.0.1",
        tls: TestTLSIdentity? = nil,
        sendsContinue: Bool = true,
        keepsRequests: Bool = true,
        script: @escaping Script
    ) async throws -> TestOrigin {
        try await start(
            on: .tcp(host), tls: tls, sendsContinue: sendsContinue, keepsRequests: keepsRequests,
            script: script)
    }

    /// Starts an origin listening on a unix-domain socket at `unixPath` (`port` is 0, `baseURL` is
    /// `http://localhost`). The socket file is not removed on shutdown.
    public static func start(
        unixPath: String,
        sendsContinue: Bool = true,
        script: @escaping Script
    ) async throws -> TestOrigin {
        try await start(
            on: .unix(unixPath), tls: nil, sendsContinue: sendsContinue, keepsRequests: true, script: script)
    }

    /// Starts an origin on a TCP socket that is already bound and listening (one opened inside a test network
    /// namespace: `NetworkNamespace.startOrigin`); it owns the descriptor from now on. `host` is the bound address,
    /// for `baseURL`.
    public static func start(
        listeningSocket descriptor: CInt, host: String, script: @escaping Script
    ) async throws -> TestOrigin {
        try await start(
            on: .socket(descriptor, host: host), tls: nil, sendsContinue: true, keepsRequests: true, script: script)
    }

    private enum Endpoint {
        case tcp(String)
        case unix(String)
        case socket(CInt, host: String)
    }

    private static func start(
        on endpoint: Endpoint,
        tls: TestTLSIdentity?,
        sendsContinue: Bool,
        keepsRequests: Bool,
        script: @escaping Script
    ) async throws -> TestOrigin {
        let sslContext = try tls.map { try $0.makeServerContext() }
        let state = OriginState(keepsRequests: keepsRequests)
        let bootstrap = ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            // Deep enough that a flood through the proxy (1,000 upstream connections opened at once) is not refused
            // by the test origin itself.
            .serverChannelOption(.backlog, value: 4096)
        let initializer: @Sendable (any Channel) -> EventLoopFuture<AcceptedConnection> = { channel in
            channel.eventLoop.makeCompletedFuture { () -> AcceptedConnection in
                if let sslContext {
                    try channel.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: sslContext))
                }
                try channel.pipeline.syncOperations.addHandler(
                    ByteToMessageHandler(HTTPRequestDecoder(leftOverBytesStrategy: .dropBytes)))
                let wrapped = try NIOAsyncChannel<HTTPServerRequestPart, Never>(
                    wrappingChannelSynchronously: channel)
                return AcceptedConnection(id: state.registerConnection(channel), channel: wrapped)
            }
        }
        let server: NIOAsyncChannel<AcceptedConnection, Never>
        let port: Int
        switch endpoint {
        case .tcp(let host):
            server =
                try await bootstrap
                .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
                .bind(host: host, port: 0, childChannelInitializer: initializer)
            guard let bound = server.channel.localAddress?.port else {
                try? await server.channel.close()
                throw TestOriginError.noLocalAddress
            }
            port = bound
        case .unix(let path):
            server = try await bootstrap.bind(unixDomainSocketPath: path, childChannelInitializer: initializer)
            port = 0
        case .socket(let descriptor, _):
            server =
                try await bootstrap
                .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
                .bind(descriptor, childChannelInitializer: initializer)
            guard let bound = server.channel.localAddress?.port else {
                try? await server.channel.close()
                throw TestOriginError.noLocalAddress
            }
            port = bound
        }
        let acceptLoop = Task<Void, Never> {
            _ = try? await server.executeThenClose { inbound in
                try await withThrowingDiscardingTaskGroup { group in
                    for try await accepted in inbound {
                        guard let id = accepted.id else {
                            try? await accepted.channel.channel.close()
                            continue
                        }
                        let connection = OriginConnection(
                            id: id, channel: accepted.channel, state: state, script: script,
                            sendsContinue: sendsContinue)
                        group.addTask { await connection.serve() }
                    }
                }
            }
        }
        let baseURL: String
        switch endpoint {
        case .tcp(let host) where host == "127.0.0.1":
            baseURL = tls == nil ? "http://127.0.0.1:\(port)" : "https://localhost:\(port)"
        case .tcp(let host), .socket(_, let host):
            baseURL = (tls == nil ? "http://" : "https://") + (host.contains(":") ? "[\(host)]" : host) + ":\(port)"
        case .unix:
            baseURL = "http://localhost"
        }
        return TestOrigin(
            port: port, baseURL: baseURL, state: state, serverChannel: server.channel, acceptLoop: acceptLoop)
    }

    /// Every request whose end has arrived, ordered by `index`.
    public var requests: [RecordedRequest] {
        state.requests
    }

    /// The number of requests in `requests`.
    public var requestCount: Int {
        state.requestCount
    }

    /// Response body bytes the origin has written so far (counted when each write completed), over all
    /// responses: with a slow reader behind a proxy, this shows whether the proxy applies backpressure.
    public var bodyBytesSent: Int {
        state.bodyBytesSent
    }

    /// TCP connections accepted so far.
    public var connectionCount: Int {
        state.connectionCount
    }

    /// TCP connections open now (accepted and not yet closed by either side).
    public var openConnectionCount: Int {
        state.openConnectionCount
    }

    /// Waits until at least `count` requests have been recorded and returns them; throws `TestOriginError.timeout`
    /// with what did arrive.
    public func waitForRequests(_ count: Int, timeout: Duration) async throws -> [RecordedRequest] {
        let deadline = ContinuousClock.now.advanced(by: timeout)
        while true {
            let snapshot = state.requests
            if snapshot.count >= count {
                return snapshot
            }
            if ContinuousClock.now >= deadline {
                throw TestOriginError.timeout(expected: count, received: snapshot.count)
            }
            try await Task.sleep(for: .milliseconds(5))
        }
    }

    /// Closes the listener and every open connection (including hanging ones) and waits for the connection tasks.
    public func shutdown() async throws {
        let open = state.beginShutdown()
        try? await serverChannel.close()
        for channel in open {
            channel.close(promise: nil)
        }
        acceptLoop.cancel()
        await acceptLoop.value
    }

    /// A script answering request `i` with `actions[i]` and every later request with `last`.
    public static func sequence(_ actions: [OriginAction], then last: OriginAction) -> Script {
        { request in
            request.index < actions.count ? actions[request.index] : last
        }
    }
}

/// A freshly accepted child channel; `id` is nil when it arrived during shutdown.
struct AcceptedConnection: Sendable {
    let id: Int?
    let channel: NIOAsyncChannel<HTTPServerRequestPart, Never>
}

/// Failures of `TestOrigin`.
public enum TestOriginError: Error, CustomStringConvertible {
    case noLocalAddress
    case timeout(expected: Int, received: Int)

    public var description: String {
        switch self {
        case .noLocalAddress:
            return "TestOrigin: the listener has no local address"
        case .timeout(let expected, let received):
            return "TestOrigin: timed out waiting for \(expected) request(s); \(received) arrived"
        }
    }
}
