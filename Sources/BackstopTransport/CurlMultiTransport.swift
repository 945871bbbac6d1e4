import BackstopCore
import CCurl
import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import Synchronization

/// The upstream HTTP engine: one dedicated thread driving a libcurl multi handle with `curl_multi_socket_action`
/// on its own epoll instance.
///
/// curl tells the engine which sockets to watch (socket callback → `SocketWatch`) and when its next timeout is due
/// (timer callback); the thread sleeps in `epoll_wait` and hands curl only the sockets that are ready, so a loop
/// turn costs the same with 32 or 4,000 upstream connections (`curl_multi_poll` + `curl_multi_perform` scan every
/// socket and every transfer on each turn). Other threads submit commands (start, cancel, resume, abandon) through
/// `TransportCommands`. Where each transfer stands is `TransferTable`'s to decide; this type performs its actions.
/// Events of each transfer are batched per loop turn and delivered with one hop onto the requester's event loop.
/// The multi handle keeps upstream connections alive and multiplexes HTTP/2 where the upstream offers it over TLS.
///
/// The parts, one job each: `TransportCommands` (the queue and the wake-up), `SocketWatch` (epoll),
/// `TransferTable` (the lifecycle), `HandleConfiguration` and `EasyHandles` (options and idle handles),
/// `DestinationCheck` (where connections may go), `FailureClassification` (curl's errors in `retry.on` terms),
/// `StaleConnection` (the keep-alive race), `CurlTransfer` (one transfer's callbacks and events).
///
/// `@unchecked Sendable`: everything but `commands`, `destinations`, the atomics and the `let`s is touched only on
/// the transport thread (inside `run()` and the curl callbacks it triggers: socket, timer, open/close-socket,
/// header, write, read and seek, all called from `curl_multi_*` on this thread); `commands` and `destinations` are
/// locked, so any thread may use them.
public final class CurlMultiTransport: TransferStarting, @unchecked Sendable {
    let allocator = ByteBufferAllocator()
    /// The transport's own multi handle (curl's HTTP layer, upgrades), driven by the loop like each connection
    /// group's (`DrivenMulti`); `multi` is its handle.
    private let driven: DrivenMulti
    private let multi: CurlMulti
    private let commands: TransportCommands
    private let sockets: SocketWatch
    private let destinations = DestinationCheck()
    private let logger: Logger
    private let stopped = Atomic<Bool>(false)
    private let finishedSignal = NIOLockedValueBox<(done: Bool, waiter: CheckedContinuation<Void, Never>?)>(
        (false, nil))
    /// The transport thread's id (0 until it runs), for the debug checks of the thread-confinement claims.
    private let transportThread = Atomic<UInt>(0)

    // Transport thread only.
    private var table = TransferTable<TransferKey>()
    private var handles: EasyHandles
    /// Raw connections (`CurlConnection`: upgraded requests): started, driven and ended on this thread.
    let connections: ConnectionDriver
    /// The raw HTTP/1.1 path's connections (docs/performance.md#libcurl-as-the-connection); transport thread only,
    /// but for its `endpointCount` (an atomic, for tests).
    let http1: HTTP1Connections
    /// Whether HTTP/1.1 requests take the raw path (curl only connects) rather than curl's HTTP layer.
    private let rawHTTP1: Bool
    /// Transfers with events to hand over at the end of this loop turn.
    private var dirty: [CurlTransfer] = []
    /// `flushDirty`'s scratch: the event loops of this turn's transfers and the deliveries for each.
    private var flushLoops: [any EventLoop] = []
    private var flushBatches: [[CurlTransfer.Delivery]] = []
    /// `settleHTTP1`'s scratch: the raw path's completions being handed to the table.
    private var settling: [(CurlTransfer, TransferCompletion)] = []

    /// The transport thread's stack: curl's callbacks and the loop need little.
    static let threadStackSize = 1 << 20
    /// Upstream connections curl keeps open for reuse.
    static let maxCachedConnections = 1024

    /// Creates the engine and starts its thread. `logger` gets what the transport cannot hand to a transfer
    /// (curl or the kernel refusing an internal call); by default the process's logging system under the label
    /// `backstop.transport`. `rawHTTP1`: requests to HTTP/1.1 upstreams (plain, or TLS without `http2`) use curl
    /// only to connect, and Backstop writes and reads HTTP/1.1 itself (docs/performance.md#libcurl-as-the-connection).
    public convenience init(name: String = "backstop-curl", logger: Logger? = nil, rawHTTP1: Bool = true) {
        self.init(name: name, logger: logger, rawHTTP1: rawHTTP1, maxHTTP1Endpoints: HTTP1Connections.maxEndpoints)
    }

    /// `maxHTTP1Endpoints`: the raw path's endpoint table's size before it forgets unused ones
    /// (`HTTP1Connections.maxEndpoints`; tests make it small).
    init(name: String, logger: Logger?, rawHTTP1: Bool, maxHTTP1Endpoints: Int) {
        CurlGlobal.initialize()
        self.logger = logger ?? Logger(label: "backstop.transport")
        self.rawHTTP1 = rawHTTP1
        guard let commands = TransportCommands(), let sockets = SocketWatch(wakeFD: commands.wakeFD),
            let driven = DrivenMulti(index: DrivenMulti.transportIndex, sockets: sockets)
        else {
            fatalError("cannot create the transport's multi handle, eventfd or epoll instance (errno \(errno))")
        }
        let multi = driven.multi
        self.driven = driven
        self.multi = multi
        self.commands = commands
        self.sockets = sockets
        // The callbacks get their objects as unretained pointers: the transport and its socket watch outlive the
        // multi handle and every easy handle (all freed at the end of `run()`, which holds `self`).
        handles = EasyHandles(
            configuration: HandleConfiguration(
                share: CurlShare(), closeContext: Unmanaged.passUnretained(sockets).toOpaque()))
        connections = ConnectionDriver(
            multi: multi, sockets: sockets, destinations: destinations, configuration: handles.configuration,
            allocator: allocator)
        http1 = HTTP1Connections(
            sockets: sockets, destinations: destinations, configuration: handles.configuration,
            allocator: allocator, maxEndpoints: maxHTTP1Endpoints)
        do throws(CurlSetupError) {
            try multi.set(CURLMOPT_PIPELINING, Int(CURLPIPE_MULTIPLEX))
            try multi.set(CURLMOPT_MAXCONNECTS, Self.maxCachedConnections)
        } catch {
            fatalError("libcurl cannot be set up: \(error)")
        }
        let thread = Thread { [self] in
            // Threads inherit their creator's kernel name; Foundation's `name` does not reach the kernel here, and
            // `top -H`, `perf` and core dumps would show a Dispatch queue's name instead. A failure (a name too
            // long is cut, not refused) only costs the name.
            _ = bs_set_thread_name(name)
            self.run()
        }
        thread.name = name
        thread.stackSize = Self.threadStackSize
        thread.start()
    }

    /// Starts an attempt. Events arrive, in order and batched, through `sink` on `eventLoop`.
    public func start(
        _ request: consuming TransportRequest, on eventLoop: EventLoop,
        sink: @escaping @Sendable ([TransportEvent]) -> Void
    ) -> any TransferHandle {
        let transfer = CurlTransfer(
            request: request, eventLoop: eventLoop, transport: self, rawHTTP1: rawHTTP1, sink: sink)
        if case .streaming(let stream) = transfer.request.body {
            stream.setResumeConsumer { [weak transfer, weak self] in
                guard let transfer, let self else { return }
                self.submit(.resumeSend(transfer))
            }
        }
        submit(.start(transfer))
        return transfer
    }

    /// Replaces the rules for where new upstream connections may go (checked on the resolved address each time
    /// a connection is opened).
    public func setDestinationGuard(_ guardian: DestinationGuard) {
        destinations.replace(guardian)
    }

    /// Ends every transfer in flight as shut down (`backstop stopped before the upstream answered`), on the
    /// transport's thread, soon after this returns; transfers started later run as usual (a drain's last span
    /// exports and token calls).
    public func cutTransfersInFlight() {
        submit(.cutAll)
    }

    /// Stops the thread after cancelling every transfer; returns when it has exited.
    public func shutdown() async {
        if stopped.exchange(true, ordering: .acquiringAndReleasing) { return }
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let alreadyDone = finishedSignal.withLockedValue { state -> Bool in
                if state.done { return true }
                state.waiter = continuation
                return false
            }
            if alreadyDone { continuation.resume() }
            submit(.stop)
        }
    }

    func submit(_ command: consuming TransportCommand) { commands.submit(command) }

    /// Debug builds check the "only on the transport thread" claims behind the `@unchecked Sendable` of this type
    /// and of `CurlTransfer`.
    @inline(__always)
    func assertOnTransportThread(_ what: StaticString = #function) {
        assert(isTransportThread, "\(what) must run on the transport thread")
    }

    var isTransportThread: Bool { transportThread.load(ordering: .acquiring) == UInt(pthread_self()) }

    func markDirty(_ transfer: CurlTransfer) { dirty.append(transfer) }

    // MARK: the loop

    private func run() {
        transportThread.store(UInt(pthread_self()), ordering: .releasing)
        let capacity = Int(BS_EPOLL_BATCH)
        var readyFDs = [Int32](repeating: 0, count: capacity)
        var readyMasks = [Int32](repeating: 0, count: capacity)
        var batch: [TransportCommand] = []
        while !table.stopping {
            commands.takeAll(into: &batch)
            // By index: iterating the array copies (retains and releases) each command.
            for i in batch.indices { perform(batch[i]) }
            settleHTTP1()
            if table.stopping { break }
            fireTimers()
            readCompletions()
            var nextAbandonDeadline: Int64?
            let now = bs_monotonic_ms()
            if table.hasDeadlines {
                let (expired, next) = table.expire(now: now)
                for action in expired { perform(action) }
                nextAbandonDeadline = next
            }
            http1.closeExpiredIdle(now: now)
            settleHTTP1()
            flushDirty()
            logSocketFailures()

            var timeout: Int32 = commands.announceSleep() ? 0 : 1000
            // Each deadline in turn, not a loop over an array literal of them: that array was made and released
            // on every turn.
            timeout = Self.timeout(timeout, until: nextAbandonDeadline)
            // Read last: a transfer or connection started after the timers fired (a resend, say) has just set one.
            timeout = Self.timeout(timeout, until: earliestTimer())
            let ready = sockets.wait(fds: &readyFDs, masks: &readyMasks, timeoutMS: timeout)
            commands.announceAwake()
            for i in 0..<ready {
                let fd = readyFDs[i]
                if fd == commands.wakeFD {
                    commands.drainWake()
                } else if http1.socketReady(fd, mask: readyMasks[i]) {
                    continue
                } else if connections.socketReady(fd, mask: readyMasks[i]) {
                    continue
                } else if sockets.eventArrived(fd) {
                    let group = sockets.group(of: fd)
                    socketAction(fd, readyMasks[i], on: group < 0 ? multi : http1.groups[group].multi)
                }
            }
        }
        connections.stopAll()
        http1.stopAll()
        flushDirty()
        // Teardown order: every easy handle before the multi handle (the table let go of the transfers' handles in
        // `stop`; the idle ones go here), then the multi handle, which closes the cached connections through the
        // close-socket callback, on this thread. The share goes with `self`, when no handle uses it any more.
        handles.removeAll()
        driven.cleanup()
        let waiter = finishedSignal.withLockedValue { state -> CheckedContinuation<Void, Never>? in
            state.done = true
            defer { state.waiter = nil }
            return state.waiter
        }
        waiter?.resume()
    }

    /// `timeout` (ms), shortened to what is left until `deadline` (monotonic ms; nil: none).
    private static func timeout(_ timeout: Int32, until deadline: Int64?) -> Int32 {
        guard timeout > 0, let deadline else { return timeout }
        return Int32(clamping: max(0, min(Int64(timeout), deadline - bs_monotonic_ms())))
    }

    /// `curl_multi_socket_action` on `target` (the transport's multi handle or a connection group's): curl runs what
    /// `fd` (or its timer) allows and calls back into the transfers.
    private func socketAction(_ fd: curl_socket_t, _ mask: Int32, on target: CurlMulti) {
        var running: Int32 = 0
        let code = curl_multi_socket_action(target.raw, fd, mask, &running)
        // CURLM_BAD_SOCKET: an event for a socket curl has just forgotten (it closed the connection in this very
        // turn); nothing to do. Anything else (out of memory, an internal error) fails no transfer by itself: curl
        // reports those through the transfers' own results, so it is logged only.
        if code != CURLM_OK, code != CURLM_BAD_SOCKET {
            logger.error(
                "curl_multi_socket_action failed",
                metadata: ["curl": "\(code.rawValue) (\(String(cString: curl_multi_strerror(code))))"])
        }
    }

    private func logSocketFailures() {
        // Checked first: taking the (empty) list cost a release on every loop turn.
        guard sockets.hasFailures else { return }
        for failure in sockets.takeFailures() {
            logger.error(
                "epoll_ctl failed for an upstream socket",
                metadata: [
                    "fd": "\(failure.fd)", "errno": "\(failure.errno) (\(String(cString: strerror(failure.errno))))",
                ])
        }
    }

    /// Hands the turn's events to the requesters' event loops: one `execute` per loop, however many of its
    /// transfers have events (each `execute` allocates a task and takes the loop's two task-queue locks, which the
    /// loop's thread takes too; docs/performance.md#threads-and-hops).
    private func flushDirty() {
        connections.flush()
        guard !dirty.isEmpty else { return }
        if dirty.count == 1 {
            // Moved out of the list, not copied (a retain and a release less). The task reads only the transfer's
            // `sink`, a `let`.
            let transfer = dirty.removeLast()
            let events = transfer.takePending()
            transfer.eventLoop.execute { transfer.sink(events) }
        } else {
            // Usually one loop (the default); a linear search over a handful beats hashing.
            for transfer in dirty {
                let delivery = CurlTransfer.Delivery(sink: transfer.sink, events: transfer.takePending())
                if let index = flushLoops.firstIndex(where: { $0 === transfer.eventLoop }) {
                    flushBatches[index].append(delivery)
                } else {
                    flushLoops.append(transfer.eventLoop)
                    flushBatches.append([delivery])
                }
            }
            for (loop, batch) in zip(flushLoops, flushBatches) {
                loop.execute { for delivery in batch { delivery.hand() } }
            }
            flushLoops.removeAll(keepingCapacity: true)
            flushBatches.removeAll(keepingCapacity: true)
        }
        dirty.removeAll(keepingCapacity: true)
    }

    /// Fires the due timers of the multi handles the loop drives: the transport's and each connection group's. The
    /// clock is read once, and only when one of them has a timer.
    private func fireTimers() {
        var now: Int64?
        fireTimer(of: driven, now: &now)
        for group in http1.groups { fireTimer(of: group, now: &now) }
    }

    private func fireTimer(of target: DrivenMulti, now: inout Int64?) {
        guard let deadline = target.deadline else { return }
        let current = now ?? bs_monotonic_ms()
        now = current
        guard deadline <= current else { return }
        target.deadline = nil
        socketAction(bs_socket_timeout(), 0, on: target.multi)
    }

    /// The earliest timer of the multi handles the loop drives, if any.
    private func earliestTimer() -> Int64? {
        var next = driven.deadline
        for group in http1.groups {
            if let deadline = group.deadline { next = min(next ?? deadline, deadline) }
        }
        return next
    }

    private func readCompletions() {
        var remaining: Int32 = 0
        // A group's multi handle holds only raw connections' handles: each message is a connect that ended.
        for group in http1.groups {
            while let message = curl_multi_info_read(group.multi.raw, &remaining) {
                guard bs_msg_is_done(message) != 0, let raw = message.pointee.easy_handle else { continue }
                let known = http1.completed(raw, code: bs_msg_result(message))
                assert(known, "a connection group's multi handle finished a handle that is not a connection's")
            }
        }
        while let message = curl_multi_info_read(multi.raw, &remaining) {
            // CURLMSG_DONE is the only message libcurl 7.88 sends; each carries the easy handle it is about.
            guard bs_msg_is_done(message) != 0, let raw = message.pointee.easy_handle else { continue }
            if connections.completed(raw, code: bs_msg_result(message)) { continue }
            var context: UnsafeMutableRawPointer?
            // CURLINFO_PRIVATE cannot fail on a valid handle; every handle added carries its transfer.
            guard bs_easy_getinfo_pointer(raw, CURLINFO_PRIVATE, &context) == CURLE_OK, let context else {
                preconditionFailure("a finished curl transfer without its CurlTransfer")
            }
            let transfer = Unmanaged<CurlTransfer>.fromOpaque(context).takeUnretainedValue()
            if let action = table.completed(
                TransferKey(transfer), completion(of: transfer, code: bs_msg_result(message)))
            {
                perform(action)
            }
        }
    }

    /// What the table needs to know of a transfer curl ended with `code`.
    private func completion(of transfer: CurlTransfer, code: CURLcode) -> TransferTable<TransferKey>.Completion {
        if let refusal = transfer.refusal { return .refused(refusal) }
        if code == CURLE_OK { return .succeeded(headDelivered: transfer.headDelivered) }
        guard let easy = transfer.easy else { preconditionFailure("a completed transfer without its handle") }
        let facts = CurlFailureFacts(code, easy: easy, lastAddress: transfer.lastAddress)
        return .failed(
            FailureClassification.failure(facts),
            resendable: FailureClassification.lookedStale(facts) && transfer.mayRewindBody)
    }

    // MARK: performing commands and the table's actions

    private func perform(_ command: TransportCommand) {
        switch command {
        case .start(let transfer):
            let cancelled = transfer.cancelRequested.load(ordering: .acquiring)
            perform(table.start(TransferKey(transfer), cancelRequested: cancelled))
        case .cancel(let transfer):
            if let action = table.cancel(TransferKey(transfer)) { perform(action) }
        case .resumeReceive(let transfer), .resumeSend(let transfer):
            if let action = table.resume(TransferKey(transfer)) { perform(action) }
        case .abandon(let transfer, let deadline):
            table.abandon(TransferKey(transfer), deadline: deadline)
        case .cutAll:
            for action in table.cutAll() { perform(action) }
        case .stop:
            for action in table.stop() { perform(action) }
        case .connection(let command):
            connections.perform(command)
        }
    }

    /// Hands the raw HTTP/1.1 path's completions to the table and performs what it decides, until none are left
    /// (a finish may park a connection, a resend may fail at once).
    private func settleHTTP1() {
        while http1.hasCompletions {
            http1.takeCompletions(into: &settling)
            for i in settling.indices {
                if let action = table.completed(TransferKey(settling[i].0), settling[i].1) { perform(action) }
            }
        }
        settling.removeAll(keepingCapacity: true)
    }

    private func perform(_ action: TransferTable<TransferKey>.Action) {
        assertOnTransportThread()
        switch action {
        case .begin(let key):
            let failure: String?
            if let url = key.transfer.http1URL {
                failure = http1.begin(key.transfer, url: url)
            } else {
                failure = begin(key.transfer)
            }
            if let failure {
                perform(table.couldNotBegin(key, TransportFailure.connectFailure(detail: failure)))
            } else {
                table.began(key)
            }
        case .finish(let key, let ending):
            finish(key.transfer, with: ending)
        case .unpause(let key) where key.transfer.http1URL != nil:
            http1.resume(key.transfer)
        case .unpause(let key):
            // Fails only for a handle not in a transfer (the table says it is) or when curl cannot deliver what it
            // held back; then the transfer ends with curl's error through `readCompletions`, like any other.
            if let easy = key.transfer.easy { _ = curl_easy_pause(easy.raw, CURLPAUSE_CONT) }
        case .resend(let key, let failure):
            let refusal: String?
            if let url = key.transfer.http1URL {
                refusal = http1.resend(key.transfer, url: url)
            } else {
                refusal = resend(key.transfer)
            }
            if let why = refusal {
                logger.error("stale-connection resend refused by curl", metadata: ["cause": "\(why)"])
                if let next = table.resendFailed(key, failure) { perform(next) }
            }
        }
    }

    /// Hands `transfer` to curl; nil, or why it could not.
    private func begin(_ transfer: CurlTransfer) -> String? {
        let easy: CurlEasy
        switch handles.take(for: transfer.request.tls) {
        case .success(let taken): easy = taken
        case .failure(let error): return "curl cannot create a transfer handle: \(error)"
        }
        transfer.easy = easy
        do throws(CurlSetupError) {
            try handles.configuration.configure(easy, for: transfer)
        } catch {
            return error.description
        }
        let code = curl_multi_add_handle(multi.raw, easy.raw)
        guard code == CURLM_OK else {
            return "curl_multi_add_handle failed: \(String(cString: curl_multi_strerror(code)))"
        }
        return nil
    }

    /// Takes the transfer out of curl, recycles its handle and emits its last event.
    private func finish(_ transfer: CurlTransfer, with ending: TransferTable<TransferKey>.Ending) {
        if transfer.http1URL != nil { http1.detach(transfer) }
        if let easy = transfer.easy {
            // Fails only for a handle that is not in the multi handle (one whose `begin` failed before or at
            // `curl_multi_add_handle`): then there is nothing to remove.
            _ = curl_multi_remove_handle(multi.raw, easy.raw)
            handles.recycle(easy, options: transfer.request.tls)
            transfer.easy = nil
        }
        transfer.bufferedBody = nil
        switch ending {
        case .end: transfer.emit(.end)
        case .failure(let failure): transfer.emit(.failure(failure))
        }
    }

    /// Sends the request once more on a new connection (`StaleConnection`); nil, or why curl refused.
    private func resend(_ transfer: CurlTransfer) -> String? {
        guard let easy = transfer.easy else { preconditionFailure("a resend without a handle") }
        let removed = curl_multi_remove_handle(multi.raw, easy.raw)
        guard removed == CURLM_OK else { return "curl_multi_remove_handle failed: \(removed.rawValue)" }
        let rewound = transfer.rewindBody()
        assert(rewound, "the table resends only a transfer whose body rewinds")
        do throws(CurlSetupError) {
            try handles.configuration.prepareResend(easy)
        } catch {
            return error.description
        }
        let added = curl_multi_add_handle(multi.raw, easy.raw)
        guard added == CURLM_OK else {
            return "curl_multi_add_handle failed: \(String(cString: curl_multi_strerror(added)))"
        }
        return nil
    }

    // MARK: curl's callbacks (through the trampolines below)

    /// curl's open-socket callback: the destination is checked on the resolved address curl is about to connect
    /// to, and the socket is opened here so `sockets` learns its number.
    fileprivate func openSocket(
        _ address: UnsafeMutablePointer<curl_sockaddr>, for transfer: CurlTransfer
    ) -> curl_socket_t {
        assertOnTransportThread()
        let (fd, verdict) = destinations.openSocket(
            address, passthrough: transfer.request.passthrough, sockets: sockets)
        if let tried = verdict.address { transfer.lastAddress = tried }
        if let refusal = verdict.refusal { transfer.refusal = refusal }
        return fd
    }
}

/// The C callbacks curl calls, each forwarding to the object behind its context pointer. They borrow that object
/// (`_withUnsafeGuaranteedRef`: no retain and release per call, and they run several times per request). Sound
/// because the transport owns every transfer while curl holds its easy handle, and the transport outlives its
/// multi handle and every easy handle.
enum CurlTrampolines {
    static let openSocket: bs_curl_opensocket_callback = { context, _, address in
        guard let context, let address else { return bs_socket_bad() }
        let transfer = Unmanaged<CurlTransfer>.fromOpaque(context).takeUnretainedValue()
        return transfer.transport.openSocket(address, for: transfer)
    }

    static let closeSocket: bs_curl_closesocket_callback = { context, fd in
        guard let context else { return close(fd) }
        return Unmanaged<SocketWatch>.fromOpaque(context)._withUnsafeGuaranteedRef { $0.close(fd) }
    }

    static let header: bs_curl_data_callback = { data, size, count, context in
        let n = size * count
        guard let data, let context else { return n }
        // Any other count than `n` makes curl abort the transfer.
        let taken = Unmanaged<CurlTransfer>.fromOpaque(context)._withUnsafeGuaranteedRef {
            $0.onHeaderLine(UnsafeRawBufferPointer(start: data, count: n))
        }
        return taken ? n : 0
    }

    static let write: bs_curl_data_callback = { data, size, count, context in
        let n = size * count
        guard let data, let context else { return n }
        let taken = Unmanaged<CurlTransfer>.fromOpaque(context)._withUnsafeGuaranteedRef {
            $0.onBody(UnsafeRawBufferPointer(start: data, count: n))
        }
        return taken ? n : bs_writefunc_pause()
    }

    static let read: bs_curl_data_callback = { data, size, count, context in
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

    static let seek: bs_curl_seek_callback = { context, offset, origin in
        guard let context, offset == 0, origin == SEEK_SET else { return bs_seekfunc_cantseek() }
        let transfer = Unmanaged<CurlTransfer>.fromOpaque(context).takeUnretainedValue()
        return transfer.rewindBody() ? bs_seekfunc_ok() : bs_seekfunc_cantseek()
    }
}

/// One-time process-wide libcurl initialisation.
enum CurlGlobal {
    private static let once: Void = {
        let code = curl_global_init(Int(CURL_GLOBAL_ALL))
        // Fails only without memory or when a TLS library cannot start: no transfer could work.
        guard code == CURLE_OK else {
            fatalError("curl_global_init failed: \(String(cString: curl_easy_strerror(code)))")
        }
    }()
    static func initialize() { _ = once }
}
