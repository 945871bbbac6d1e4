import BackstopCore
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix

#if canImport(Glibc)
import Glibc
#endif

/// Watches the host's network for changes that can make an unreachable upstream reachable again (a link up, an
/// address or a route added) and reports them, so attempts that failed for want of a network can stop waiting out
/// their backoff (docs/reference/behaviour.md#the-network-coming-back).
///
/// One rtnetlink socket, read on a NIO event loop as a pipe channel: the kernel pushes announcements and epoll
/// wakes the loop, so nothing polls and no thread is added. `onChange` gets the changes of one read burst at once
/// (an address added comes with its routes), on that event loop; it should only hand them on.
///
/// If the kernel drops announcements (`ENOBUFS`: the socket's buffer overflowed), `onChange` gets `.eventsLost` and
/// the monitor opens a fresh socket (the old one is closed by NIO on the read error), reading the current state again.
/// A socket that cannot be opened is tried again every `reopenDelay`.
public final class NetworkChangeMonitor: Sendable {
    public typealias Opener = @Sendable () throws -> NetlinkRouteSocket

    public static let reopenDelay: TimeAmount = .seconds(1)

    private let eventLoop: any EventLoop
    private let open: Opener
    private let onChange: @Sendable ([NetworkChange]) -> Void
    private let state = NIOLockedValueBox(State())

    private struct State {
        var channel: (any Channel)?
        var stopped = false
        /// Sockets opened so far (the first one included), for tests of the reopening.
        var opened = 0
    }

    private init(
        eventLoop: any EventLoop, open: @escaping Opener, onChange: @escaping @Sendable ([NetworkChange]) -> Void
    ) {
        self.eventLoop = eventLoop
        self.open = open
        self.onChange = onChange
    }

    /// Opens the socket (with `open`, by default in this process's network namespace) and starts reading. Fails
    /// when the first socket cannot be opened (no `AF_NETLINK`: a sandbox forbidding it); later failures are retried.
    public static func start(
        on eventLoop: any EventLoop, open: @escaping Opener = { try NetlinkRouteSocket.open() },
        onChange: @escaping @Sendable ([NetworkChange]) -> Void
    ) -> EventLoopFuture<NetworkChangeMonitor> {
        let monitor = NetworkChangeMonitor(eventLoop: eventLoop, open: open, onChange: onChange)
        let socket: NetlinkRouteSocket
        do {
            socket = try open()
        } catch {
            return eventLoop.makeFailedFuture(error)
        }
        return monitor.attach(socket).map { monitor }
    }

    /// Closes the socket; no `onChange` call starts after the returned future completes.
    public func stop() -> EventLoopFuture<Void> {
        let channel = state.withLockedValue { state -> (any Channel)? in
            state.stopped = true
            defer { state.channel = nil }
            return state.channel
        }
        guard let channel else { return eventLoop.makeSucceededVoidFuture() }
        return channel.close().recover { _ in }
    }

    /// Sockets opened since `start` (1 until a reopen).
    public var socketsOpened: Int { state.withLockedValue { $0.opened } }

    private func attach(_ socket: NetlinkRouteSocket) -> EventLoopFuture<Void> {
        guard let fd = socket.takeDescriptor() else {
            return eventLoop.makeFailedFuture(NetlinkSocketError(step: "descriptor already taken", errno: EBADF))
        }
        let decoder = socket.decoder
        let onChange = self.onChange
        let future = NIOPipeBootstrap(group: eventLoop)
            // One datagram per read, never cut short: a read smaller than the datagram would lose its end.
            .channelOption(
                .recvAllocator, value: FixedSizeRecvByteBufferAllocator(capacity: NetlinkRouteSocket.datagramCapacity)
            )
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(
                        NetlinkChangeHandler(decoder: decoder, onChange: onChange))
                }
            }
            .takingOwnershipOfDescriptor(input: fd)
        future.whenFailure { _ in _ = close(fd) }  // NIO leaves the descriptor to us when it fails
        return future.map { channel in
            let keep = self.state.withLockedValue { state -> Bool in
                state.opened += 1
                guard !state.stopped else { return false }
                state.channel = channel
                return true
            }
            guard keep else {
                channel.close(promise: nil)
                return
            }
            channel.closeFuture.whenComplete { _ in self.channelClosed(channel) }
        }
    }

    /// The channel closed by itself (a read error): open another unless stopping.
    private func channelClosed(_ channel: any Channel) {
        let reopen = state.withLockedValue { state -> Bool in
            guard !state.stopped, state.channel === channel else { return false }
            state.channel = nil
            return true
        }
        if reopen { reopenSoon(after: .zero) }
    }

    private func reopenSoon(after delay: TimeAmount) {
        eventLoop.scheduleTask(in: delay) {
            guard !self.state.withLockedValue({ $0.stopped }) else { return }
            do {
                let socket = try self.open()
                self.attach(socket).whenFailure { _ in self.reopenSoon(after: Self.reopenDelay) }
            } catch {
                self.reopenSoon(after: Self.reopenDelay)
            }
        }
    }
}

/// Decodes each datagram and reports the changes of a read burst together.
final class NetlinkChangeHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer

    private var decoder: NetlinkChangeDecoder
    private var pending: [NetworkChange] = []
    private let onChange: @Sendable ([NetworkChange]) -> Void

    init(decoder: NetlinkChangeDecoder, onChange: @escaping @Sendable ([NetworkChange]) -> Void) {
        self.decoder = decoder
        self.onChange = onChange
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let buffer = unwrapInboundIn(data)
        let result = buffer.withUnsafeReadableBytes { decoder.decode($0) }
        pending += result.changes
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        flush()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // ENOBUFS: announcements were dropped. NIO closes the channel after a read error; the monitor reopens.
        if let error = error as? IOError, error.errnoCode == ENOBUFS { pending.append(.eventsLost) }
        flush()
    }

    private func flush() {
        guard !pending.isEmpty else { return }
        let changes = pending
        pending = []
        onChange(changes)
    }
}
