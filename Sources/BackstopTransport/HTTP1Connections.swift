import BackstopCore
import CCurl
import NIOCore
import Synchronization

/// Where an idle raw connection may serve the next request: the same endpoint, reached the same way (the TLS
/// options, client certificate included, and the passthrough destination rules it was checked against).
struct HTTP1PoolKey: Hashable {
    /// `scheme://authority`, as the URL spells it: a string of its own, so that no connection keeps the URL of
    /// the request that opened it alive.
    var origin: String
    var tls: TransportTLSOptions
    var passthrough: Bool

    static func == (a: HTTP1PoolKey, b: HTTP1PoolKey) -> Bool {
        a.passthrough == b.passthrough && a.origin == b.origin && a.tls == b.tls
    }

    func hash(into hasher: inout Hasher) {
        hasher.combine(origin)
        hasher.combine(passthrough)
        // The common case (no CA file, no client certificate) costs no hashing of the options.
        if !tls.isDefault { hasher.combine(tls) }
    }
}

/// One endpoint the raw HTTP/1.1 path has connections to, interned (`HTTP1Connections.endpoint(for:url:)`): the
/// idle pool is keyed by its number, so taking and parking a connection compares an `Int` rather than copying and
/// comparing a key with strings in it (docs/performance.md#reference-counting-per-request).
final class HTTP1Endpoint {
    let key: HTTP1PoolKey
    /// Unique among the endpoints of one `HTTP1Connections`, forgotten ones included (never reused: a number still
    /// held somewhere never names another endpoint).
    let id: Int
    /// The connections made for this endpoint and not yet closed (connecting, active or idle): one is counted from
    /// the moment curl has its handle (`connect`) until `close`. An endpoint at 0 may be forgotten.
    var connections = 0
    /// A copy of the origin's UTF-8 and whether the TLS options are the default, for `matches`: reading the key's
    /// `String` out of this object to compare it copied (retained and released) the key.
    private let originBytes: UnsafeMutableBufferPointer<UInt8>
    private let defaultTLS: Bool

    init(key: HTTP1PoolKey, id: Int) {
        self.key = key
        self.id = id
        defaultTLS = key.tls.isDefault
        originBytes = key.origin.withUTF8Bytes { bytes in
            let copy = UnsafeMutableBufferPointer<UInt8>.allocate(capacity: bytes.count)
            _ = copy.initialize(from: bytes)
            return copy
        }
    }

    deinit { originBytes.deallocate() }

    /// Whether `request` (whose URL `url` was parsed from) goes to this endpoint, compared in place: building a
    /// key per request to compare it copied (retained) its origin and options.
    func matches(_ request: TransportRequest, url: HTTP1URL) -> Bool {
        guard key.passthrough == request.passthrough, url.pathStart == originBytes.count else { return false }
        // The common case (no CA file, no client certificate) costs no comparing of the options.
        if !(defaultTLS && request.tls.isDefault), key.tls != request.tls { return false }
        guard let mine = originBytes.baseAddress else { return true }
        return request.url.withUTF8Bytes { theirs in memcmp(mine, theirs.baseAddress!, originBytes.count) == 0 }
    }
}

/// One raw upstream HTTP/1.1 connection (docs/performance.md#libcurl-as-the-connection): a `CONNECT_ONLY` easy
/// handle curl connected (destination check, TLS and its verification, client certificate, TLS session reuse),
/// and what Backstop writes and reads on it. The handle is owned here and stays in its group's multi handle
/// (a `DrivenMulti`) until the connection is closed: curl finds a `CONNECT_ONLY` connection through that multi
/// handle's connection cache, and `curl_multi_remove_handle` closes it. Transport thread only (`HTTP1Connections`).
final class HTTP1Connection {
    let endpoint: HTTP1Endpoint
    let secure: Bool
    unowned let transport: CurlMultiTransport
    var easy: CurlEasy?
    var fd: Int32 = -1
    var machine: HTTP1ConnectionMachine
    /// The transfer the connection serves now (nil while idle or closed).
    var transfer: CurlTransfer?
    var reader = HTTP1ResponseReader(requestIsHEAD: false)
    /// Request bytes not yet taken by the socket, and how many of them are the head.
    var outgoing: ByteBuffer
    var headBytesLeft = 0
    var body = BodySource.done
    /// The last send could not take everything: wait until epoll says the socket is writable.
    var writeBlocked = false
    /// What epoll watches the socket for (`CURL_POLL_*` bits; -1: not known).
    var watched: Int32 = -1
    /// A plain connection is read and written with `recv`/`send` once curl's first `curl_easy_send` attached it to
    /// the handle (which keeps curl's pruning of idle connections away from it).
    var attached = false
    var refusal: TransportFailure?
    var lastAddress: String?
    /// Its group's index once it is counted open (`HTTP1Connections.groups`; -1 before).
    var group = -1

    /// Where the rest of the request body comes from.
    enum BodySource {
        case done
        case buffer(ByteBuffer)
        case stream(RequestBodyStream, chunked: Bool)
    }

    init(
        endpoint: HTTP1Endpoint, secure: Bool, transport: CurlMultiTransport, mayResend: Bool,
        allocator: ByteBufferAllocator
    ) {
        self.endpoint = endpoint
        self.secure = secure
        self.transport = transport
        self.machine = HTTP1ConnectionMachine(mayResend: mayResend)
        self.outgoing = allocator.buffer(capacity: 0)
    }
}

/// The transport thread's side of the raw HTTP/1.1 path: starts transfers on idle or new connections, writes their
/// requests, reads their responses into transport events, and pools, resends or closes connections as
/// `HTTP1ConnectionMachine` decides. Completions are collected for the transport, whose `TransferTable` decides
/// what becomes of each transfer (`takeCompletions`). Transport thread only (owned by `CurlMultiTransport`).
final class HTTP1Connections {
    /// How much one read asks for.
    static let receiveSize = 64 << 10
    /// Bytes read from one connection per loop turn at most (level-triggered epoll reports it again next turn).
    static let receivePerTurn = 256 << 10
    /// A buffered body up to this size goes out with the head, in one send.
    static let inlineBody = 16 << 10
    static let maxIdle = 1024
    /// Connections per multi handle (`GroupSlots`): curl's walk to a connection, on every send and receive, covers at
    /// most this many.
    static let connectionsPerGroup = 64
    /// Endpoints the table holds before those without a connection are forgotten (`forgetUnused`). Configurations
    /// name tens of upstreams, so only passthrough to ever-new hosts reaches it (the growth it stops); as many as the
    /// idle connections kept (`maxIdle`). 1,024 endpoints take under a megabyte (key, copied origin, table slot,
    /// pool bucket), and a sweep visits at most two endpoints per endpoint interned since the last one (`sweepAt`).
    static let maxEndpoints = 1024

    /// The multi handles connections are made in, by slot of `groupSlots`.
    private(set) var groups: [DrivenMulti] = []
    private var groupSlots = GroupSlots(perGroup: HTTP1Connections.connectionsPerGroup)
    private let sockets: SocketWatch
    private let destinations: DestinationCheck
    private let configuration: HandleConfiguration
    private let allocator: ByteBufferAllocator
    private var connecting: [UnsafeMutableRawPointer: HTTP1Connection] = [:]
    /// Open connections (active or idle), by socket.
    private var open: [Int32: HTTP1Connection] = [:]
    private var pool = IdleConnectionPool<Int, HTTP1Connection>(capacity: HTTP1Connections.maxIdle)
    /// The endpoints in use or used lately, and the one used last (requests to one endpoint follow one another:
    /// it is compared in place, with no key built and no hashing). An endpoint stays after its last connection
    /// closed, so the next request to it allocates nothing, until the table reaches `sweepAt`: then those with
    /// no connection are forgotten, with their pool buckets (`forgetUnused`). Every endpoint with a connection
    /// is in here.
    private var endpoints: [HTTP1PoolKey: HTTP1Endpoint] = [:]
    private var lastEndpoint: HTTP1Endpoint?
    /// The next endpoint's `id`.
    private var nextEndpointID = 0
    /// The table's size at which interning a new endpoint sweeps it first: `maxEndpoints`, or twice the endpoints
    /// the last sweep kept (all in use) when that is more. So a sweep that frees little is not repeated for every
    /// new endpoint: between two sweeps at least half as many endpoints are interned as the second one visits. The
    /// table holds at most `max(maxEndpoints, 2 × the endpoints in use at the last sweep)`, and endpoints in use are
    /// bounded by the connections, which are bounded elsewhere.
    private var sweepAt: Int
    private let maxEndpoints: Int
    /// `endpoints.count`, published for tests (any thread may read it); stored only when the table changes size.
    private let publishedEndpointCount = Atomic<Int>(0)
    /// Where reads land before they are parsed (body bytes are copied out in exact-size buffers).
    private let scratch = UnsafeMutableRawBufferPointer.allocate(byteCount: receiveSize, alignment: 16)
    private var completions: [(CurlTransfer, TransferCompletion)] = []

    init(
        sockets: SocketWatch, destinations: DestinationCheck, configuration: HandleConfiguration,
        allocator: ByteBufferAllocator, maxEndpoints: Int = HTTP1Connections.maxEndpoints
    ) {
        precondition(maxEndpoints > 0, "the endpoint table needs room for one endpoint")
        self.sockets = sockets
        self.destinations = destinations
        self.configuration = configuration
        self.allocator = allocator
        self.maxEndpoints = maxEndpoints
        sweepAt = maxEndpoints
    }

    deinit { scratch.deallocate() }

    var hasCompletions: Bool { !completions.isEmpty }

    /// How many endpoints the table holds now (tests; any thread).
    var endpointCount: Int { publishedEndpointCount.load(ordering: .relaxed) }

    /// The transfers whose connection machine completed them since the last call, oldest first, swapped into
    /// `batch` (emptied first): both arrays keep their storage, where returning a copy and emptying this one
    /// allocated a new array per call.
    func takeCompletions(into batch: inout [(CurlTransfer, TransferCompletion)]) {
        batch.removeAll(keepingCapacity: true)
        swap(&completions, &batch)
    }

    // MARK: transfers

    /// Closes the idle connections too old to be used (`IdleConnectionPool.expire`), at most once every
    /// `expirySweepMS`: the transport calls it every turn, and its turns come at least once a second.
    func closeExpiredIdle(now: Int64) {
        guard now >= nextExpirySweep else { return }
        nextExpirySweep = now + Self.expirySweepMS
        guard pool.count > 0 else { return }
        for connection in pool.expire(now: now) { close(connection) }
    }

    /// How often idle connections are looked at for their age: an unusable one lives at most this long past 118 s.
    static let expirySweepMS: Int64 = 5_000
    private var nextExpirySweep: Int64 = 0

    /// Starts `transfer` on an idle connection to its endpoint, else on a new one; nil, or why it could not.
    func begin(_ transfer: CurlTransfer, url: HTTP1URL) -> String? {
        let endpoint = endpoint(for: transfer.request, url: url)
        let (idle, expired) = pool.take(endpoint.id, now: bs_monotonic_ms())
        for connection in expired { close(connection) }
        guard let connection = idle else { return connect(transfer, url: url, endpoint: endpoint) }
        attach(transfer, to: connection, url: url)
        perform(connection.machine.reuse(mayResend: transfer.mayRewindBody), on: connection)
        return nil
    }

    /// The interned endpoint `request` goes to (`url` is its URL, parsed).
    private func endpoint(for request: TransportRequest, url: HTTP1URL) -> HTTP1Endpoint {
        if let last = lastEndpoint, last.matches(request, url: url) { return last }
        let key = HTTP1PoolKey(
            origin: String(url.origin(in: request.url)), tls: request.tls, passthrough: request.passthrough)
        if let known = endpoints[key] {
            lastEndpoint = known
            return known
        }
        if endpoints.count >= sweepAt { forgetUnused() }
        let endpoint = HTTP1Endpoint(key: key, id: nextEndpointID)
        nextEndpointID += 1
        endpoints[key] = endpoint
        lastEndpoint = endpoint
        publishedEndpointCount.store(endpoints.count, ordering: .relaxed)
        return endpoint
    }

    /// Forgets the endpoints no connection uses (none connecting, open or idle), and their emptied pool buckets:
    /// passthrough to ever-new hosts would otherwise grow the table and the pool by one per host, for good. Only
    /// `endpoint(for:)` calls it, just before interning a new endpoint; an endpoint it keeps has a connection, so
    /// no connection ever belongs to a forgotten endpoint (`assertInterned`).
    private func forgetUnused() {
        var kept: [HTTP1PoolKey: HTTP1Endpoint] = [:]
        for (key, endpoint) in endpoints {
            if endpoint.connections > 0 {
                kept[key] = endpoint
            } else {
                // An endpoint without connections has no idle one either.
                let dropped = pool.removeEmptyBucket(endpoint.id)
                assert(dropped, "an endpoint without connections has idle connections")
            }
        }
        endpoints = kept
        if let last = lastEndpoint, last.connections == 0 { lastEndpoint = nil }
        sweepAt = max(maxEndpoints, 2 * endpoints.count)
        publishedEndpointCount.store(endpoints.count, ordering: .relaxed)
    }

    /// Debug builds: `endpoint` is the table's, so a connection made for it or parked under its `id` can be found
    /// again. `forgetUnused` forgets only endpoints without connections, and a connection is made only for the
    /// endpoint `endpoint(for:)` just returned (no sweep in between) or for the endpoint of the connection it
    /// replaces (`resend`, again with no sweep in between): a connection under a forgotten endpoint would be parked
    /// under an `id` no request looks up, open until it expires and never counted against a sweep.
    private func assertInterned(_ endpoint: HTTP1Endpoint) {
        assert(endpoints[endpoint.key] === endpoint, "a connection for an endpoint the table forgot")
    }

    /// The transfer ended (`TransferTable`'s finish): its connection goes idle or is closed.
    func detach(_ transfer: CurlTransfer) {
        guard let connection = transfer.connection else { return }
        transfer.connection = nil
        connection.transfer = nil
        connection.body = .done
        perform(connection.machine.handle(.detached), on: connection)
    }

    /// Sends the transfer again on a new connection (`StaleConnection`); nil, or why it could not.
    func resend(_ transfer: CurlTransfer, url: HTTP1URL) -> String? {
        guard let old = transfer.connection else { preconditionFailure("a resend without a connection") }
        detach(transfer)
        let rewound = transfer.rewindBody()
        assert(rewound, "the table resends only a transfer whose body rewinds")
        return connect(transfer, url: url, endpoint: old.endpoint)
    }

    /// The requester caught up or the request body has more: read and write again.
    func resume(_ transfer: CurlTransfer) {
        guard let connection = transfer.connection, connection.fd >= 0 else { return }
        if !connection.writeBlocked { write(connection) }
        if connection.transfer != nil { read(connection) }
        if connection.transfer != nil { updateInterest(connection) }
    }

    private func attach(_ transfer: CurlTransfer, to connection: HTTP1Connection, url: HTTP1URL) {
        connection.transfer = transfer
        transfer.connection = connection
        // `transfer.request` is read in place throughout: a local copy of it retained and released every field.
        let framing = HTTP1RequestHead.framing(of: transfer.request)
        connection.reader.restart(requestIsHEAD: transfer.request.method == "HEAD")
        let sendsBody = framing != .none && framing != .length(0)
        // The transfer's own copy of a buffered body (rewound for a resend); a small one goes out with the head, in
        // the head's buffer.
        var inline: ByteBuffer?
        if sendsBody, case .buffered = transfer.request.body, let body = transfer.bufferedBody,
            body.readableBytes > 0, body.readableBytes <= Self.inlineBody
        {
            inline = body
        }
        var buffer = HTTP1RequestHead.buffer(
            transfer.request, url: url, framing: framing, extraCapacity: inline?.readableBytes ?? 0,
            allocator: allocator)
        connection.headBytesLeft = buffer.readableBytes
        connection.body = .done
        if sendsBody {
            switch transfer.request.body {
            case .buffered:
                if var body = inline {
                    buffer.writeBuffer(&body)
                } else if let body = transfer.bufferedBody, body.readableBytes > 0 {
                    connection.body = .buffer(body)
                }
            case .streaming(let stream):
                connection.body = .stream(stream, chunked: framing == .chunked)
            case .empty:
                break
            }
        }
        connection.outgoing = buffer
    }

    /// A new connection for `transfer`: curl connects it (`completed` follows).
    private func connect(_ transfer: CurlTransfer, url: HTTP1URL, endpoint: HTTP1Endpoint) -> String? {
        let connection = HTTP1Connection(
            endpoint: endpoint, secure: url.secure, transport: transfer.transport, mayResend: transfer.mayRewindBody,
            allocator: allocator)
        guard let easy = CurlEasy.make() else { return "curl cannot create a connection handle: out of memory" }
        connection.easy = easy
        do throws(CurlSetupError) {
            try configuration.configureConnectOnly(
                easy, url: endpoint.key.origin, connectTimeout: transfer.request.connectTimeout,
                tls: transfer.request.tls,
                context: Unmanaged.passUnretained(connection).toOpaque(), open: CurlTrampolines.openHTTP1Socket)
            // `read` reads a TLS connection on until curl has nothing, and `resume` reads before waiting for epoll:
            // no record read ahead is left waiting in OpenSSL (docs/performance.md#syscalls-and-wake-ups-per-request).
            if url.secure { try easy.setTLSReadAhead() }
        } catch {
            return error.description
        }
        let slot = groupSlots.slotWithRoom
        if slot == groups.count {
            guard let group = DrivenMulti(index: slot, sockets: sockets) else {
                return "curl cannot create a multi handle for new connections: out of memory"
            }
            groups.append(group)
        }
        let code = curl_multi_add_handle(groups[slot].multi.raw, easy.raw)
        guard code == CURLM_OK else {
            return "curl_multi_add_handle failed: \(String(cString: curl_multi_strerror(code)))"
        }
        groupSlots.opened(slot)
        connection.group = slot
        // Counted from here, where curl has it and `close` will end it (before, a failure just drops it, unused).
        assertInterned(endpoint)
        endpoint.connections += 1
        connecting[easy.raw] = connection
        attach(transfer, to: connection, url: url)
        return nil
    }

    // MARK: curl and epoll

    /// The open-socket callback of a connection's handle: the destination is checked on the address curl is about
    /// to connect to.
    func openSocket(_ address: UnsafeMutablePointer<curl_sockaddr>, for connection: HTTP1Connection) -> curl_socket_t {
        let (fd, verdict) = destinations.openSocket(
            address, passthrough: connection.endpoint.key.passthrough, sockets: sockets)
        if let tried = verdict.address { connection.lastAddress = tried }
        if let refusal = verdict.refusal { connection.refusal = refusal }
        return fd
    }

    /// A `CURLMSG_DONE` for `raw`: true when it is one of ours (curl connected it, or could not).
    func completed(_ raw: UnsafeMutableRawPointer, code: CURLcode) -> Bool {
        guard !connecting.isEmpty, let connection = connecting.removeValue(forKey: raw) else { return false }
        guard let easy = connection.easy else { return true }
        guard code == CURLE_OK, connection.refusal == nil else {
            let failure =
                connection.refusal
                ?? FailureClassification.failure(
                    CurlFailureFacts(code, easy: easy, lastAddress: connection.lastAddress))
            perform(connection.machine.handle(.connectFailed(failure)), on: connection)
            return true
        }
        let fd = bs_easy_active_socket(easy.raw)
        guard fd >= 0 else {
            perform(
                connection.machine.handle(
                    .connectFailed(.connectFailure(detail: "curl connected but reports no socket"))),
                on: connection)
            return true
        }
        connection.fd = fd
        // curl parked the socket in epoll (input) when the connect-only transfer ended: what it watches now is not
        // what the connection asks for, so the first `updateInterest` sets it whatever it is.
        connection.watched = -1
        open[fd] = connection
        perform(connection.machine.handle(.connected), on: connection)
        return true
    }

    /// epoll reported `fd`: true when it is one of the raw connections' sockets (and was handled).
    func socketReady(_ fd: Int32, mask: Int32) -> Bool {
        guard !open.isEmpty, let connection = open[fd] else { return false }
        guard connection.transfer != nil else {
            // Idle: the upstream closed it or sent what nobody asked for.
            if pool.remove(connection, connection.endpoint.id) {
                perform(connection.machine.handle(.readableWhileIdle), on: connection)
            }
            return true
        }
        let error = mask & Int32(CURL_CSELECT_ERR) != 0
        if mask & Int32(CURL_CSELECT_OUT) != 0 || error {
            connection.writeBlocked = false
            write(connection)
        }
        if connection.transfer != nil, mask & Int32(CURL_CSELECT_IN) != 0 || error { read(connection) }
        if connection.transfer != nil { updateInterest(connection) }
        return true
    }

    // MARK: the machine's actions

    private func perform(_ action: HTTP1ConnectionMachine.Action, on connection: HTTP1Connection) {
        switch action {
        case .none:
            break
        case .writeRequest:
            write(connection)
            if connection.transfer != nil {
                // Anything already there (an early answer, or the end of a connection that died while idle).
                updateInterest(connection)
            }
        case .complete(let completion):
            guard let transfer = connection.transfer else { return }
            completions.append((transfer, completion))
        case .park:
            assertInterned(connection.endpoint)
            if pool.put(connection, connection.endpoint.id, now: bs_monotonic_ms()) {
                updateInterest(connection)
            } else {
                close(connection)
            }
        case .close:
            close(connection)
        }
    }

    /// Writes what the socket takes of the request; events to the machine as the head and the body go out.
    private func write(_ connection: HTTP1Connection) {
        while connection.transfer != nil, connection.machine.isExchanging {
            if connection.outgoing.readableBytes == 0, !refill(connection) { return }
            var sent = 0
            let outcome = connection.outgoing.withUnsafeReadableBytes { send($0, on: connection, sent: &sent) }
            if sent > 0 {
                connection.outgoing.moveReaderIndex(forwardBy: sent)
                if connection.headBytesLeft > 0 {
                    connection.headBytesLeft = max(0, connection.headBytesLeft - sent)
                    if connection.headBytesLeft == 0 {
                        let bodyFollows: Bool
                        if case .done = connection.body {
                            bodyFollows = connection.outgoing.readableBytes > 0
                        } else {
                            bodyFollows = true
                        }
                        perform(connection.machine.handle(.headWritten(bodyFollows: bodyFollows)), on: connection)
                        if !bodyFollows { return }
                    }
                }
            }
            switch outcome {
            case .ok:
                continue
            case .wouldBlock:
                connection.writeBlocked = true
                return
            case .failed(let why):
                perform(connection.machine.handle(.sendFailed(why)), on: connection)
                return
            }
        }
    }

    /// Fills `outgoing` with the next part of the body; false when there is nothing to write now (written, waiting
    /// for the client, or failed).
    private func refill(_ connection: HTTP1Connection) -> Bool {
        switch connection.body {
        case .done:
            if case .writingBody = connection.machine.phase {
                perform(connection.machine.handle(.bodyWritten), on: connection)
            }
            return false
        case .buffer(let buffer):
            connection.outgoing = buffer
            connection.body = .done
            return true
        case .stream(let stream, let chunked):
            var buffer = allocator.buffer(capacity: Self.receiveSize + 32)
            var result = RequestBodyStream.ReadResult.pause
            let headroom = chunked ? 18 : 0
            buffer.moveWriterIndex(forwardBy: headroom)
            buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: Self.receiveSize) { space in
                result = stream.read(into: UnsafeMutableRawBufferPointer(rebasing: space[0..<Self.receiveSize]))
                if case .bytes(let n) = result { return n }
                return 0
            }
            switch result {
            case .bytes(let n):
                if chunked {
                    // "<hex>\r\n" just before the data, "\r\n" after it.
                    let size = Array((String(n, radix: 16) + "\r\n").utf8)
                    buffer.moveReaderIndex(to: headroom - size.count)
                    buffer.setBytes(size, at: headroom - size.count)
                    buffer.writeStaticString("\r\n")
                } else {
                    buffer.moveReaderIndex(to: 0)
                }
                connection.outgoing = buffer
                return true
            case .end:
                connection.body = .done
                if chunked {
                    var last = allocator.buffer(capacity: 5)
                    last.writeStaticString("0\r\n\r\n")
                    connection.outgoing = last
                    return true
                }
                return refill(connection)
            case .pause:
                return false
            case .abort:
                connection.body = .done
                perform(connection.machine.handle(.requestBodyFailed), on: connection)
                return false
            }
        }
    }

    private enum IOOutcome {
        case ok
        case wouldBlock
        case failed(String)
    }

    private func send(_ bytes: UnsafeRawBufferPointer, on connection: HTTP1Connection, sent: inout Int) -> IOOutcome {
        // The handle is taken (retained) only where curl sends: a plain attached connection needs only its socket.
        guard connection.easy != nil else { return .failed("connection closed") }
        if connection.secure || !connection.attached, let easy = connection.easy {
            var n = 0
            let code = curl_easy_send(easy.raw, bytes.baseAddress, bytes.count, &n)
            connection.attached = true
            sent = n
            if code == CURLE_AGAIN { return .wouldBlock }
            guard code == CURLE_OK else {
                return .failed(failureText("send to upstream failed", curl: code, connection))
            }
            return .ok
        }
        let n = bs_send(connection.fd, bytes.baseAddress, bytes.count)
        if n >= 0 {
            sent = n
            return .ok
        }
        let error = Int32(-n)
        if error == EAGAIN || error == EWOULDBLOCK { return .wouldBlock }
        if error == EINTR { return .ok }
        return .failed(failureText("send to upstream failed", errno: error, connection))
    }

    /// Reads what the socket has (up to `receivePerTurn`) through the response reader.
    private func read(_ connection: HTTP1Connection) {
        var total = 0
        // TLS reads on until curl has nothing: a record it decrypted and holds back would wake no epoll.
        while let transfer = connection.transfer, connection.machine.isExchanging,
            connection.secure || total < Self.receivePerTurn
        {
            if transfer.shouldPauseReceiving() { return }
            var n = 0
            switch receive(connection, count: &n) {
            case .wouldBlock:
                return
            case .failed(let why):
                perform(connection.machine.handle(.receiveFailed(why)), on: connection)
                return
            case .ok where n == 0:
                let event = connection.reader.inputEnded()
                handle(event, range: 0..<0, last: true, on: connection)
                return
            case .ok:
                total += n
                parse(UnsafeRawBufferPointer(rebasing: scratch[0..<n]), on: connection)
                // A short plain read emptied the socket: level-triggered epoll reports more when it comes.
                if !connection.secure && n < scratch.count { return }
            }
        }
    }

    private func receive(_ connection: HTTP1Connection, count: inout Int) -> IOOutcome {
        // As in `send`: the handle only where curl reads.
        guard connection.easy != nil else { return .failed("connection closed") }
        if connection.secure || !connection.attached, let easy = connection.easy {
            var n = 0
            let code = curl_easy_recv(easy.raw, scratch.baseAddress, scratch.count, &n)
            connection.attached = true
            count = n
            if code == CURLE_AGAIN { return .wouldBlock }
            guard code == CURLE_OK else {
                return .failed(failureText("receive from upstream failed", curl: code, connection))
            }
            return .ok
        }
        let n = bs_recv(connection.fd, scratch.baseAddress, scratch.count)
        if n >= 0 {
            count = n
            return .ok
        }
        let error = Int32(-n)
        if error == EAGAIN || error == EWOULDBLOCK || error == EINTR { return .wouldBlock }
        return .failed(failureText("receive from upstream failed", errno: error, connection))
    }

    private func parse(_ bytes: UnsafeRawBufferPointer, on connection: HTTP1Connection) {
        if !connection.reader.started { perform(connection.machine.handle(.responseBytes), on: connection) }
        // Taken once: each `connection.transfer` read for an event retained and released it. Only `close` changes
        // the connection's transfer while it parses (to nil).
        guard let transfer = connection.transfer else { return }
        var offset = 0
        while connection.transfer === transfer, connection.machine.isExchanging {
            // The head's payload is still copied out of the event (one retain of its box, one release with the
            // event): the compiler does not move it out here, `consume` of the event or not (callgrind).
            switch connection.reader.next(bytes, at: &offset) {
            case .needMore:
                return
            case .body(let range):
                emitBody(UnsafeRawBufferPointer(rebasing: bytes[range]), to: transfer)
            case .head(let head):
                transfer.emit(.head(head))
                perform(connection.machine.handle(.headArrived), on: connection)
            case let event:
                if case .end = event, offset < bytes.count, connection.reader.bodyFramedByLength {
                    // Bytes right after a body framed by its length: a longer body than the head announced. Handed
                    // on as body, so the client's framing counter closes the client's connection after the
                    // announced bytes; none of them is written (docs/reference/behaviour.md#untrusted-upstream-responses).
                    emitBody(UnsafeRawBufferPointer(rebasing: bytes[offset...]), to: transfer)
                }
                handle(event, range: offset..<bytes.count, last: offset == bytes.count, on: connection)
                return
            }
        }
    }

    /// A reader event other than body bytes; `last`: nothing of the read follows it.
    private func handle(
        _ event: HTTP1ResponseReader.Event, range: Range<Int>, last: Bool, on connection: HTTP1Connection
    ) {
        switch event {
        case .needMore, .body:
            return
        case .head(let head):
            connection.transfer?.emit(.head(head))
            perform(connection.machine.handle(.headArrived), on: connection)
        case .end(let reusable):
            // Bytes after the response nobody asked for: the connection cannot be trusted with another request.
            perform(connection.machine.handle(.responseEnded(reusable: reusable && last)), on: connection)
        case .invalid(let why):
            perform(connection.machine.handle(.responseInvalid(withAddress(why, connection))), on: connection)
        case .truncated(let why):
            perform(connection.machine.handle(.responseTruncated(withAddress(why, connection))), on: connection)
        }
    }

    private func emitBody(_ bytes: UnsafeRawBufferPointer, to transfer: CurlTransfer) {
        guard !bytes.isEmpty else { return }
        var buffer = allocator.buffer(capacity: bytes.count)
        buffer.writeBytes(bytes)
        transfer.unconsumedBytes.add(bytes.count, ordering: .acquiringAndReleasing)
        // `consume`: handed over, where passing the `var` copied it (a retain and a release of its storage).
        transfer.emit(.body(consume buffer))
    }

    private func updateInterest(_ connection: HTTP1Connection) {
        guard connection.fd >= 0 else { return }
        var wanted = SocketInterest.input
        if let transfer = connection.transfer {
            if transfer.receivePaused.load(ordering: .relaxed) { wanted = 0 }
            if connection.writeBlocked { wanted |= SocketInterest.output }
        }
        guard wanted != connection.watched else { return }
        connection.watched = wanted
        sockets.relayWants(connection.fd, wanted)
    }

    /// Ends the connection: curl closes it (`curl_multi_remove_handle` closes the connection of a `CONNECT_ONLY`
    /// handle, through the close-socket callback, which also takes it out of epoll) and the handle is freed. The one
    /// place a counted connection ends (connect failures, broken or unwanted connections, expired or closed idle
    /// ones and `stopAll` all come here): its endpoint's count goes down once, with the handle.
    private func close(_ connection: HTTP1Connection) {
        if connection.fd >= 0 {
            open[connection.fd] = nil
            connection.fd = -1
        }
        if let transfer = connection.transfer {
            transfer.connection = nil
            connection.transfer = nil
        }
        connection.body = .done
        guard let easy = connection.easy else { return }
        connecting[easy.raw] = nil
        // Every counted connection is in its group's multi handle, where removing it cannot fail.
        if groups.indices.contains(connection.group) {
            _ = curl_multi_remove_handle(groups[connection.group].multi.raw, easy.raw)
            groupSlots.closed(connection.group)
            connection.group = -1
        }
        connection.easy = nil
        connection.endpoint.connections -= 1
        assert(connection.endpoint.connections >= 0, "an endpoint closed more connections than it had")
    }

    /// The transport is stopping (its transfers have finished): every connection is closed, then the groups' multi
    /// handles, before the transport's is cleaned up.
    func stopAll() {
        for connection in pool.removeAll() { close(connection) }
        for connection in Array(connecting.values) + Array(open.values) { close(connection) }
        for group in groups { group.cleanup() }
        groups.removeAll()
        groupSlots = GroupSlots(perGroup: Self.connectionsPerGroup)
    }

    // MARK: causes

    private func failureText(_ what: String, curl code: CURLcode, _ connection: HTTP1Connection) -> String {
        withAddress("\(what): curl=\(code.rawValue) (\(String(cString: curl_easy_strerror(code))))", connection)
    }

    private func failureText(_ what: String, errno error: Int32, _ connection: HTTP1Connection) -> String {
        withAddress("\(what): errno=\(error) (\(String(cString: strerror(error))))", connection)
    }

    private func withAddress(_ text: String, _ connection: HTTP1Connection) -> String {
        guard let address = connection.lastAddress else { return text }
        return "\(text) address=\(address)"
    }
}

extension CurlTrampolines {
    /// The open-socket callback of a raw HTTP/1.1 connection's handle (its context is the `HTTP1Connection`).
    static let openHTTP1Socket: bs_curl_opensocket_callback = { context, _, address in
        guard let context, let address else { return bs_socket_bad() }
        let connection = Unmanaged<HTTP1Connection>.fromOpaque(context).takeUnretainedValue()
        return connection.transport.http1.openSocket(address, for: connection)
    }
}
