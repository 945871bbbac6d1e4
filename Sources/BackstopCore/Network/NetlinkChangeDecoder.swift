/// Turns rtnetlink datagrams (`NETLINK_ROUTE` multicast notifications and dump replies) into the network changes
/// that can make an unreachable upstream reachable again: a link coming up, an address or a route being added
/// (docs/reference/behaviour.md#the-network-coming-back). Everything else (links going down, addresses and routes
/// removed, statistics updates) is not a change worth waking for.
///
/// Pure and stateful: the kernel re-announces links on every flag or statistics change and IPv6 addresses on every
/// lifetime refresh, so the decoder remembers each link's flags and the addresses it has seen, and reports only
/// transitions: a link that was not up and running and now is, an address not seen before. Replies to a dump
/// (`NLM_F_MULTI`) only teach it the current state. Tentative IPv6 addresses (duplicate address detection still
/// running), host-scoped ones (loopback) and link-scoped ones (link-local) are not changes; loopback links neither.
///
/// Bounded: at most `maxLinks` links and `maxAddresses` addresses are remembered (more are forgotten wholesale,
/// which can only make a later announcement look new). Malformed input never traps: parsing of a datagram stops at
/// the first message whose length does not fit (only the kernel and root can send to this socket).
public struct NetlinkChangeDecoder: Sendable, Equatable {
    public static let maxLinks = 4096
    public static let maxAddresses = 16384

    private var links: [Int32: LinkState] = [:]
    private var addresses: Set<AddressKey> = []

    private struct LinkState: Sendable, Equatable {
        var flags: UInt32
        var name: String
    }

    private struct AddressKey: Sendable, Hashable {
        var index: Int32
        var family: UInt8
        var prefixLength: UInt8
        /// `IFA_LOCAL` then `IFA_ADDRESS` (the peer of a point-to-point address).
        var bytes: [UInt8]
    }

    public init() {}

    /// Links currently up and running (not loopback), as far as the decoder has been told.
    public var usableLinks: Int { links.values.count { Self.usable($0.flags) } }

    /// Decodes one datagram: every message in it, in order.
    public mutating func decode(_ datagram: UnsafeRawBufferPointer) -> NetlinkDecodeResult {
        var result = NetlinkDecodeResult()
        var offset = 0
        while datagram.count - offset >= Netlink.headerLength {
            let length = Int(datagram.loadUnaligned(fromByteOffset: offset, as: UInt32.self))
            guard length >= Netlink.headerLength, length <= datagram.count - offset else {
                result.malformed = true
                break
            }
            let type = datagram.loadUnaligned(fromByteOffset: offset + 4, as: UInt16.self)
            let flags = datagram.loadUnaligned(fromByteOffset: offset + 6, as: UInt16.self)
            let payload = UnsafeRawBufferPointer(
                rebasing: datagram[(offset + Netlink.headerLength)..<(offset + length)])
            message(type: type, isDump: flags & Netlink.flagMulti != 0, payload: payload, into: &result)
            offset += Netlink.align(length)
        }
        // Bytes left over that are more than a message's padding: a header cut short.
        if !result.malformed && datagram.count - offset > 3 { result.malformed = true }
        return result
    }

    /// `decode` for a byte array (tests, the fuzz target).
    public mutating func decode(_ datagram: [UInt8]) -> NetlinkDecodeResult {
        datagram.withUnsafeBytes { decode($0) }
    }

    private mutating func message(
        type: UInt16, isDump: Bool, payload: UnsafeRawBufferPointer, into result: inout NetlinkDecodeResult
    ) {
        switch type {
        case Netlink.done:
            result.dumpDone = true
        case Netlink.error:
            // An int32 errno (negative; 0 acknowledges a request), then the request's header.
            guard payload.count >= 4 else {
                result.malformed = true
                return
            }
            let code = payload.loadUnaligned(as: Int32.self)
            if code != 0 { result.requestError = code }
        case Netlink.overrun:
            result.changes.append(.eventsLost)
        case Netlink.newLink, Netlink.deleteLink:
            link(deleted: type == Netlink.deleteLink, isDump: isDump, payload: payload, into: &result)
        case Netlink.newAddress, Netlink.deleteAddress:
            address(deleted: type == Netlink.deleteAddress, isDump: isDump, payload: payload, into: &result)
        case Netlink.newRoute:
            if !isDump { route(payload: payload, into: &result) }
        default:
            break
        }
    }

    // MARK: links

    /// `struct ifinfomsg`: family u8, pad u8, type u16, index i32, flags u32, change u32; then attributes.
    private mutating func link(
        deleted: Bool, isDump: Bool, payload: UnsafeRawBufferPointer, into result: inout NetlinkDecodeResult
    ) {
        guard payload.count >= 16 else {
            result.malformed = true
            return
        }
        // AF_BRIDGE (and other families) announce a bridge port's state, not the link's: the link's own messages
        // are AF_UNSPEC.
        guard payload[0] == 0 else { return }
        let index = payload.loadUnaligned(fromByteOffset: 4, as: Int32.self)
        let flags = payload.loadUnaligned(fromByteOffset: 8, as: UInt32.self)
        if deleted {
            links[index] = nil
            addresses = addresses.filter { $0.index != index }
            return
        }
        var name = links[index]?.name ?? ""
        Netlink.attributes(in: payload, from: 16) { type, value in
            if type == Netlink.linkName { name = Netlink.string(value) }
        }
        let before = links[index]
        if before == nil && links.count >= Self.maxLinks { links.removeAll() }
        links[index] = LinkState(flags: flags, name: name)
        // A link never seen before that is already usable came up as far as anyone here can tell.
        if !isDump, Self.usable(flags), !(before.map { Self.usable($0.flags) } ?? false) {
            result.changes.append(.linkUp(index: index, name: name))
        }
    }

    /// Up (administratively) and running (operationally: carrier, RFC 2863 OPER_UP), and not loopback.
    static func usable(_ flags: UInt32) -> Bool {
        flags & Netlink.interfaceUp != 0 && flags & Netlink.interfaceRunning != 0
            && flags & Netlink.interfaceLoopback == 0
    }

    // MARK: addresses

    /// `struct ifaddrmsg`: family u8, prefix length u8, flags u8, scope u8, index u32; then attributes.
    private mutating func address(
        deleted: Bool, isDump: Bool, payload: UnsafeRawBufferPointer, into result: inout NetlinkDecodeResult
    ) {
        guard payload.count >= 8 else {
            result.malformed = true
            return
        }
        let family = payload[0]
        // IPv4 and IPv6 only (AF_MCTP and others have addresses of other sizes and reach no upstream).
        guard let width = Netlink.addressWidth(family: family) else { return }
        let prefixLength = payload[1]
        var flags = UInt32(payload[2])
        let scope = payload[3]
        let index = payload.loadUnaligned(fromByteOffset: 4, as: Int32.self)
        var local: [UInt8]?
        var address: [UInt8]?
        Netlink.attributes(in: payload, from: 8) { type, value in
            switch type {
            case Netlink.addressLocal where value.count >= width: local = Array(value.prefix(width))
            case Netlink.addressAddress where value.count >= width: address = Array(value.prefix(width))
            case Netlink.addressFlags where value.count >= 4: flags = value.loadUnaligned(as: UInt32.self)
            default: break
            }
        }
        guard let primary = local ?? address else {
            result.malformed = true
            return
        }
        let key = AddressKey(
            index: index, family: family, prefixLength: prefixLength,
            bytes: primary + (local != nil ? address ?? [] : []))
        if deleted {
            addresses.remove(key)
            return
        }
        // Not usable yet (or ever): a later announcement without these flags is the one that counts. A link-scoped
        // address (IPv6 `fe80::/10`, IPv4 `169.254/16`) reaches no upstream beyond its link, and the kernel adds it
        // a second or two after the link came up (duplicate address detection), which was the change already: a
        // second wake then only spends a waiting request's attempt on a network that is still missing.
        guard scope != Netlink.scopeHost, scope != Netlink.scopeLink,
            flags & (Netlink.addressTentative | Netlink.addressDADFailed) == 0
        else {
            addresses.remove(key)
            return
        }
        if addresses.count >= Self.maxAddresses && !addresses.contains(key) { addresses.removeAll() }
        let isNew = addresses.insert(key).inserted
        if isNew && !isDump {
            let cidr = CIDR(address: primary, prefixLength: Swift.min(Int(prefixLength), width * 8))
            result.changes.append(.addressAdded(cidr, index: index))
        }
    }

    // MARK: routes

    /// `struct rtmsg`: family, dst_len, src_len, tos, table, protocol, scope, type (u8 each), flags u32; then
    /// attributes. Only unicast routes count: local, broadcast and multicast ones come with addresses, cloned ones
    /// are the kernel's cache.
    private mutating func route(payload: UnsafeRawBufferPointer, into result: inout NetlinkDecodeResult) {
        guard payload.count >= 12 else {
            result.malformed = true
            return
        }
        guard let width = Netlink.addressWidth(family: payload[0]) else { return }
        let destinationLength = payload[1]
        let type = payload[7]
        let flags = payload.loadUnaligned(fromByteOffset: 8, as: UInt32.self)
        guard type == Netlink.routeUnicast, flags & Netlink.routeCloned == 0 else { return }
        var destination: [UInt8]?
        var interface: Int32?
        Netlink.attributes(in: payload, from: 12) { type, value in
            switch type {
            case Netlink.routeDestination where value.count >= width: destination = Array(value.prefix(width))
            case Netlink.routeOutputInterface where value.count >= 4: interface = value.loadUnaligned(as: Int32.self)
            default: break
            }
        }
        let bytes = destination ?? Array(repeating: 0, count: width)
        let cidr = CIDR(address: bytes, prefixLength: Swift.min(Int(destinationLength), width * 8))
        result.changes.append(.routeAdded(cidr, index: interface))
    }
}

/// What one datagram said.
public struct NetlinkDecodeResult: Sendable, Equatable {
    /// In the order the messages came.
    public var changes: [NetworkChange] = []
    /// An `NLMSG_DONE` ended a dump.
    public var dumpDone = false
    /// An `NLMSG_ERROR` answered a request with this (negative) errno.
    public var requestError: Int32?
    /// A message was cut short or its length did not fit; the rest of the datagram was skipped.
    public var malformed = false

    public init(
        changes: [NetworkChange] = [], dumpDone: Bool = false, requestError: Int32? = nil,
        malformed: Bool = false
    ) {
        self.changes = changes
        self.dumpDone = dumpDone
        self.requestError = requestError
        self.malformed = malformed
    }
}

/// A change of the host's network that may make an unreachable destination reachable.
public enum NetworkChange: Sendable, Equatable, CustomStringConvertible {
    /// A link became up and running.
    case linkUp(index: Int32, name: String)
    /// A usable address was added to link `index`.
    case addressAdded(CIDR, index: Int32)
    /// A unicast route was added (through link `index` when the kernel named one).
    case routeAdded(CIDR, index: Int32?)
    /// The kernel dropped notifications (the socket's buffer overflowed): anything may have changed.
    case eventsLost

    public var description: String {
        switch self {
        case .linkUp(let index, let name): "link \(index)\(name.isEmpty ? "" : " (\(name))") up"
        case .addressAdded(let cidr, let index): "address \(cidr) added on link \(index)"
        case .routeAdded(let cidr, let index?): "route \(cidr) added on link \(index)"
        case .routeAdded(let cidr, nil): "route \(cidr) added"
        case .eventsLost: "netlink notifications lost"
        }
    }
}

/// The rtnetlink numbers this project reads and writes (linux/netlink.h, linux/rtnetlink.h, linux/if.h,
/// linux/if_addr.h, linux/if_link.h): stable kernel ABI, spelled out so the decoder stays free of platform modules.
public enum Netlink {
    public static let headerLength = 16
    /// `NLM_F_REQUEST`, `NLM_F_MULTI`, `NLM_F_ACK`, `NLM_F_DUMP` (`NLM_F_ROOT | NLM_F_MATCH`).
    public static let flagRequest: UInt16 = 0x1
    public static let flagMulti: UInt16 = 0x2
    public static let flagAck: UInt16 = 0x4
    public static let flagDump: UInt16 = 0x300

    public static let error: UInt16 = 2
    public static let done: UInt16 = 3
    public static let overrun: UInt16 = 4
    public static let newLink: UInt16 = 16
    public static let deleteLink: UInt16 = 17
    public static let getLink: UInt16 = 18
    public static let newAddress: UInt16 = 20
    public static let deleteAddress: UInt16 = 21
    public static let getAddress: UInt16 = 22
    public static let newRoute: UInt16 = 24
    public static let deleteRoute: UInt16 = 25

    /// Multicast groups: `RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV4_ROUTE | RTMGRP_IPV6_IFADDR |
    /// RTMGRP_IPV6_ROUTE`.
    public static let changeGroups: UInt32 = 0x1 | 0x10 | 0x40 | 0x100 | 0x400

    static let interfaceUp: UInt32 = 0x1
    static let interfaceLoopback: UInt32 = 0x8
    static let interfaceRunning: UInt32 = 0x40
    static let linkName: UInt16 = 3  // IFLA_IFNAME
    static let addressAddress: UInt16 = 1  // IFA_ADDRESS
    static let addressLocal: UInt16 = 2  // IFA_LOCAL
    static let addressFlags: UInt16 = 8  // IFA_FLAGS
    static let addressDADFailed: UInt32 = 0x08
    static let addressTentative: UInt32 = 0x40
    static let scopeLink: UInt8 = 253
    static let scopeHost: UInt8 = 254
    static let routeUnicast: UInt8 = 1  // RTN_UNICAST
    static let routeCloned: UInt32 = 0x200  // RTM_F_CLONED
    static let routeDestination: UInt16 = 1  // RTA_DST
    static let routeOutputInterface: UInt16 = 4  // RTA_OIF
    static let familyIPv4: UInt8 = 2  // AF_INET
    static let familyIPv6: UInt8 = 10  // AF_INET6

    /// Address bytes of an IPv4 or IPv6 family; nil for others.
    static func addressWidth(family: UInt8) -> Int? {
        switch family {
        case familyIPv4: 4
        case familyIPv6: 16
        default: nil
        }
    }
    /// `NLA_F_NESTED | NLA_F_NET_BYTEORDER`, masked off attribute types.
    static let attributeTypeMask: UInt16 = 0x3FFF

    /// `NLMSG_ALIGN` / `RTA_ALIGN`: 4 bytes.
    static func align(_ length: Int) -> Int { (length + 3) & ~3 }

    /// Calls `body` with each well-formed `rtattr` (len u16, type u16, value) from `start`; stops at the first
    /// one that does not fit.
    static func attributes(
        in payload: UnsafeRawBufferPointer, from start: Int, _ body: (UInt16, UnsafeRawBufferPointer) -> Void
    ) {
        var offset = start
        while payload.count - offset >= 4 {
            let length = Int(payload.loadUnaligned(fromByteOffset: offset, as: UInt16.self))
            guard length >= 4, length <= payload.count - offset else { return }
            let type = payload.loadUnaligned(fromByteOffset: offset + 2, as: UInt16.self) & attributeTypeMask
            body(type, UnsafeRawBufferPointer(rebasing: payload[(offset + 4)..<(offset + length)]))
            offset += align(length)
        }
    }

    /// A NUL-terminated attribute string (interface names are at most 15 bytes plus NUL).
    static func string(_ value: UnsafeRawBufferPointer) -> String {
        let bytes = value.prefix(16).prefix { $0 != 0 }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// A dump request (`RTM_GETLINK` or `RTM_GETADDR` with `NLM_F_REQUEST | NLM_F_DUMP`) for every family: the
    /// header and a zeroed `struct rtgenmsg`, padded to 4 bytes.
    public static func dumpRequest(type: UInt16, sequence: UInt32) -> [UInt8] {
        var bytes: [UInt8] = []
        func append<T: FixedWidthInteger>(_ value: T) {
            withUnsafeBytes(of: value) { bytes.append(contentsOf: $0) }
        }
        append(UInt32(headerLength + 4))
        append(type)
        append(flagRequest | flagDump)
        append(sequence)
        append(UInt32(0))
        append(UInt32(0))  // rtgen_family AF_UNSPEC and padding
        return bytes
    }
}
