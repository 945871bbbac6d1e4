/// Decides, for the address a connection is about to be opened to (after DNS, so a name that resolves somewhere
/// unexpected is judged by where it really goes), whether Backstop may connect there. Pure: the owner supplies
/// its own bound addresses and the host's interface addresses.
///
/// - A connection to one of Backstop's own listeners or its admin listener is a loop (`508 loop-detected`): a
///   listener bound to `0.0.0.0`/`::` is reached through any loopback or local interface address on its port.
/// - An unspecified address (`0.0.0.0/8`, `::`) means this host to the kernel, whatever port follows: it counts as
///   one of Backstop's own listeners (a loop), since a connection there reaches whatever listens on this host, the
///   admin listener included.
/// - Passthrough (`unmatched: passthrough`) never connects to link-local networks (`169.254.0.0/16`,
///   `fe80::/10`) or the cloud metadata addresses outside them (`fd00:ec2::254`, `100.100.100.200`, Azure's
///   WireServer `168.63.129.16`): `403 destination-denied`. Configured upstreams are the operator's choice and are
///   not restricted.
///
/// See docs/reference/behaviour.md, "Loops and forbidden destinations".
public struct DestinationGuard: Sendable, Equatable {
    /// One bound listener: its address bytes (all zero for a wildcard bind) and port.
    public struct Endpoint: Sendable, Equatable, Hashable {
        public var address: [UInt8]
        public var port: Int
        public init(address: [UInt8], port: Int) {
            self.address = IPAddressBytes.unmapped(address)
            self.port = port
        }
    }

    /// The verdict for one address.
    public enum Verdict: Sendable, Equatable {
        case allow
        case loop
        case denied
    }

    /// Networks passthrough never reaches.
    public static let passthroughDenied: [CIDR] = [
        "169.254.0.0/16", "fe80::/10", "fd00:ec2::254/128", "100.100.100.200/32", "168.63.129.16/32",
    ].map { CIDRParser.parse($0)! }

    public var ownEndpoints: [Endpoint]
    /// Addresses of this host's interfaces, for wildcard listeners.
    public var localAddresses: [[UInt8]]

    public init(ownEndpoints: [Endpoint] = [], localAddresses: [[UInt8]] = []) {
        self.ownEndpoints = ownEndpoints
        self.localAddresses = localAddresses.map(IPAddressBytes.unmapped)
    }

    public func check(address raw: [UInt8], port: Int, passthrough: Bool) -> Verdict {
        let address = IPAddressBytes.unmapped(raw)
        if Self.meansThisHost(address) { return .loop }
        for endpoint in ownEndpoints where endpoint.port == port {
            if endpoint.address == address { return .loop }
            if IPAddressBytes.isUnspecified(endpoint.address)
                && (IPAddressBytes.isLoopback(address) || localAddresses.contains(address))
            {
                return .loop
            }
        }
        if passthrough && Self.passthroughDenied.contains(where: { $0.contains(address) }) { return .denied }
        return .allow
    }

    /// `0.0.0.0/8` ("this network", RFC 1122 §3.2.1.3) and `::`: the kernel connects such a destination to this host.
    public static func meansThisHost(_ address: [UInt8]) -> Bool {
        let address = IPAddressBytes.unmapped(address)
        if address.count == 4 { return address[0] == 0 }
        return IPAddressBytes.isUnspecified(address)
    }
}
