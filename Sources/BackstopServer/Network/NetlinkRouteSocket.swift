import BackstopCore
import NIOConcurrencyHelpers

#if canImport(Glibc)
import Glibc
#endif

/// An rtnetlink socket (`NETLINK_ROUTE`) joined to the groups that announce links, addresses and routes, with the
/// state of the links and addresses as the kernel listed them when it opened (so later announcements are judged as
/// changes, not as news). Owns its descriptor until `takeDescriptor()` hands it on (to NIO); closes it otherwise.
///
/// The socket belongs to the network namespace of the thread that opens it.
public final class NetlinkRouteSocket: Sendable {
    /// -1 once taken.
    private let descriptor: NIOLockedValueBox<CInt>
    /// The decoder as the initial dumps left it.
    public let decoder: NetlinkChangeDecoder

    private init(descriptor: CInt, decoder: NetlinkChangeDecoder) {
        self.descriptor = NIOLockedValueBox(descriptor)
        self.decoder = decoder
    }

    deinit {
        let fd = descriptor.withLockedValue { $0 }
        if fd >= 0 { _ = close(fd) }
    }

    /// The descriptor, once: its owner from now on must close it.
    public func takeDescriptor() -> CInt? {
        descriptor.withLockedValue { fd in
            defer { fd = -1 }
            return fd >= 0 ? fd : nil
        }
    }

    /// Receive buffer asked for: a burst of announcements (an interface with many addresses going up) should not
    /// overflow it. The kernel caps it at `net.core.rmem_max` without error.
    public static let receiveBuffer: CInt = 1 << 20
    /// Large enough for any datagram the kernel sends (it builds dump replies of at most 32 KiB).
    public static let datagramCapacity = 64 << 10

    /// Opens, subscribes and reads the current links and addresses (two dumps, a few milliseconds of blocking reads
    /// on a local socket; at most 2 s each if the kernel did not answer). `receiveBufferSize` is for tests that make
    /// the kernel drop announcements.
    public static func open(
        receiveBufferSize: CInt = NetlinkRouteSocket.receiveBuffer
    ) throws(NetlinkSocketError) -> NetlinkRouteSocket {
        let fd = socket(AF_NETLINK, Int32(SOCK_RAW.rawValue) | Int32(SOCK_CLOEXEC.rawValue), netlinkRoute)
        guard fd >= 0 else { throw NetlinkSocketError(step: "socket(AF_NETLINK)", errno: errno) }
        do throws(NetlinkSocketError) {
            var size = receiveBufferSize
            // Best effort: a smaller buffer only makes an overflow (reported as `eventsLost`) likelier.
            _ = setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<CInt>.size))
            var timeout = timeval(tv_sec: 2, tv_usec: 0)
            try check(
                setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size)),
                "setsockopt(SO_RCVTIMEO)")
            let address = Self.address(groups: Netlink.changeGroups)
            let bound = address.withUnsafeBytes {
                bind(fd, $0.baseAddress!.assumingMemoryBound(to: sockaddr.self), socklen_t($0.count))
            }
            try check(bound, "bind(RTMGRP_LINK|IFADDR|ROUTE)")
            var decoder = NetlinkChangeDecoder()
            try dump(fd, type: Netlink.getLink, sequence: 1, into: &decoder)
            try dump(fd, type: Netlink.getAddress, sequence: 2, into: &decoder)
            return NetlinkRouteSocket(descriptor: fd, decoder: decoder)
        } catch {
            _ = close(fd)
            throw error
        }
    }

    /// `NETLINK_ROUTE` (linux/netlink.h, which the Glibc module does not import).
    static let netlinkRoute: CInt = 0

    /// `struct sockaddr_nl` (family u16, pad u16, port id u32, groups u32), the port id left to the kernel.
    static func address(groups: UInt32) -> [UInt8] {
        withUnsafeBytes(of: UInt16(AF_NETLINK)) { Array($0) } + [0, 0, 0, 0, 0, 0]
            + withUnsafeBytes(of: groups) { Array($0) }
    }

    private static func check(_ rc: CInt, _ step: String) throws(NetlinkSocketError) {
        if rc != 0 { throw NetlinkSocketError(step: step, errno: errno) }
    }

    /// Sends one dump request and feeds the replies (and any announcement that arrives meanwhile) to `decoder`
    /// until the dump's `NLMSG_DONE`.
    private static func dump(
        _ fd: CInt, type: UInt16, sequence: UInt32, into decoder: inout NetlinkChangeDecoder
    ) throws(NetlinkSocketError) {
        let request = Netlink.dumpRequest(type: type, sequence: sequence)
        let sent = request.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, 0) }
        guard sent == request.count else { throw NetlinkSocketError(step: "send(dump request)", errno: errno) }
        var buffer = [UInt8](repeating: 0, count: datagramCapacity)
        while true {
            let received = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if received < 0 {
                if errno == EINTR { continue }
                // ENOBUFS here means announcements were dropped while dumping: the dump itself goes on.
                if errno == ENOBUFS { continue }
                throw NetlinkSocketError(step: "recv(dump reply)", errno: errno)
            }
            let result = buffer.withUnsafeBytes { decoder.decode(UnsafeRawBufferPointer(rebasing: $0[0..<received])) }
            if let code = result.requestError { throw NetlinkSocketError(step: "dump request", errno: -code) }
            if result.dumpDone { return }
        }
    }
}

/// A netlink socket could not be opened or read: the step and the errno.
public struct NetlinkSocketError: Error, Sendable, Equatable, CustomStringConvertible {
    public var step: String
    public var errno: Int32

    public init(step: String, errno: Int32) {
        self.step = step
        self.errno = errno
    }

    public var description: String { "\(step): \(String(cString: strerror(errno))) (errno \(errno))" }
}
