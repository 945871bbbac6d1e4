import BackstopCore
import Testing

/// Where connections may go (docs/reference/behaviour.md#loops-and-forbidden-destinations): loops to Backstop's own
/// listeners, and passthrough to link-local and metadata addresses.
@Suite("Destination guard")
struct DestinationGuardTests {
    private static func ip(_ text: String) -> [UInt8] { IPAddressParser.parse(text)! }

    private let guardian = DestinationGuard(
        ownEndpoints: [
            .init(address: ip("127.0.0.1"), port: 8080),
            .init(address: ip("::1"), port: 8081),
            .init(address: ip("0.0.0.0"), port: 9901),
        ],
        localAddresses: [ip("10.1.2.3"), ip("fd00::5")])

    @Test(
        "a connection to one of Backstop's own listeners is a loop, for upstreams and passthrough alike",
        arguments: [false, true])
    func loops(passthrough: Bool) {
        #expect(guardian.check(address: Self.ip("127.0.0.1"), port: 8080, passthrough: passthrough) == .loop)
        #expect(guardian.check(address: Self.ip("::ffff:127.0.0.1"), port: 8080, passthrough: passthrough) == .loop)
        #expect(guardian.check(address: Self.ip("::1"), port: 8081, passthrough: passthrough) == .loop)
        // A wildcard listener is reached through loopback and every local interface address.
        #expect(guardian.check(address: Self.ip("127.0.0.9"), port: 9901, passthrough: passthrough) == .loop)
        #expect(guardian.check(address: Self.ip("10.1.2.3"), port: 9901, passthrough: passthrough) == .loop)
        #expect(guardian.check(address: Self.ip("fd00::5"), port: 9901, passthrough: passthrough) == .loop)
        // Same address, other port; other loopback address on a specific bind: not Backstop.
        #expect(guardian.check(address: Self.ip("127.0.0.1"), port: 8082, passthrough: passthrough) == .allow)
        #expect(guardian.check(address: Self.ip("127.0.0.2"), port: 8080, passthrough: passthrough) == .allow)
        #expect(guardian.check(address: Self.ip("10.9.9.9"), port: 9901, passthrough: passthrough) == .allow)
    }

    @Test("passthrough never reaches link-local or metadata addresses; configured upstreams may")
    func linkLocal() {
        for address in [
            "169.254.169.254", "169.254.0.1", "::ffff:169.254.169.254", "fe80::1", "febf::1",
            "fd00:ec2::254", "100.100.100.200",
        ] {
            #expect(guardian.check(address: Self.ip(address), port: 80, passthrough: true) == .denied, "\(address)")
            #expect(guardian.check(address: Self.ip(address), port: 80, passthrough: false) == .allow, "\(address)")
        }
        for address in ["169.255.0.1", "fec0::1", "100.100.100.201", "93.184.216.34", "127.0.0.1"] {
            #expect(guardian.check(address: Self.ip(address), port: 80, passthrough: true) == .allow, "\(address)")
        }
    }

    @Test("CIDR containment judges IPv4-mapped IPv6 addresses as IPv4")
    func cidr() {
        let net = CIDRParser.parse("10.0.0.0/8")!
        #expect(net.contains(Self.ip("10.255.0.1")))
        #expect(net.contains(Self.ip("::ffff:10.0.0.1")))
        #expect(!net.contains(Self.ip("11.0.0.1")))
        #expect(!net.contains(Self.ip("fd00::1")))
        let odd = CIDRParser.parse("fe80::/10")!
        #expect(odd.contains(Self.ip("febf:ffff::1")))
        #expect(!odd.contains(Self.ip("fec0::1")))
        #expect(CIDRParser.parse("0.0.0.0/0")!.contains(Self.ip("1.2.3.4")))
    }
}
