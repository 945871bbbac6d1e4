import NIOCore
import NIOHTTP1
import NIOPosix

/// One client connection that writes raw bytes exactly as given and decodes the responses, for keep-alive
/// sequences, pipelining, slow readers and mid-response disconnects.
public final class RawHTTPConnection: Sendable {
    /// Socket read size and receive buffer in slow-reader mode: small, so the peer feels backpressure early.
    static let slowReadChunkSize = 16 * 1024
    static let slowReceiveBufferSize = 64 * 1024

    private let channel: any Channel
    private let state: RawHTTPConnectionState

    private init(channel: any Channel, state: RawHTTPConnectionState) {
        self.channel = channel
        self.state = state
    }

    deinit {
        channel.close(promise: nil)
    }

    /// Connects over TCP.
    /// - Parameter readDelayPerChunk: when positive, turns on slow-reader mode: each socket read (at most 16 KiB)
    ///   is requested only this long after the previous one completed.
    public static func connect(
        host: String = "127.0.0.1",
        port: Int,
        readDelayPerChunk: Duration = .zero,
        connectTimeout: Duration = .seconds(10)
    ) async throws -> RawHTTPConnection {
        let state = RawHTTPConnectionState()
        let bootstrap = makeBootstrap(state: state, readDelay: readDelayPerChunk, connectTimeout: connectTimeout)
        return try await open(state: state) { try await bootstrap.connect(host: host, port: port).get() }
    }

    /// Connects to a unix-domain socket.
    public static func connect(
        unixPath: String,
        readDelayPerChunk: Duration = .zero,
        connectTimeout: Duration = .seconds(10)
    ) async throws -> RawHTTPConnection {
        let state = RawHTTPConnectionState()
        let bootstrap = makeBootstrap(state: state, readDelay: readDelayPerChunk, connectTimeout: connectTimeout)
        return try await open(state: state) { try await bootstrap.connect(unixDomainSocketPath: unixPath).get() }
    }

    private static func open(
        state: RawHTTPConnectionState, _ connect: () async throws -> any Channel
    ) async throws -> RawHTTPConnection {
        do {
            return RawHTTPConnection(channel: try await connect(), state: state)
        } catch {
            throw RawHTTPError.connectFailed(String(describing: error))
        }
    }

    private static func makeBootstrap(
        state: RawHTTPConnectionState, readDelay: Duration, connectTimeout: Duration
    ) -> ClientBootstrap {
        var bootstrap = ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .connectTimeout(connectTimeout.timeAmount)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let pipeline = channel.pipeline.syncOperations
                    try pipeline.addHandler(RawRequestFramer())
                    try pipeline.addHandler(
                        ByteToMessageHandler(HTTPResponseDecoder(leftOverBytesStrategy: .dropBytes)))
                    try pipeline.addHandler(RawResponseCollector(state: state, readDelay: readDelay))
                }
            }
        if readDelay.isPositive {
            bootstrap =
                bootstrap
                .channelOption(.autoRead, value: false)
                .channelOption(.maxMessagesPerRead, value: 1)
                .channelOption(.recvAllocator, value: FixedSizeRecvByteBufferAllocator(capacity: slowReadChunkSize))
                .channelOption(.socketOption(.so_rcvbuf), value: SocketOptionValue(slowReceiveBufferSize))
        }
        return bootstrap
    }

    // MARK: Sending

    /// Writes `bytes` unchanged. Set `startsRequest: false` for bytes that continue an earlier request (a body sent
    /// in pieces): the response decoder expects exactly one response per request started.
    public func send(_ bytes: [UInt8], startsRequest: Bool = true) async throws {
        try await sendPipelined([bytes], startsRequests: startsRequest)
    }

    /// Writes the UTF-8 bytes of `text` unchanged (write `\r\n` yourself).
    public func send(_ text: String, startsRequest: Bool = true) async throws {
        try await send(Array(text.utf8), startsRequest: startsRequest)
    }

    /// Writes several complete requests back to back in one flush.
    public func sendPipelined(_ requests: [[UInt8]]) async throws {
        try await sendPipelined(requests, startsRequests: true)
    }

    private func sendPipelined(_ pieces: [[UInt8]], startsRequests: Bool) async throws {
        var writes: [EventLoopFuture<Void>] = []
        for piece in pieces {
            if startsRequests {
                let head = HTTPRequestHead(version: .http1_1, method: Self.method(of: piece), uri: "/")
                writes.append(channel.write(HTTPClientRequestPart.head(head)))
            }
            writes.append(channel.write(HTTPClientRequestPart.body(.byteBuffer(ByteBuffer(bytes: piece)))))
        }
        channel.flush()
        do {
            for write in writes {
                try await write.get()
            }
        } catch {
            throw RawHTTPConnectionState.sendError(error)
        }
    }

    /// The request method (first token) of raw request bytes, so HEAD responses are framed without a body.
    static func method(of request: [UInt8]) -> HTTPMethod {
        let token = request.prefix(32).prefix { $0 != UInt8(ascii: " ") }
        return HTTPMethod(rawValue: String(decoding: token, as: UTF8.self))
    }

    // MARK: Receiving

    /// The next complete response not returned yet, in order.
    public func nextResponse(timeout: Duration) async throws -> RawHTTPResponse {
        try await state.wait(timeout: timeout, on: channel.eventLoop, for: "a response") { snapshot in
            if !snapshot.completed.isEmpty {
                snapshot.consumed += 1
                return .success(snapshot.completed.removeFirst())
            }
            return Self.terminal(snapshot)
        }
    }

    /// Sends one request and waits for its response.
    public func exchange(_ request: [UInt8], timeout: Duration) async throws -> RawHTTPResponse {
        try await send(request)
        return try await nextResponse(timeout: timeout)
    }

    /// Sends one request (UTF-8 of `request`) and waits for its response.
    public func exchange(_ request: String, timeout: Duration) async throws -> RawHTTPResponse {
        try await exchange(Array(request.utf8), timeout: timeout)
    }

    /// The head of the response `nextResponse` would return next, as soon as it arrived (its body may still be
    /// streaming).
    public func waitForResponseHead(timeout: Duration) async throws -> RawHTTPResponseHead {
        try await state.wait(timeout: timeout, on: channel.eventLoop, for: "a response head") { snapshot in
            if snapshot.heads.count > snapshot.consumed {
                return .success(snapshot.heads[snapshot.consumed])
            }
            return Self.terminal(snapshot)
        }
    }

    /// Waits until at least `count` body bytes (over all responses) have been read.
    public func waitForBodyBytes(atLeast count: Int, timeout: Duration) async throws {
        try await state.wait(timeout: timeout, on: channel.eventLoop, for: "\(count) body bytes") { snapshot in
            if snapshot.bodyBytesReceived >= count {
                return .success(())
            }
            return Self.terminal(snapshot)
        }
    }

    /// Waits until the peer closed the connection (or it failed).
    public func waitForClose(timeout: Duration) async throws {
        try await state.wait(timeout: timeout, on: channel.eventLoop, for: "the connection to close") { snapshot in
            snapshot.isClosed ? .success(()) : nil
        }
    }

    /// Body bytes read so far, over all responses.
    public var bodyBytesReceived: Int {
        state.read(\.bodyBytesReceived)
    }

    /// The status and `Connection` header of the last response head read, for diagnostics ("none" before any).
    public var lastHeadSummary: String {
        state.read(\.heads).last.map { "\($0.status) Connection=\($0.header("Connection") ?? "-")" } ?? "none"
    }

    /// Complete responses read so far (returned or not).
    public var responsesReceived: Int {
        state.read(\.completedTotal)
    }

    /// True once the connection is closed, by either side.
    public var isClosed: Bool {
        state.read(\.isClosed)
    }

    /// The socket or protocol failure seen on this connection, if any.
    public var failure: RawHTTPError? {
        state.read(\.failure)
    }

    /// Closes the connection (an abort, from the peer's point of view, if a response is in flight).
    public func close() async {
        try? await channel.close()
    }

    /// A closed connection ends every wait: with its failure, or as a clean close.
    private static func terminal<T>(_ snapshot: RawHTTPConnectionState.Snapshot) -> Result<T, RawHTTPError>? {
        if let failure = snapshot.failure {
            return .failure(failure)
        }
        if snapshot.isClosed {
            return .failure(.closedBeforeResponse(responsesReceived: snapshot.completedTotal))
        }
        return nil
    }
}

extension RawHTTPConnectionState {
    static func sendError(_ error: any Error) -> RawHTTPError {
        RawResponseCollector.classify(error)
    }
}
