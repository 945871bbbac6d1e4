import BackstopCore
import CCurl
import NIOCore

/// Where a raw upstream connection goes and how: the transport resolves, connects, checks the destination and
/// does TLS (verification, client certificate) exactly as for a transfer, then hands over a byte stream.
public struct ConnectionRequest: Sendable {
    /// `http://host[:port]` or `https://host[:port]` (a path is ignored).
    public var url: String
    public var connectTimeout: Duration
    public var tls: TransportTLSOptions
    /// A passthrough destination: the destination guard also refuses link-local and metadata addresses.
    public var passthrough: Bool

    public init(
        url: String, connectTimeout: Duration = .seconds(2), tls: TransportTLSOptions = TransportTLSOptions(),
        passthrough: Bool = false
    ) {
        self.url = url
        self.connectTimeout = connectTimeout
        self.tls = tls
        self.passthrough = passthrough
    }
}

/// What happens on a raw upstream connection, delivered in order and batched on the requester's event loop.
public enum ConnectionEvent: Sendable, Equatable {
    /// Connected (and TLS done): bytes sent from now on reach the upstream.
    case connected
    case received(ByteBuffer)
    /// This many bytes of what was sent were taken by the connection (the sender's backpressure).
    case sent(Int)
    /// The upstream closed the connection (end of stream). Nothing follows.
    case closed
    /// The connection could not be made or broke. Nothing follows.
    case failure(TransportFailure)
}

/// Opens raw upstream connections: the piece an upgraded request (WebSocket) relays over, and what HTTP/1.1
/// upstreams may use later without curl's HTTP layer. Implemented by `CurlMultiTransport`.
public protocol ConnectionOpening: AnyObject, Sendable {
    func connect(
        _ request: ConnectionRequest, on eventLoop: EventLoop, sink: @escaping @Sendable ([ConnectionEvent]) -> Void
    ) -> any ConnectionHandle
}

/// One raw upstream connection as its requester controls it. Every call may come from any thread.
public protocol ConnectionHandle: AnyObject, Sendable {
    /// Queues bytes for the upstream (sent in order; `.sent` events report progress).
    func send(_ buffer: ByteBuffer)
    /// Whether to read from the upstream (false: backpressure; reading resumes when set back).
    func setReceiving(_ receiving: Bool)
    /// Closes the connection; no event follows.
    func close()
}

/// One raw upstream connection made by libcurl with `CURLOPT_CONNECT_ONLY` (docs/reference/behaviour.md#upgrades):
/// curl resolves, connects through the transport's open-socket callback (so the destination guard applies), does
/// TLS with verification and the client certificate, then the transport moves bytes with `curl_easy_send` /
/// `curl_easy_recv` when its epoll instance says the socket is ready. The easy handle is owned here (a `CurlEasy`,
/// freed with the connection) and stays in the transport's multi handle until the connection ends: curl finds the
/// connection of a `CONNECT_ONLY` handle through that multi handle, and `curl_multi_remove_handle` closes it.
///
/// `@unchecked Sendable`, safe because: the `let`s never change (`request`, `eventLoop` and `sink` are Sendable;
/// `transport` owns every connection and ends them before it goes); the `var`s are read and written on the
/// transport thread only (`ConnectionDriver`), and the connection reaches that thread through the transport's
/// locked command queue (`.open`), whose lock orders the initialiser's writes before the thread's reads; what other
/// threads call (`send`, `setReceiving`, `close`) touches no `var`: it only submits commands to that queue.
public final class CurlConnection: ConnectionHandle, @unchecked Sendable {
    let request: ConnectionRequest
    let eventLoop: EventLoop
    let sink: @Sendable ([ConnectionEvent]) -> Void
    unowned let transport: CurlMultiTransport

    enum State { case queued, connecting, open, finished }

    // Transport thread only.
    var state = State.queued
    var easy: CurlEasy?
    /// The connection's socket once open (what epoll watches for it).
    var fd: Int32 = -1
    var outgoing = CircularBuffer<ByteBuffer>()
    var receiving = true
    /// The upstream's end of stream was read: nothing more to receive.
    var inputEnded = false
    /// What epoll watches the socket for (`CURL_POLL_*` bits; 0: nothing; -1: not known yet).
    var watched: Int32 = 0
    var pending: [ConnectionEvent] = []
    /// Why curl was stopped from the open-socket callback (a refused destination), reported instead of curl's error.
    var refusal: TransportFailure?
    var lastAddress: String?

    init(
        request: ConnectionRequest, eventLoop: EventLoop, transport: CurlMultiTransport,
        sink: @escaping @Sendable ([ConnectionEvent]) -> Void
    ) {
        self.request = request
        self.eventLoop = eventLoop
        self.transport = transport
        self.sink = sink
    }

    public func send(_ buffer: ByteBuffer) { transport.submit(.connection(.send(self, buffer))) }
    public func setReceiving(_ receiving: Bool) { transport.submit(.connection(.receive(self, receiving))) }
    public func close() { transport.submit(.connection(.close(self))) }

    /// The `CURL_POLL_*` interest the connection's state asks for.
    var wantedInterest: Int32 {
        guard state == .open else { return 0 }
        var what: Int32 = 0
        if receiving && !inputEnded { what |= SocketInterest.input }
        if !outgoing.isEmpty { what |= SocketInterest.output }
        return what
    }
}

/// What other threads ask of a raw connection, through the transport's command queue.
enum ConnectionCommand {
    case open(CurlConnection)
    case send(CurlConnection, ByteBuffer)
    case receive(CurlConnection, Bool)
    case close(CurlConnection)
}

/// The transport thread's side of raw connections: starts them on the multi handle, recognises their completion,
/// moves their bytes when epoll reports their sockets, and ends them. Transport thread only (owned by
/// `CurlMultiTransport`, which calls it from its loop and its callbacks).
final class ConnectionDriver {
    /// How much one receive call asks for (a TLS record is at most 16 KiB: one call takes whole records, so no
    /// decrypted byte waits inside OpenSSL while epoll reports nothing).
    static let receiveSize = 64 << 10
    /// Bytes read from one connection per loop turn at most, so one fast upstream cannot hold up the others
    /// (level-triggered epoll reports it again next turn).
    static let receivePerTurn = 256 << 10

    private let multi: CurlMulti
    private let sockets: SocketWatch
    private let destinations: DestinationCheck
    private let configuration: HandleConfiguration
    private let allocator: ByteBufferAllocator
    /// Connections curl is still connecting, by their easy handle.
    private var connecting: [UnsafeMutableRawPointer: CurlConnection] = [:]
    /// Open connections, by socket.
    private var open: [Int32: CurlConnection] = [:]
    private var dirty: [CurlConnection] = []

    init(
        multi: CurlMulti, sockets: SocketWatch, destinations: DestinationCheck, configuration: HandleConfiguration,
        allocator: ByteBufferAllocator
    ) {
        self.multi = multi
        self.sockets = sockets
        self.destinations = destinations
        self.configuration = configuration
        self.allocator = allocator
    }

    var isEmpty: Bool { connecting.isEmpty && open.isEmpty }

    func perform(_ command: ConnectionCommand) {
        switch command {
        case .open(let connection):
            begin(connection)
        case .send(let connection, let buffer):
            guard connection.state != .finished else { return }
            connection.outgoing.append(buffer)
            if connection.state == .open { write(connection) }
        case .receive(let connection, let receiving):
            connection.receiving = receiving
            updateInterest(connection)
        case .close(let connection):
            finish(connection)
        }
    }

    private func begin(_ connection: CurlConnection) {
        guard connection.state == .queued else { return }
        guard let easy = CurlEasy.make() else {
            fail(connection, .connectFailure(detail: "curl cannot create a connection handle: out of memory"))
            return
        }
        connection.easy = easy
        do throws(CurlSetupError) {
            try configuration.configureConnection(easy, for: connection)
        } catch {
            fail(connection, .connectFailure(detail: error.description))
            return
        }
        let code = curl_multi_add_handle(multi.raw, easy.raw)
        guard code == CURLM_OK else {
            fail(connection, .connectFailure(detail: "curl_multi_add_handle failed: \(code.rawValue)"))
            return
        }
        connection.state = .connecting
        connecting[easy.raw] = connection
    }

    /// A `CURLMSG_DONE` for `raw`: true when it is one of ours (curl connected it, or could not).
    func completed(_ raw: UnsafeMutableRawPointer, code: CURLcode) -> Bool {
        guard !connecting.isEmpty, let connection = connecting.removeValue(forKey: raw) else { return false }
        guard code == CURLE_OK, connection.refusal == nil, let easy = connection.easy else {
            let failure: TransportFailure
            if let refusal = connection.refusal {
                failure = refusal
            } else if let easy = connection.easy {
                failure = FailureClassification.failure(
                    CurlFailureFacts(code, easy: easy, lastAddress: connection.lastAddress))
            } else {
                failure = .connectFailure(detail: "connection handle gone")
            }
            fail(connection, failure)
            return true
        }
        let fd = bs_easy_active_socket(easy.raw)
        guard fd >= 0 else {
            fail(connection, .connectFailure(detail: "curl connected but reports no socket"))
            return true
        }
        connection.fd = fd
        connection.state = .open
        // curl parked the socket in epoll (input) when the connect-only transfer ended: what it watches now is
        // not what the connection asked for, so the first `updateInterest` sets it whatever it is.
        connection.watched = -1
        open[fd] = connection
        emit(connection, .connected)
        // The first send or receive attaches the connection to the handle again, which keeps curl's dead-connection
        // pruning away from it; queued bytes (the request head) go at once.
        if connection.outgoing.isEmpty {
            read(connection)
        } else {
            write(connection)
        }
        if connection.state == .open { updateInterest(connection) }
        return true
    }

    /// The open-socket callback of a connection's handle: the destination is checked on the address curl is about
    /// to connect to.
    func openSocket(_ address: UnsafeMutablePointer<curl_sockaddr>, for connection: CurlConnection) -> curl_socket_t {
        let (fd, verdict) = destinations.openSocket(
            address, passthrough: connection.request.passthrough, sockets: sockets)
        if let tried = verdict.address { connection.lastAddress = tried }
        if let refusal = verdict.refusal { connection.refusal = refusal }
        return fd
    }

    /// epoll reported `fd`: true when it is an open connection's socket (and was handled).
    func socketReady(_ fd: Int32, mask: Int32) -> Bool {
        guard !open.isEmpty, let connection = open[fd] else { return false }
        if mask & Int32(CURL_CSELECT_OUT) != 0 || mask & Int32(CURL_CSELECT_ERR) != 0 { write(connection) }
        if connection.state == .open, mask & Int32(CURL_CSELECT_IN) != 0 || mask & Int32(CURL_CSELECT_ERR) != 0 {
            read(connection)
        }
        if connection.state == .open { updateInterest(connection) }
        return true
    }

    private func write(_ connection: CurlConnection) {
        guard let easy = connection.easy else { return }
        var sent = 0
        while var buffer = connection.outgoing.first {
            var n = 0
            let code = buffer.withUnsafeReadableBytes { bytes in
                curl_easy_send(easy.raw, bytes.baseAddress, bytes.count, &n)
            }
            if code == CURLE_AGAIN { break }
            guard code == CURLE_OK else {
                if sent > 0 { emit(connection, .sent(sent)) }
                fail(
                    connection, .reset(detail: "send to upstream failed: \(String(cString: curl_easy_strerror(code)))"))
                return
            }
            sent += n
            buffer.moveReaderIndex(forwardBy: n)
            if buffer.readableBytes == 0 {
                connection.outgoing.removeFirst()
            } else {
                connection.outgoing[connection.outgoing.startIndex] = buffer
            }
        }
        if sent > 0 { emit(connection, .sent(sent)) }
        updateInterest(connection)
    }

    private func read(_ connection: CurlConnection) {
        guard let easy = connection.easy else { return }
        var total = 0
        while connection.receiving, !connection.inputEnded, total < Self.receivePerTurn {
            var buffer = allocator.buffer(capacity: Self.receiveSize)
            var code = CURLE_OK
            var n = 0
            buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: Self.receiveSize) { space in
                code = curl_easy_recv(easy.raw, space.baseAddress, space.count, &n)
                return code == CURLE_OK ? n : 0
            }
            if code == CURLE_AGAIN { break }
            guard code == CURLE_OK else {
                fail(
                    connection,
                    .reset(detail: "receive from upstream failed: \(String(cString: curl_easy_strerror(code)))"))
                return
            }
            if n == 0 {
                connection.inputEnded = true
                emit(connection, .closed)
                finish(connection)
                return
            }
            total += n
            emit(connection, .received(buffer))
        }
    }

    private func updateInterest(_ connection: CurlConnection) {
        guard connection.state == .open else { return }
        let wanted = connection.wantedInterest
        guard wanted != connection.watched else { return }
        connection.watched = wanted
        sockets.relayWants(connection.fd, wanted)
    }

    private func fail(_ connection: CurlConnection, _ failure: TransportFailure) {
        emit(connection, .failure(failure))
        finish(connection)
    }

    /// Ends the connection: epoll stops watching it, curl closes it (`curl_multi_remove_handle` closes the
    /// connection of a `CONNECT_ONLY` handle) and the handle is freed.
    private func finish(_ connection: CurlConnection) {
        guard connection.state != .finished else { return }
        if connection.state == .open {
            if connection.watched != 0 { sockets.relayWants(connection.fd, 0) }
            open[connection.fd] = nil
        }
        if let easy = connection.easy {
            connecting[easy.raw] = nil
            // Fails only for a handle that is not in the multi handle (its `begin` failed at or before
            // `curl_multi_add_handle`): then there is nothing to remove.
            _ = curl_multi_remove_handle(multi.raw, easy.raw)
        }
        connection.easy = nil
        connection.state = .finished
        connection.outgoing.removeAll()
    }

    private func emit(_ connection: CurlConnection, _ event: ConnectionEvent) {
        if connection.pending.isEmpty { dirty.append(connection) }
        connection.pending.append(event)
    }

    /// Hands every connection's pending events to its event loop, one hop per connection.
    func flush() {
        guard !dirty.isEmpty else { return }
        for connection in dirty {
            let events = connection.pending
            connection.pending = []
            let sink = connection.sink
            connection.eventLoop.execute { sink(events) }
        }
        dirty.removeAll(keepingCapacity: true)
    }

    /// The transport is stopping: every connection fails as shut down and lets go of its handle (before the multi
    /// handle is cleaned up).
    func stopAll() {
        for connection in Array(connecting.values) + Array(open.values) { fail(connection, .shutDown) }
        flush()
    }
}

extension CurlMultiTransport: ConnectionOpening {
    /// Opens a raw connection (`CurlConnection`). Events arrive, in order and batched, through `sink` on
    /// `eventLoop`.
    public func connect(
        _ request: ConnectionRequest, on eventLoop: EventLoop, sink: @escaping @Sendable ([ConnectionEvent]) -> Void
    ) -> any ConnectionHandle {
        let connection = CurlConnection(request: request, eventLoop: eventLoop, transport: self, sink: sink)
        submit(.connection(.open(connection)))
        return connection
    }
}

extension CurlTrampolines {
    /// The open-socket callback of a raw connection's handle (its context is the `CurlConnection`).
    static let openConnectionSocket: bs_curl_opensocket_callback = { context, _, address in
        guard let context, let address else { return bs_socket_bad() }
        let connection = Unmanaged<CurlConnection>.fromOpaque(context).takeUnretainedValue()
        return connection.transport.connections.openSocket(address, for: connection)
    }
}
