import BackstopCore
import Testing

/// Builds rtnetlink messages as the kernel lays them out (host byte order, 4-byte alignment).
enum NL {
    static func bytes<T: FixedWidthInteger>(_ value: T) -> [UInt8] { withUnsafeBytes(of: value) { Array($0) } }

    static func padded(_ bytes: [UInt8]) -> [UInt8] {
        bytes + Array(repeating: 0, count: (4 - bytes.count % 4) % 4)
    }

    static func message(_ type: UInt16, flags: UInt16 = 0, _ payload: [UInt8]) -> [UInt8] {
        let body = padded(payload)
        return bytes(UInt32(16 + payload.count)) + bytes(type) + bytes(flags) + bytes(UInt32(0)) + bytes(UInt32(0))
            + body
    }

    static func attribute(_ type: UInt16, _ value: [UInt8]) -> [UInt8] {
        padded(bytes(UInt16(4 + value.count)) + bytes(type) + value)
    }

    static let up: UInt32 = 0x1, loopback: UInt32 = 0x8, running: UInt32 = 0x40

    static func link(
        _ index: Int32, flags: UInt32, name: String? = nil, family: UInt8 = 0, type: UInt16 = 16, dump: Bool = false
    ) -> [UInt8] {
        var payload = [family, 0] + bytes(UInt16(1)) + bytes(index) + bytes(flags) + bytes(UInt32(0))
        if let name { payload += attribute(3, Array(name.utf8) + [0]) }
        return message(type, flags: dump ? 2 : 0, payload)
    }

    static func address(
        _ index: Int32, _ local: [UInt8], prefix: UInt8, family: UInt8? = nil, flags: UInt8 = 0, scope: UInt8 = 0,
        peer: [UInt8]? = nil, extendedFlags: UInt32? = nil, type: UInt16 = 20, dump: Bool = false
    ) -> [UInt8] {
        let family = family ?? (local.count == 4 ? 2 : 10)
        var payload = [family, prefix, flags, scope] + bytes(UInt32(bitPattern: index))
        payload += attribute(2, local)
        if let peer { payload += attribute(1, peer) }
        if let extendedFlags { payload += attribute(8, bytes(extendedFlags)) }
        return message(type, flags: dump ? 2 : 0, payload)
    }

    static func route(
        family: UInt8 = 2, destination: [UInt8]? = nil, length: UInt8 = 0, type: UInt8 = 1, flags: UInt32 = 0,
        interface: Int32? = nil, messageType: UInt16 = 24, dump: Bool = false
    ) -> [UInt8] {
        var payload: [UInt8] = [family, length, 0, 0, 254, 3, 0, type] + bytes(flags)
        if let destination { payload += attribute(1, destination) }
        if let interface { payload += attribute(4, bytes(interface)) }
        return message(messageType, flags: dump ? 2 : 0, payload)
    }

    static func error(_ code: Int32) -> [UInt8] { message(2, bytes(code) + Array(repeating: 0, count: 16)) }
}

@Suite("NetlinkChangeDecoder")
struct NetlinkChangeDecoderTests {
    static func cidr(_ bytes: [UInt8], _ length: Int) -> CIDR { CIDR(address: bytes, prefixLength: length) }
    static let v6: [UInt8] = [0x20, 0x01, 0x0d, 0xb8] + Array(repeating: 0, count: 11) + [1]

    /// Feeds each datagram in turn and returns the changes of each.
    static func changes(_ datagrams: [[UInt8]], decoder: inout NetlinkChangeDecoder) -> [[NetworkChange]] {
        datagrams.map { decoder.decode($0).changes }
    }

    static func changes(_ datagrams: [[UInt8]]) -> [[NetworkChange]] {
        var decoder = NetlinkChangeDecoder()
        return changes(datagrams, decoder: &decoder)
    }

    @Test("a link that comes up is a change once; staying up, going down and statistics are not")
    func linkTransitions() {
        let upRunning = NL.up | NL.running
        #expect(
            Self.changes([
                NL.link(3, flags: NL.up, name: "eth0"),  // up, no carrier yet
                NL.link(3, flags: upRunning),  // carrier: the kernel sends ifi_change 0 for it
                NL.link(3, flags: upRunning),  // a statistics or attribute update
                NL.link(3, flags: 0),  // down
                NL.link(3, flags: upRunning, name: "eth1"),  // up again, renamed
            ]) == [[], [.linkUp(index: 3, name: "eth0")], [], [], [.linkUp(index: 3, name: "eth1")]])
    }

    @Test("an unknown link already usable counts; loopback never does")
    func unknownAndLoopback() {
        #expect(
            Self.changes([
                NL.link(7, flags: NL.up | NL.running, name: "wg0"),
                NL.link(1, flags: NL.up | NL.running | NL.loopback, name: "lo"),
            ]) == [[.linkUp(index: 7, name: "wg0")], []])
    }

    @Test("dump replies teach the state without reporting it")
    func dumpSeeds() {
        var decoder = NetlinkChangeDecoder()
        let dump =
            NL.link(2, flags: NL.up | NL.running, name: "eth0", dump: true)
            + NL.address(2, [10, 0, 0, 2], prefix: 24, dump: true) + NL.message(3, Array(repeating: 0, count: 4))
        let result = decoder.decode(dump)
        #expect(result == NetlinkDecodeResult(changes: [], dumpDone: true))
        #expect(decoder.usableLinks == 1)
        // The same link and address announced again: nothing new.
        #expect(
            Self.changes(
                [NL.link(2, flags: NL.up | NL.running), NL.address(2, [10, 0, 0, 2], prefix: 24)],
                decoder: &decoder) == [[], []])
    }

    @Test("bridge port announcements (AF_BRIDGE) are not the link's own")
    func bridgeFamily() {
        var decoder = NetlinkChangeDecoder()
        #expect(
            Self.changes(
                [
                    NL.link(4, flags: NL.up | NL.running, name: "veth0", family: 7),
                    NL.link(4, flags: NL.up | NL.running, name: "veth0", family: 7, type: 17),
                ], decoder: &decoder) == [[], []])
        #expect(decoder.usableLinks == 0)
    }

    @Test("a deleted link is forgotten, with its addresses")
    func deletedLink() {
        #expect(
            Self.changes([
                NL.link(5, flags: NL.up | NL.running, name: "usb0"),
                NL.address(5, [192, 168, 1, 9], prefix: 24),
                NL.link(5, flags: 0, type: 17),
                NL.link(5, flags: NL.up | NL.running),
                NL.address(5, [192, 168, 1, 9], prefix: 24),
            ]) == [
                [.linkUp(index: 5, name: "usb0")], [.addressAdded(Self.cidr([192, 168, 1, 9], 24), index: 5)], [],
                [.linkUp(index: 5, name: "")], [.addressAdded(Self.cidr([192, 168, 1, 9], 24), index: 5)],
            ])
    }

    @Test("addresses: new ones count, refreshes do not, removal makes the next one new")
    func addresses() {
        let a = Self.cidr([10, 1, 2, 3], 16)
        #expect(
            Self.changes([
                NL.address(2, [10, 1, 2, 3], prefix: 16),
                NL.address(2, [10, 1, 2, 3], prefix: 16),  // lifetime refresh
                NL.address(3, [10, 1, 2, 3], prefix: 16),  // same address on another link
                NL.address(2, [10, 1, 2, 3], prefix: 24),  // another prefix length
                NL.address(2, [10, 1, 2, 3], prefix: 16, type: 21),
                NL.address(2, [10, 1, 2, 3], prefix: 16),
            ]) == [
                [.addressAdded(a, index: 2)], [], [.addressAdded(a, index: 3)],
                [.addressAdded(Self.cidr([10, 1, 2, 3], 24), index: 2)], [], [.addressAdded(a, index: 2)],
            ])
    }

    @Test("an IPv6 address counts once duplicate address detection is over")
    func tentative() {
        #expect(
            Self.changes([
                NL.address(2, Self.v6, prefix: 64, flags: 0x40),
                NL.address(2, Self.v6, prefix: 64, flags: 0x00),
                NL.address(2, Self.v6, prefix: 64, flags: 0x00),
            ]) == [[], [.addressAdded(Self.cidr(Self.v6, 64), index: 2)], []])
        // IFA_FLAGS (32 bits) is what counts when present; a failed detection never counts.
        #expect(
            Self.changes([
                NL.address(2, Self.v6, prefix: 64, flags: 0, extendedFlags: 0x40),
                NL.address(2, Self.v6, prefix: 64, flags: 0x40, extendedFlags: 0x100),
                NL.address(3, Self.v6, prefix: 64, flags: 0x08),
            ]) == [[], [.addressAdded(Self.cidr(Self.v6, 64), index: 2)], []])
    }

    @Test("host- and link-scoped addresses, other families and cut attributes are not changes")
    func unusableAddresses() {
        var decoder = NetlinkChangeDecoder()
        #expect(
            Self.changes(
                [
                    NL.address(1, [127, 0, 0, 1], prefix: 8, scope: 254),
                    NL.address(2, [0xfe, 0x80] + Array(repeating: 0, count: 13) + [7], prefix: 64, scope: 253),
                    NL.address(2, [169, 254, 3, 4], prefix: 16, scope: 253),
                    NL.address(9, [8], prefix: 8, family: 45),  // AF_MCTP: one-byte addresses
                ], decoder: &decoder) == [[], [], [], []])
        let short = decoder.decode(NL.address(2, [10, 0], prefix: 8, family: 2))
        #expect(short == NetlinkDecodeResult(malformed: true))
    }

    @Test("a point-to-point address is told apart by its peer")
    func pointToPoint() {
        #expect(
            Self.changes([
                NL.address(6, [10, 8, 0, 1], prefix: 32, peer: [10, 8, 0, 2]),
                NL.address(6, [10, 8, 0, 1], prefix: 32, peer: [10, 8, 0, 3]),
                NL.address(6, [10, 8, 0, 1], prefix: 32, peer: [10, 8, 0, 2]),
            ]) == [
                [.addressAdded(Self.cidr([10, 8, 0, 1], 32), index: 6)],
                [.addressAdded(Self.cidr([10, 8, 0, 1], 32), index: 6)], [],
            ])
    }

    @Test("unicast routes added count every time; others do not")
    func routes() {
        #expect(
            Self.changes([
                NL.route(interface: 2),  // default route, no RTA_DST
                NL.route(family: 10, destination: Self.v6, length: 32),
                NL.route(interface: 2),  // announced again: routes are not remembered
                NL.route(destination: [10, 0, 0, 0], length: 8, flags: 0x200),  // cloned (cache)
                NL.route(destination: [10, 0, 0, 1], length: 32, type: 2),  // RTN_LOCAL
                NL.route(family: 10, destination: [0xff] + Array(repeating: 0, count: 15), length: 8, type: 5),
                NL.route(destination: [10, 0, 0, 0], length: 8, messageType: 25),  // removed
                NL.route(destination: [10, 0, 0, 0], length: 8, dump: true),
                NL.route(family: 7, destination: [1, 2, 3, 4], length: 8),
                NL.route(destination: [10, 9, 0, 0], length: 99),  // length clamped to the family's width
            ]) == [
                [.routeAdded(Self.cidr([0, 0, 0, 0], 0), index: 2)], [.routeAdded(Self.cidr(Self.v6, 32), index: nil)],
                [.routeAdded(Self.cidr([0, 0, 0, 0], 0), index: 2)], [], [], [], [], [], [],
                [.routeAdded(Self.cidr([10, 9, 0, 0], 32), index: nil)],
            ])
    }

    @Test("several messages in one datagram, in order")
    func batched() {
        var decoder = NetlinkChangeDecoder()
        let datagram =
            NL.link(2, flags: NL.up | NL.running, name: "eth0") + NL.address(2, [10, 0, 0, 2], prefix: 24)
            + NL.route(destination: [10, 0, 0, 0], length: 24, interface: 2)
        #expect(
            decoder.decode(datagram).changes == [
                .linkUp(index: 2, name: "eth0"), .addressAdded(Self.cidr([10, 0, 0, 2], 24), index: 2),
                .routeAdded(Self.cidr([10, 0, 0, 0], 24), index: 2),
            ])
    }

    @Test("control messages: done, errors, acknowledgements, overrun")
    func control() {
        var decoder = NetlinkChangeDecoder()
        #expect(decoder.decode(NL.message(3, [0, 0, 0, 0])) == NetlinkDecodeResult(dumpDone: true))
        #expect(decoder.decode(NL.error(-22)) == NetlinkDecodeResult(requestError: -22))
        #expect(decoder.decode(NL.error(0)) == NetlinkDecodeResult())
        #expect(decoder.decode(NL.message(4, [])) == NetlinkDecodeResult(changes: [.eventsLost]))
        #expect(decoder.decode(NL.message(2, [1, 2])) == NetlinkDecodeResult(malformed: true))
        #expect(decoder.decode(NL.message(1, [])) == NetlinkDecodeResult())  // NLMSG_NOOP
    }

    @Test("malformed datagrams stop at the first bad message and keep what came before")
    func malformed() {
        var decoder = NetlinkChangeDecoder()
        let good = NL.route(interface: 1)
        var tooLong = NL.route(interface: 2)
        tooLong.replaceSubrange(0..<4, with: NL.bytes(UInt32(tooLong.count + 1)))
        var tooShort = NL.route(interface: 3)
        tooShort.replaceSubrange(0..<4, with: NL.bytes(UInt32(15)))
        let route1 = NetworkChange.routeAdded(Self.cidr([0, 0, 0, 0], 0), index: 1)
        #expect(decoder.decode(good + tooLong) == NetlinkDecodeResult(changes: [route1], malformed: true))
        #expect(decoder.decode(good + tooShort + good) == NetlinkDecodeResult(changes: [route1], malformed: true))
        #expect(decoder.decode(good + [0, 0]) == NetlinkDecodeResult(changes: [route1]))
        #expect(decoder.decode(good + [0, 0, 0, 0, 0]) == NetlinkDecodeResult(changes: [route1], malformed: true))
        #expect(decoder.decode([]) == NetlinkDecodeResult())
        #expect(decoder.decode(NL.message(16, [0, 0, 0, 0])) == NetlinkDecodeResult(malformed: true))
        #expect(decoder.decode(NL.message(20, [2, 24])) == NetlinkDecodeResult(malformed: true))
        #expect(decoder.decode(NL.message(24, [2, 0, 0])) == NetlinkDecodeResult(malformed: true))
        // An attribute claiming more than is there ends the attributes, not the message.
        var cut = NL.link(8, flags: NL.up | NL.running, name: "eth9")
        cut.replaceSubrange(32..<34, with: NL.bytes(UInt16(200)))
        #expect(decoder.decode(cut) == NetlinkDecodeResult(changes: [.linkUp(index: 8, name: "")]))
    }

    @Test("memory stays bounded however many links and addresses are announced")
    func bounded() {
        var decoder = NetlinkChangeDecoder()
        for index in 0..<Int32(NetlinkChangeDecoder.maxLinks + 100) {
            _ = decoder.decode(NL.link(index, flags: NL.up | NL.running))
        }
        #expect(decoder.usableLinks <= NetlinkChangeDecoder.maxLinks)
        var added = 0
        for i in 0..<(NetlinkChangeDecoder.maxAddresses + 10) {
            let address: [UInt8] = [10, UInt8(i >> 16 & 0xff), UInt8(i >> 8 & 0xff), UInt8(i & 0xff)]
            added += decoder.decode(NL.address(2, address, prefix: 32)).changes.count
        }
        #expect(added == NetlinkChangeDecoder.maxAddresses + 10)
    }

    @Test("a dump request is a header and an AF_UNSPEC rtgenmsg")
    func dumpRequest() {
        #expect(
            Netlink.dumpRequest(type: Netlink.getLink, sequence: 1)
                == NL.bytes(UInt32(20)) + NL.bytes(UInt16(18)) + NL.bytes(UInt16(0x301)) + NL.bytes(UInt32(1))
                + NL.bytes(UInt32(0)) + [0, 0, 0, 0])
        #expect(Netlink.changeGroups == 0x551)
    }

    @Test("changes read well in a log line")
    func descriptions() {
        #expect(NetworkChange.linkUp(index: 3, name: "eth0").description == "link 3 (eth0) up")
        #expect(NetworkChange.linkUp(index: 3, name: "").description == "link 3 up")
        #expect(
            NetworkChange.addressAdded(Self.cidr([10, 0, 0, 2], 24), index: 3).description
                == "address 10.0.0.2/24 added on link 3")
        #expect(
            NetworkChange.routeAdded(Self.cidr([0, 0, 0, 0], 0), index: 2).description
                == "route 0.0.0.0/0 added on link 2")
        #expect(
            NetworkChange.routeAdded(Self.cidr(Self.v6, 32), index: nil).description
                == "route 2001:db8:0:0:0:0:0:1/32 added")
        #expect(NetworkChange.eventsLost.description == "netlink notifications lost")
    }
}
