import BackstopCore
import NIOCore
import NIOPosix

#if canImport(Glibc)
import Glibc
#endif

/// Opens the upstream side of a blind tunnel (docs/reference/https-clients.md#tunnels): resolves the host once,
/// judges every address it resolved to (`tunnels.deny_addresses`, and Backstop's own listeners), and connects to
/// the allowed addresses in order until one answers. The address connected to is one that was checked: nothing is
/// resolved again, so a name cannot change where it points between the check and the connection (DNS rebinding).
enum TunnelConnector {
    /// Why no tunnel was opened.
    enum Failure: Error, Equatable {
        /// Every address is in `deny_addresses` (403 `tunnel-denied`).
        case denied(addresses: [String])
        /// An address is one of Backstop's own listeners and none other is allowed (508 `loop-detected`).
        case loop
        /// The name did not resolve, or no allowed address accepted a connection (502 `tunnel-unreachable`).
        case unreachable(String)

        var reason: ProxyErrorReason {
            switch self {
            case .denied: .tunnelDenied
            case .loop: .loopDetected
            case .unreachable: .tunnelUnreachable
            }
        }

        /// For the access line: what was tried and why it failed.
        var detail: String {
            switch self {
            case .denied(let addresses): "denied address \(addresses.joined(separator: ","))"
            case .loop: "address of backstop itself"
            case .unreachable(let why): why
            }
        }
    }

    /// How long one connection attempt to one address may take.
    static let connectTimeout = TimeAmount.seconds(10)
    /// How long a name may take to resolve.
    static let resolveTimeout = TimeAmount.seconds(10)

    /// The connected channel (not reading yet: `autoRead` is off until the tunnel is glued) and the address it
    /// reached.
    static func connect(
        _ target: ConnectTarget, policy: ConnectPolicy, destinationGuard: DestinationGuard, eventLoop: EventLoop
    ) -> EventLoopFuture<(Channel, SocketAddress)> {
        let resolved: EventLoopFuture<[SocketAddress]>
        if let literal = target.address {
            resolved = eventLoop.makeCompletedFuture { [try socketAddress(literal, port: target.port)] }
        } else {
            let host = target.host
            let port = target.port
            let lookup = NIOThreadPool.singleton.runIfActive(eventLoop: eventLoop) { try resolve(host, port: port) }
            // getaddrinfo cannot be cancelled; its answer is ignored once the client has been answered.
            let answered = eventLoop.makePromise(of: [SocketAddress].self)
            lookup.cascade(to: answered)
            eventLoop.scheduleTask(in: resolveTimeout) {
                answered.fail(
                    Failure.unreachable(
                        "\(host) did not resolve within \(resolveTimeout.nanoseconds / 1_000_000_000) s"))
            }
            resolved = answered.futureResult
        }
        return resolved.flatMapError { error in
            eventLoop.makeFailedFuture(error as? Failure ?? Failure.unreachable("\(target.host) does not resolve"))
        }.flatMap { addresses in
            var allowed: [SocketAddress] = []
            var denied: [String] = []
            var loop = false
            for address in addresses {
                guard let bytes = ProxyServer.addressBytes(address) else { continue }
                // Backstop's own listeners and the unspecified addresses are loops whatever the deny list says.
                if destinationGuard.check(address: bytes, port: target.port, passthrough: false) == .loop {
                    loop = true
                } else if !policy.allowsAddress(bytes) {
                    denied.append(address.ipAddress ?? "?")
                } else {
                    allowed.append(address)
                }
            }
            guard !allowed.isEmpty else {
                return eventLoop.makeFailedFuture(loop ? Failure.loop : Failure.denied(addresses: denied))
            }
            return connectFirst(allowed, eventLoop: eventLoop, failures: [])
        }
    }

    private static func connectFirst(
        _ addresses: [SocketAddress], eventLoop: EventLoop, failures: [String]
    ) -> EventLoopFuture<(Channel, SocketAddress)> {
        guard let address = addresses.first else {
            return eventLoop.makeFailedFuture(Failure.unreachable(failures.joined(separator: "; ")))
        }
        return ClientBootstrap(group: eventLoop)
            .connectTimeout(connectTimeout)
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .channelOption(.allowRemoteHalfClosure, value: true)
            .channelOption(.autoRead, value: false)
            .connect(to: address)
            .map { ($0, address) }
            .flatMapError { error in
                connectFirst(
                    Array(addresses.dropFirst()), eventLoop: eventLoop,
                    failures: failures + ["\(address.displayString): \(describe(error))"])
            }
    }

    private static func describe(_ error: any Error) -> String {
        if let io = error as? IOError { return String(cString: strerror(io.errnoCode)) }
        if error is ChannelError { return "connect timed out" }
        return String(describing: type(of: error))
    }

    /// `getaddrinfo` (blocking: runs on NIO's thread pool). Duplicates removed, order kept.
    private static func resolve(_ host: String, port: Int) throws -> [SocketAddress] {
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var list: UnsafeMutablePointer<addrinfo>?
        let status = getaddrinfo(host, nil, &hints, &list)
        guard status == 0, let list else {
            throw Failure.unreachable("\(host) does not resolve: \(String(cString: gai_strerror(status)))")
        }
        defer { freeaddrinfo(list) }
        var addresses: [SocketAddress] = []
        var seen: Set<[UInt8]> = []
        var node: UnsafeMutablePointer<addrinfo>? = list
        while let current = node {
            node = current.pointee.ai_next
            guard let raw = current.pointee.ai_addr else { continue }
            let bytes: [UInt8]
            switch Int32(current.pointee.ai_family) {
            case AF_INET:
                bytes = raw.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { pointer in
                    withUnsafeBytes(of: pointer.pointee.sin_addr) { Array($0) }
                }
            case AF_INET6:
                bytes = raw.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { pointer in
                    withUnsafeBytes(of: pointer.pointee.sin6_addr) { Array($0) }
                }
            default:
                continue
            }
            guard seen.insert(bytes).inserted else { continue }
            addresses.append(try socketAddress(bytes, port: port))
        }
        guard !addresses.isEmpty else { throw Failure.unreachable("\(host) has no IPv4 or IPv6 address") }
        return addresses
    }

    private static func socketAddress(_ bytes: [UInt8], port: Int) throws -> SocketAddress {
        try SocketAddress(packedIPAddress: ByteBuffer(bytes: bytes), port: port)
    }
}
