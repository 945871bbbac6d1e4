import BackstopCore
import CCurl
import Foundation
import NIOCore
import NIOConcurrencyHelpers
import Synchronization

/// The upstream HTTP engine: one dedicated thread driving a libcurl multi handle with `curl_multi_socket_action`
/// on its own epoll instance.
///
/// curl tells the engine which sockets to watch (socket callback → `epoll_ctl`) and when its next timeout is due
/// (timer callback); the thread sleeps in `epoll_wait` and hands curl only the sockets that are ready, so a loop
/// turn costs the same with 32 or 4,000 upstream connections (`curl_multi_poll` + `curl_multi_perform` scan every
/// socket and every transfer on each turn). Other threads submit commands (start, cancel, resume) through a
/// locked queue and wake the thread through an eventfd only when it sleeps. Events of each transfer are batched
/// per loop turn and delivered with one hop onto the requester's event loop. The multi handle keeps upstream
/// connections alive and multiplexes HTTP/2 where the upstream offers it over TLS.
///
/// `@unchecked Sendable`: `multi`, `active`, `dirty`, `timerDeadline`, `interest` and the idle handles are
/// touched only on the transport thread (inside `run()` and the curl callbacks it triggers: socket, timer,
/// open/close-socket, header, write, read and seek, all called from `curl_multi_*` on this thread); other threads use only
/// `commands` (a locked box), `sleeping` (an atomic) and `submit`'s `write` to the eventfd, which is safe from any thread.
/// The same confinement is why those properties are `@exclusivity(unchecked)` (the run-time check is ~60
/// instructions per access, several per request): on one thread, a conflicting access would need a nested one,
/// and none of their accesses spans a call that could come back to the same property — curl's callbacks run
/// inside `curl_multi_*` calls, never inside an access to one of these (`CurlTransfer` says the same of its own).
public final class CurlMultiTransport: TransferStarting, @unchecked Sendable {
    enum Command {
        case start(CurlTransfer)
        case cancel(CurlTransfer)
        case resumeReceive(CurlTransfer)
        case resumeSend(CurlTransfer)
        case abandon(CurlTransfer, deadlineMS: Int64)
        case stop
    }

    let allocator = ByteBufferAllocator()
    private let multi: UnsafeMutableRawPointer
    /// TLS sessions shared by every easy handle, so a new connection to an upstream resumes a session another
    /// handle's connection made instead of a full handshake (curl keeps sessions per handle otherwise; a share handle
    /// matches them on host, port and TLS options, so upstreams with different CA files never share one). Used on
    /// the transport thread only, hence no lock callbacks. Nil when curl cannot make one: every handshake is full.
    private let tlsSessions: UnsafeMutableRawPointer?
    /// The epoll instance watching curl's sockets and `wakeFD`.
    private let epollFD: Int32
    /// An eventfd other threads write to when the transport thread sleeps with commands waiting.
    private let wakeFD: Int32
    /// When curl wants `CURL_SOCKET_TIMEOUT` handled next (monotonic ms), or nil for no timer.
    @exclusivity(unchecked) private var timerDeadline: Int64?
    /// Locks in this project are NIO's pthread-based boxes rather than `Synchronization.Mutex`: a contended
    /// `Mutex` on Linux hands ownership over through `FUTEX_LOCK_PI` in the kernel, which ThreadSanitizer cannot
    /// see, so it reported every hand-off through a contended lock as a race and hid the real ones.
    private let commands = NIOLockedValueBox<[Command]>([])
    private let sleeping = Atomic<Bool>(false)
    private let stopped = Atomic<Bool>(false)
    @exclusivity(unchecked) private var active: [ObjectIdentifier: CurlTransfer] = [:]
    @exclusivity(unchecked) private var dirty: [CurlTransfer] = []
    /// Idle easy handles kept for reuse, with their fixed options (`setFixedOptions`), buffers and DNS/TLS caches.
    @exclusivity(unchecked) private var idleHandles = IdleHandlePool<UnsafeMutableRawPointer>(capacity: CurlMultiTransport.maxIdleHandles)
    /// Transfers nobody waits for any more, left to finish (connection reuse) until their deadline (monotonic ms).
    private var abandoned: [(transfer: CurlTransfer, deadline: Int64)] = []
    private static let maxIdleHandles = 256
    /// The transport thread's stack: curl's callbacks and the loop need little.
    static let threadStackSize = 1 << 20
    /// Upstream connections curl keeps open for reuse.
    static let maxCachedConnections = 1024
    /// What epoll watches of curl's sockets (transport thread only).
    @exclusivity(unchecked) private var interest = SocketInterest()
    /// Where connections may go (own listeners, passthrough restrictions); set by the server once it is bound.
    private let destinationGuard = NIOLockedValueBox(DestinationGuard())
    private var thread: Thread?
    private let finishedSignal = NIOLockedValueBox<CheckedContinuation<Void, Never>?>(nil)
    private let threadDone = Atomic<Bool>(false)

    /// Creates the engine and starts its thread.
    public init(name: String = "backstop-curl") {
        CurlGlobal.initialize()
        guard let multi = curl_multi_init() else { fatalError("curl_multi_init failed (out of memory)") }
        self.multi = multi
        tlsSessions = bs_share_tls_sessions()
        epollFD = epoll_create1(Int32(EPOLL_CLOEXEC))
        wakeFD = bs_wake_fd_create()
        guard epollFD >= 0, wakeFD >= 0, bs_epoll_watch(epollFD, wakeFD, CURL_POLL_IN, 1) == 0 else {
            fatalError("cannot create the transport's epoll instance or eventfd (errno \(errno))")
        }
        // The callbacks get the transport as an unretained pointer: it outlives the multi handle (cleaned up at
        // the end of `run()`, which holds `self`).
        let context = Unmanaged.passUnretained(self).toOpaque()
        let handle = CurlMulti(raw: multi)
        do throws(CurlSetupError) {
            try handle.set(CURLMOPT_PIPELINING, Int(CURLPIPE_MULTIPLEX))
            try handle.set(CURLMOPT_MAXCONNECTS, Self.maxCachedConnections)
            try handle.setSocketCallback(curlSocketCallback, context: context)
            try handle.setTimerCallback(curlTimerCallback, context: context)
        } catch {
            fatalError("libcurl cannot be set up: \(error)")
        }
        let thread = Thread { [self] in
            // Threads inherit their creator's kernel name; Foundation's `name` does not reach the kernel here, and
            // `top -H`, `perf` and core dumps would show a Dispatch queue's name instead.
            bs_set_thread_name(name)
            self.run()
        }
        thread.name = name
        thread.stackSize = Self.threadStackSize
        self.thread = thread
        thread.start()
    }

    /// Starts an attempt. Events arrive, in order and batched, through `sink` on `eventLoop`.
    public func start(
        _ request: TransportRequest, on eventLoop: EventLoop,
        sink: @escaping @Sendable ([TransportEvent]) -> Void
    ) -> any TransferHandle {
        let transfer = CurlTransfer(request: request, eventLoop: eventLoop, transport: self, sink: sink)
        if case .streaming(let stream) = request.body {
            stream.setResumeConsumer { [weak transfer, weak self] in
                guard let transfer, let self else { return }
                self.submit(.resumeSend(transfer))
            }
        }
        submit(.start(transfer))
        return transfer
    }

    /// The transport thread's id (0 until it runs), for the debug check below.
    private let transportThread = Atomic<UInt>(0)

    /// Debug builds check the "only on the transport thread" claims behind the `@unchecked Sendable` of this type
    /// and of `CurlTransfer`.
    @inline(__always)
    func assertOnTransportThread(_ what: StaticString = #function) {
        assert(isTransportThread, "\(what) must run on the transport thread")
    }

    var isTransportThread: Bool { transportThread.load(ordering: .acquiring) == UInt(pthread_self()) }

    /// Replaces the rules for where new upstream connections may go (checked on the resolved address each time
    /// a connection is opened).
    public func setDestinationGuard(_ guardian: DestinationGuard) {
        destinationGuard.withLockedValue { $0 = guardian }
    }

    /// Stops the thread after cancelling every transfer; returns when it has exited.
    public func shutdown() async {
        if stopped.exchange(true, ordering: .acquiringAndReleasing) { return }
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let alreadyDone = finishedSignal.withLockedValue { slot -> Bool in
                if threadDone.load(ordering: .acquiring) { return true }
                slot = continuation
                return false
            }
            if alreadyDone { continuation.resume() }
            submit(.stop)
        }
    }

    func submit(_ command: Command) {
        commands.withLockedValue { $0.append(command) }
        if sleeping.exchange(false, ordering: .sequentiallyConsistent) {
            bs_wake_fd_signal(wakeFD)
        }
    }

    func markDirty(_ transfer: CurlTransfer) { dirty.append(transfer) }

    // MARK: the transport thread

    private func run() {
        var running: Int32 = 0
        var stopping = false
        transportThread.store(UInt(pthread_self()), ordering: .releasing)
        let capacity = Int(BS_EPOLL_BATCH)
        var readyFDs = [Int32](repeating: 0, count: capacity)
        var readyMasks = [Int32](repeating: 0, count: capacity)
        while true {
            let batch = commands.withLockedValue { queue -> [Command] in
                let taken = queue
                queue.removeAll(keepingCapacity: true)
                return taken
            }
            for command in batch {
                switch command {
                case .start(let transfer):
                    if stopping || transfer.cancelRequested.load(ordering: .acquiring) {
                        transfer.emit(.failure(.cancelled))
                        transfer.finished = true
                    } else {
                        begin(transfer)
                    }
                case .cancel(let transfer):
                    if !transfer.finished, transfer.easy != nil {
                        finish(transfer, with: .failure(.cancelled))
                    }
                case .resumeReceive(let transfer), .resumeSend(let transfer):
                    if !transfer.finished, let easy = transfer.easy { _ = curl_easy_pause(easy, CURLPAUSE_CONT) }
                case .abandon(let transfer, let deadline):
                    if !transfer.finished { abandoned.append((transfer, deadline)) }
                case .stop:
                    stopping = true
                }
            }
            if stopping {
                for transfer in active.values { finish(transfer, with: .failure(.cancelled)) }
                flushDirty()
                break
            }
            if let deadline = timerDeadline, bs_monotonic_ms() >= deadline {
                timerDeadline = nil
                curl_multi_socket_action(multi, bs_socket_timeout(), 0, &running)
            }
            readCompletions()
            let nextAbandonDeadline = expireAbandoned()
            flushDirty()

            sleeping.store(true, ordering: .sequentiallyConsistent)
            var timeout: Int32 = commands.withLockedValue { $0.isEmpty } ? 1000 : 0
            for deadline in [timerDeadline, nextAbandonDeadline] where timeout > 0 {
                guard let deadline else { continue }
                timeout = Int32(clamping: max(0, min(Int64(timeout), deadline - bs_monotonic_ms())))
            }
            let ready = readyFDs.withUnsafeMutableBufferPointer { fds in
                readyMasks.withUnsafeMutableBufferPointer { masks in
                    bs_epoll_wait(epollFD, fds.baseAddress, masks.baseAddress, Int32(capacity), timeout)
                }
            }
            sleeping.store(false, ordering: .sequentiallyConsistent)
            for i in 0..<Int(max(ready, 0)) {
                let fd = readyFDs[i]
                if fd == wakeFD {
                    bs_wake_fd_drain(wakeFD)
                } else if interest.eventArrived(fd) {
                    curl_multi_socket_action(multi, fd, readyMasks[i], &running)
                } else {
                    _ = bs_epoll_unwatch(epollFD, fd)
                }
            }
        }
        for easy in idleHandles.removeAll() { curl_easy_cleanup(easy) }
        curl_multi_cleanup(multi)
        // Refused (and left to process exit) if a handle still uses it: only after every handle is gone.
        if let tlsSessions { _ = curl_share_cleanup(tlsSessions) }
        close(epollFD)
        close(wakeFD)
        let continuation = finishedSignal.withLockedValue { slot -> CheckedContinuation<Void, Never>? in
            threadDone.store(true, ordering: .releasing)
            let c = slot
            slot = nil
            return c
        }
        continuation?.resume()
    }

    /// curl's socket callback: watch `fd` as `what` says, or stop watching it.
    fileprivate func watch(_ fd: Int32, what: Int32) {
        assertOnTransportThread()
        let failed: Bool
        switch interest.curlWants(fd, what) {
        case .none: return
        case .add(let events): failed = bs_epoll_watch(epollFD, fd, events, 1) != 0
        case .modify(let events): failed = bs_epoll_watch(epollFD, fd, events, 0) != 0
        case .delete:
            // curl may already have closed it (which removes it from epoll by itself).
            _ = bs_epoll_unwatch(epollFD, fd)
            return
        }
        if failed {
            // Not watchable: let the transfer fail through curl's own timeout rather than hang silently.
            _ = bs_epoll_unwatch(epollFD, fd)
            interest.registrationFailed(fd)
        }
    }

    /// curl's open-socket callback: the destination is checked on the resolved address curl is about to
    /// connect to (no second lookup can differ), and the socket is opened here so `interest` learns its number.
    fileprivate func openSocket(
        _ address: UnsafeMutablePointer<curl_sockaddr>, for transfer: CurlTransfer
    ) -> curl_socket_t {
        var bytes = [UInt8](repeating: 0, count: 16)
        var port: Int32 = 0
        let count = Int(bs_sockaddr_bytes(address, &bytes, &port))
        if count > 0 {
            let ip = Array(bytes[0..<count])
            let verdict = destinationGuard.withLockedValue {
                $0.check(address: ip, port: Int(port), passthrough: transfer.request.passthrough)
            }
            let where_ = Self.describe(address: ip, port: Int(port))
            transfer.lastAddress = where_
            switch verdict {
            case .allow: break
            case .loop:
                transfer.refusal = .loopDetected(detail: "\(where_) is one of Backstop's own listeners")
                return bs_socket_bad()
            case .denied:
                transfer.refusal = .destinationDenied(detail: "\(where_) is a link-local or metadata address")
                return bs_socket_bad()
            }
        }
        let fd = bs_open_socket(address)
        if fd >= 0 { interest.opened(fd) }
        return fd
    }

    /// curl's close-socket callback.
    fileprivate func closeSocket(_ fd: curl_socket_t) -> Int32 {
        assertOnTransportThread()
        interest.closed(fd)
        return close(fd)
    }

    /// curl's timer callback: `timeoutMS` −1 removes the timer, 0 means "as soon as possible".
    fileprivate func setTimer(_ timeoutMS: Int) {
        assertOnTransportThread()
        timerDeadline = timeoutMS < 0 ? nil : bs_monotonic_ms() + Int64(timeoutMS)
    }

    /// Cancels abandoned transfers past their deadline, forgets finished ones; returns the next deadline.
    private func expireAbandoned() -> Int64? {
        guard !abandoned.isEmpty else { return nil }
        let now = bs_monotonic_ms()
        var next: Int64?
        abandoned.removeAll { entry in
            if entry.transfer.finished { return true }
            if now >= entry.deadline {
                finish(entry.transfer, with: .failure(.timeout(detail: "abandoned response did not finish in time")))
                return true
            }
            next = min(next ?? entry.deadline, entry.deadline)
            return false
        }
        return next
    }

    private func flushDirty() {
        guard !dirty.isEmpty else { return }
        let touched = dirty
        dirty.removeAll(keepingCapacity: true)
        for transfer in touched { transfer.flush() }
    }

    private func readCompletions() {
        var remaining: Int32 = 0
        while let message = curl_multi_info_read(multi, &remaining) {
            guard bs_msg_is_done(message) != 0, let easy = message.pointee.easy_handle else { continue }
            var raw: UnsafeMutableRawPointer?
            _ = bs_easy_getinfo_pointer(easy, CURLINFO_PRIVATE, &raw)
            guard let raw else { continue }
            let transfer = Unmanaged<CurlTransfer>.fromOpaque(raw).takeUnretainedValue()
            let code = bs_msg_result(message)
            if let refusal = transfer.refusal {
                finish(transfer, with: .failure(refusal))
            } else if code == CURLE_OK {
                if transfer.headDelivered {
                    finish(transfer, with: .end)
                } else {
                    finish(transfer, with: .failure(.reset(detail: "upstream closed without a response")))
                }
            } else if !resendOnNewConnection(transfer, easy: easy, after: code) {
                finish(transfer, with: .failure(classify(code, easy: easy, transfer: transfer)))
            }
        }
    }

    /// A request that failed on a reused connection before a byte of the response came back: the upstream closed
    /// that keep-alive connection as it was reused (docs/reference/behaviour.md#stale-upstream-connections). curl
    /// sends such a request again by itself when the close shows up as end-of-file, but not when it shows up as a
    /// failed send or a reset, as it does when a closed TLS connection passes curl's liveness check (a peek at the
    /// socket; a `close_notify` alert waiting there reads as data). The request goes once more, on a
    /// new connection, as curl's own resend would, when it may reach the upstream twice and its body can be
    /// rewound (`rewindBody`). Returns false when it does not apply.
    private func resendOnNewConnection(_ transfer: CurlTransfer, easy: UnsafeMutableRawPointer, after code: CURLcode)
        -> Bool
    {
        var newConnections = 0
        var headerBytes = 0
        _ = bs_easy_getinfo_long(easy, CURLINFO_NUM_CONNECTS, &newConnections)
        _ = bs_easy_getinfo_long(easy, CURLINFO_HEADER_SIZE, &headerBytes)
        guard StaleConnection.shouldResend(
            failedSending: code == CURLE_SEND_ERROR, failedReceiving: code == CURLE_RECV_ERROR || code == CURLE_GOT_NOTHING,
            connectionWasReused: newConnections == 0, responseBytes: headerBytes, alreadyResent: transfer.resent),
            transfer.rewindBody()
        else { return false }
        transfer.resent = true
        curl_multi_remove_handle(multi, easy)
        do throws(CurlSetupError) {
            try CurlEasy(easy).set(CURLOPT_FRESH_CONNECT, 1)  // `configure` sets it again for the handle's next use
        } catch {
            return false
        }
        return curl_multi_add_handle(multi, easy) == CURLM_OK
    }

    /// Maps curl's result to a retry condition, with a cause for the logs: curl's code and text, the errno of
    /// the failing socket call and the address curl tried.
    private func classify(_ code: CURLcode, easy: UnsafeMutableRawPointer, transfer: CurlTransfer) -> TransportFailure {
        let detail = Self.cause(code, easy: easy, transfer: transfer)
        switch code {
        case CURLE_COULDNT_RESOLVE_HOST, CURLE_COULDNT_CONNECT, CURLE_COULDNT_RESOLVE_PROXY,
            CURLE_SSL_CONNECT_ERROR, CURLE_PEER_FAILED_VERIFICATION, CURLE_SSL_CACERT_BADFILE,
            CURLE_SSL_CERTPROBLEM, CURLE_SSL_CIPHER, CURLE_SSL_ISSUER_ERROR:
            return .connectFailure(detail: detail)
        case CURLE_OPERATION_TIMEDOUT:
            var connectTime: curl_off_t = 0
            _ = bs_easy_getinfo_off(easy, CURLINFO_CONNECT_TIME_T, &connectTime)
            return connectTime == 0 ? .connectFailure(detail: detail) : .timeout(detail: detail)
        case CURLE_ABORTED_BY_CALLBACK:
            return .requestBodyFailed
        case CURLE_WEIRD_SERVER_REPLY:
            // curl refused the head itself (a negative or non-numeric Content-Length, a broken status line).
            return .badResponse(detail: detail)
        default:
            return .reset(detail: detail)
        }
    }

    /// `curl=7 (Couldn't connect to server) errno=111 address=127.0.0.1:9`, the parts that are known.
    static func cause(_ code: CURLcode, easy: UnsafeMutableRawPointer, transfer: CurlTransfer) -> String {
        var text = "curl=\(code.rawValue) (\(String(cString: curl_easy_strerror(code))))"
        var osErrno = 0
        _ = bs_easy_getinfo_long(easy, CURLINFO_OS_ERRNO, &osErrno)
        if osErrno != 0 { text += " errno=\(osErrno) (\(String(cString: strerror(Int32(osErrno)))))" }
        var ip: UnsafePointer<CChar>?
        _ = bs_easy_getinfo_string(easy, CURLINFO_PRIMARY_IP, &ip)
        if let ip, ip.pointee != 0 {
            var port = 0
            _ = bs_easy_getinfo_long(easy, CURLINFO_PRIMARY_PORT, &port)
            let host = String(cString: ip)
            text += " address=" + (host.contains(":") ? "[\(host)]" : host) + (port > 0 ? ":\(port)" : "")
        } else if let tried = transfer.lastAddress {
            // curl reports no primary address for a connection that never came up: the last one it opened.
            text += " address=\(tried)"
        }
        return text
    }

    static func describe(address: [UInt8], port: Int) -> String {
        if address.count == 4 { return address.map(String.init).joined(separator: ".") + ":\(port)" }
        let cidr = CIDR(address: address, prefixLength: 128).description
        return "[" + cidr.dropLast(4) + "]:\(port)"
    }

    private func begin(_ transfer: CurlTransfer) {
        assertOnTransportThread()
        guard let easy = takeIdleHandle(for: transfer.request.tls) ?? CurlEasy.make().flatMap(withFixedOptions) else {
            transfer.emit(.failure(.connectFailure(detail: "curl cannot create a transfer handle")))
            transfer.finished = true
            return
        }
        transfer.easy = easy
        active[ObjectIdentifier(transfer)] = transfer
        do throws(CurlSetupError) {
            try configure(CurlEasy(easy), for: transfer)
        } catch {
            finish(transfer, with: .failure(.connectFailure(detail: error.description)))
            return
        }
        let rc = curl_multi_add_handle(multi, easy)
        if rc != CURLM_OK {
            finish(transfer, with: .failure(.connectFailure(detail: "curl_multi_add_handle failed")))
        }
    }

    /// Removes the transfer from the multi handle, frees its curl resources and emits its last event.
    private func finish(_ transfer: CurlTransfer, with event: TransportEvent) {
        assertOnTransportThread()
        guard !transfer.finished else { return }
        transfer.finished = true
        if let easy = transfer.easy {
            curl_multi_remove_handle(multi, easy)
            let handle = CurlEasy(easy)
            do throws(CurlSetupError) {
                // The list is freed below: the idle handle must not keep pointing at it.
                try handle.set(CURLOPT_HTTPHEADER, list: nil)
                if !idleHandles.put(easy, options: transfer.request.tls) { handle.cleanup() }
            } catch {
                handle.cleanup()
            }
            transfer.easy = nil
        }
        transfer.headerList?.deallocate()
        transfer.headerList = nil
        transfer.bufferedBody = nil
        active[ObjectIdentifier(transfer)] = nil
        transfer.emit(event)
    }

    /// An idle handle for a request with `options`, or nil when none is idle. One configured for other options (another
    /// CA file, verification off, pinned to HTTP/1.1) is reset to the fixed options first.
    private func takeIdleHandle(for options: TransportTLSOptions) -> UnsafeMutableRawPointer? {
        switch idleHandles.take(for: options) {
        case .ready(let handle)?:
            return handle
        case .needsReset(let handle)?:
            let easy = CurlEasy(handle)
            easy.reset()
            return withFixedOptions(easy)
        case nil:
            return nil
        }
    }

    /// `easy` with the options every transfer shares, or nil (and `easy` freed) when curl refuses one.
    private func withFixedOptions(_ easy: CurlEasy) -> UnsafeMutableRawPointer? {
        do throws(CurlSetupError) {
            try setFixedOptions(easy)
            return easy.raw
        } catch {
            easy.cleanup()
            return nil
        }
    }

    /// Options that are the same for every transfer. Idle handles keep them (no `curl_easy_reset` between
    /// requests); `configure` sets every other option on each use, so nothing of one request carries over to the
    /// next.
    private func setFixedOptions(_ easy: CurlEasy) throws(CurlSetupError) {
        try easy.set(CURLOPT_PATH_AS_IS, 1)
        try easy.set(CURLOPT_NOSIGNAL, 1)
        // The client decides about redirects; following one would carry an injected token to another host.
        try easy.set(CURLOPT_FOLLOWLOCATION, 0)
        // Never read proxy settings from the daemon's environment: HTTP_PROXY pointing at ourselves would loop.
        try easy.set(CURLOPT_PROXY, "")
        try easy.set(CURLOPT_NOPROXY, "*")
        try easy.set(CURLOPT_HTTP_CONTENT_DECODING, 0)
        try easy.set(CURLOPT_HTTP_VERSION, Int(CURL_HTTP_VERSION_2TLS))
        try easy.set(CURLOPT_TCP_NODELAY, 1)
        if let tlsSessions { try easy.set(CURLOPT_SHARE, pointer: tlsSessions) }
        try easy.setSocketCallbacks(
            open: curlOpenSocketCallback, close: curlCloseSocketCallback,
            closeContext: Unmanaged.passUnretained(self).toOpaque())
        try easy.set(CURLOPT_HEADERFUNCTION, callback: curlHeaderCallback)
        try easy.set(CURLOPT_WRITEFUNCTION, callback: curlWriteCallback)
        try easy.set(CURLOPT_READFUNCTION, callback: curlReadCallback)
        try easy.setSeekCallback(curlSeekCallback)
    }

    /// Sets every per-request option, including those whose value is curl's default, because the handle may come
    /// from the idle list with the previous request's values.
    private func configure(_ easy: CurlEasy, for transfer: CurlTransfer) throws(CurlSetupError) {
        let request = transfer.request
        let context = Unmanaged.passUnretained(transfer).toOpaque()
        try easy.set(CURLOPT_URL, request.url)
        try easy.set(CURLOPT_PRIVATE, pointer: context)
        try easy.set(CURLOPT_HEADERDATA, pointer: context)
        try easy.set(CURLOPT_WRITEDATA, pointer: context)
        try easy.set(CURLOPT_READDATA, pointer: context)
        try easy.set(CURLOPT_SEEKDATA, pointer: context)
        try easy.set(CURLOPT_OPENSOCKETDATA, pointer: context)
        try easy.set(CURLOPT_CONNECTTIMEOUT_MS, Int(request.connectTimeout.millisecondsRoundedUp))
        // Non-default TLS options stay on the handle: it goes back to the idle group of these options (`begin` resets
        // a handle before it serves other options).
        if let caFile = request.tls.caFile { try easy.set(CURLOPT_CAINFO, caFile) }
        if request.tls.insecureSkipVerify {
            try easy.set(CURLOPT_SSL_VERIFYPEER, 0)
            try easy.set(CURLOPT_SSL_VERIFYHOST, 0)
        }
        if !request.tls.http2 { try easy.set(CURLOPT_HTTP_VERSION, Int(CURL_HTTP_VERSION_1_1)) }
        if let identity = request.tls.clientIdentity {
            try easy.set(CURLOPT_SSLCERTTYPE, "PEM")
            try easy.set(CURLOPT_SSLCERT_BLOB, blob: identity.certificateChainPEM)
            try easy.set(CURLOPT_SSLKEYTYPE, "PEM")
            try easy.set(CURLOPT_SSLKEY_BLOB, blob: identity.privateKeyPEM)
        }

        let method = request.method
        var sendsBody = true
        switch request.body {
        case .empty:
            sendsBody = !Self.hasNoImplicitBody(method)
        case .buffered, .streaming:
            sendsBody = true
        }
        // HTTPGET is curl's plain GET: it also turns off the NOBODY and UPLOAD a previous request may have left.
        try easy.set(CURLOPT_HTTPGET, 1)
        if method == "HEAD" {
            try easy.set(CURLOPT_NOBODY, 1)
            try easy.set(CURLOPT_CUSTOMREQUEST, pointer: nil)
        } else if method == "GET" && !sendsBody {
            try easy.set(CURLOPT_CUSTOMREQUEST, pointer: nil)
        } else {
            try easy.set(CURLOPT_CUSTOMREQUEST, method)
        }
        // No body means no rewind for curl to ask about: only a fresh connection keeps curl from resending it.
        let freshConnection = !request.mayResend && !(sendsBody && method != "HEAD")
        try easy.set(CURLOPT_FRESH_CONNECT, freshConnection ? 1 : 0)
        if sendsBody && method != "HEAD" {
            try easy.set(CURLOPT_UPLOAD, 1)
            let length: Int
            switch request.body {
            case .empty: length = 0
            case .buffered(let buffer): length = buffer.readableBytes
            case .streaming(let stream): length = stream.expectedLength ?? -1
            }
            try easy.set(CURLOPT_INFILESIZE_LARGE, offset: length)
        } else {
            try easy.set(CURLOPT_INFILESIZE_LARGE, offset: -1)
        }

        let list = CurlHeaderList(request.headers)
        transfer.headerList = list
        try easy.set(CURLOPT_HTTPHEADER, list: list.first)
    }

    /// Methods that carry no body unless the client sent one. A switch rather than a `Set`: comparing a short
    /// string a few times is cheaper than hashing it, and this runs for every request.
    static func hasNoImplicitBody(_ method: String) -> Bool {
        switch method {
        case "GET", "HEAD", "DELETE", "OPTIONS", "TRACE", "CONNECT": true
        default: false
        }
    }
}

// The callbacks below borrow the object behind their context pointer (`_withUnsafeGuaranteedRef`: no retain and
// release per call, and they run several times per request). Sound because the transport owns every transfer while
// curl holds its easy handle, and the transport outlives its multi handle.

private let curlSocketCallback: bs_curl_socket_callback = { _, fd, what, context, _ in
    guard let context else { return 0 }
    Unmanaged<CurlMultiTransport>.fromOpaque(context)._withUnsafeGuaranteedRef { $0.watch(fd, what: what) }
    return 0
}

private let curlTimerCallback: bs_curl_timer_callback = { _, timeoutMS, context in
    guard let context else { return 0 }
    Unmanaged<CurlMultiTransport>.fromOpaque(context)._withUnsafeGuaranteedRef { $0.setTimer(timeoutMS) }
    return 0
}

private let curlOpenSocketCallback: bs_curl_opensocket_callback = { context, _, address in
    guard let context, let address else { return bs_socket_bad() }
    let transfer = Unmanaged<CurlTransfer>.fromOpaque(context).takeUnretainedValue()
    return transfer.transport.openSocket(address, for: transfer)
}

private let curlCloseSocketCallback: bs_curl_closesocket_callback = { context, fd in
    guard let context else { return close(fd) }
    return Unmanaged<CurlMultiTransport>.fromOpaque(context).takeUnretainedValue().closeSocket(fd)
}

private let curlHeaderCallback: bs_curl_data_callback = { data, size, count, context in
    let n = size * count
    guard let data, let context else { return n }
    // Any other count than `n` makes curl abort the transfer.
    let taken = Unmanaged<CurlTransfer>.fromOpaque(context)._withUnsafeGuaranteedRef {
        $0.onHeaderLine(UnsafeRawBufferPointer(start: data, count: n))
    }
    return taken ? n : 0
}

private let curlWriteCallback: bs_curl_data_callback = { data, size, count, context in
    let n = size * count
    guard let data, let context else { return n }
    let taken = Unmanaged<CurlTransfer>.fromOpaque(context)._withUnsafeGuaranteedRef {
        $0.onBody(UnsafeRawBufferPointer(start: data, count: n))
    }
    return taken ? n : bs_writefunc_pause()
}

private let curlReadCallback: bs_curl_data_callback = { data, size, count, context in
    guard let data, let context else { return bs_readfunc_abort() }
    let read = Unmanaged<CurlTransfer>.fromOpaque(context)._withUnsafeGuaranteedRef {
        $0.readBody(into: UnsafeMutableRawBufferPointer(start: data, count: size * count))
    }
    switch read {
    case .bytes(let n): return n
    case .end: return 0
    case .pause: return bs_readfunc_pause()
    case .abort: return bs_readfunc_abort()
    }
}

private let curlSeekCallback: bs_curl_seek_callback = { context, offset, origin in
    guard let context, offset == 0, origin == SEEK_SET else { return bs_seekfunc_cantseek() }
    let transfer = Unmanaged<CurlTransfer>.fromOpaque(context).takeUnretainedValue()
    return transfer.rewindBody() ? bs_seekfunc_ok() : bs_seekfunc_cantseek()
}

/// One-time process-wide libcurl initialisation.
enum CurlGlobal {
    private static let once: Void = {
        curl_global_init(Int(CURL_GLOBAL_ALL))
    }()
    static func initialize() { _ = once }
}
