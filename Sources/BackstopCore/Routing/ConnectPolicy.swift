/// Decides how a `CONNECT` is answered (docs/reference/https-clients.md): pure, built once per config snapshot.
///
/// The first rule that matches wins:
/// 1. **Intercept**: the host's best `match.hosts` match (the upstream a plain request for that host would go to)
///    has `intercept: true`. The port plays no part, as in routing.
/// 2. **Tunnel**: host and port match a `tunnels.allow` pattern. A wildcard (`*.a.com`) matches names below
///    `a.com` at any depth, never `a.com` itself and never an IP literal; a literal IP target is allowed only by a
///    pattern naming that very address.
/// 3. Otherwise 403 `tunnel-denied`, or 405 `connect-not-supported` when neither tunnels nor any intercepting
///    upstream are configured.
///
/// A target that is not `host:port` with a port from 1 to 65535 and a DNS name or IP literal gets 400
/// `bad-request`. Where a tunnel's name resolves is judged afterwards, address by address (`allowsAddress`).
public struct ConnectPolicy: Sendable {
    private let router: Router
    private let intercepting: [Bool]
    private let tunnels: TunnelsConfig?

    public init(config: Config, router: Router) {
        self.router = router
        self.intercepting = config.upstreams.map(\.intercept)
        self.tunnels = config.tunnels
    }

    /// Whether any `CONNECT` can be accepted at all.
    public var acceptsConnect: Bool { tunnels != nil || intercepting.contains(true) }

    public func decide(authority: String) -> ConnectDecision {
        guard let target = ConnectTarget.parse(authority) else { return .refuse(.badRequest) }
        if target.address == nil, let index = router.upstreamIndex(forHost: target.host), intercepting[index] {
            return .intercept(upstream: index, target: target)
        }
        guard acceptsConnect else { return .refuse(.connectNotSupported) }
        guard let tunnels, tunnels.allow.contains(where: { Self.matches($0, target) }) else {
            return .refuse(.tunnelDenied)
        }
        return .tunnel(target)
    }

    /// Whether a tunnel may connect to `address` (network-order bytes; IPv4-mapped IPv6 judged as IPv4).
    public func allowsAddress(_ address: [UInt8]) -> Bool {
        guard let tunnels else { return false }
        return !tunnels.denyAddresses.contains { $0.contains(address) }
    }

    /// The idle timeout of tunnels (docs/reference/config.md#tunnels).
    public var tunnelIdleTimeout: Duration { tunnels?.idleTimeout ?? TunnelsConfig().idleTimeout }

    static func matches(_ pattern: TunnelPattern, _ target: ConnectTarget) -> Bool {
        guard pattern.port == target.port else { return false }
        if let address = target.address {
            guard let allowed = IPAddressParser.parse(pattern.host) else { return false }
            return IPAddressBytes.unmapped(allowed) == IPAddressBytes.unmapped(address)
        }
        if pattern.host == target.host { return true }
        guard pattern.host.hasPrefix("*.") else { return false }
        let suffix = pattern.host.dropFirst(1)  // ".a.com"
        return target.host.utf8.count > suffix.utf8.count && target.host.hasSuffix(suffix)
    }
}

/// What a `CONNECT` gets.
public enum ConnectDecision: Sendable, Equatable {
    /// Terminate TLS with a minted leaf and handle the requests inside for `upstreams[upstream]`.
    case intercept(upstream: Int, target: ConnectTarget)
    /// Resolve, check the addresses, connect, then copy bytes both ways.
    case tunnel(ConnectTarget)
    /// Answer with this error and close.
    case refuse(ProxyErrorReason)
}

/// A `CONNECT` request-target (`host:port`, `[v6]:port`), checked.
public struct ConnectTarget: Sendable, Equatable {
    /// Lowercased DNS name, or the IP literal without brackets.
    public var host: String
    public var port: Int
    /// The address bytes when `host` is an IP literal.
    public var address: [UInt8]?

    public init(host: String, port: Int, address: [UInt8]? = nil) {
        self.host = host
        self.port = port
        self.address = address
    }

    /// `host:port` as a client wrote it (brackets for IPv6), for logs.
    public var authority: String { (host.contains(":") ? "[\(host)]" : host) + ":\(port)" }

    /// nil unless `text` is `host:port` with a DNS name (letters, digits, `-`, `_`, dots between non-empty labels,
    /// a last label that is not a number) or an IP literal, and a port from 1 to 65535.
    public static func parse(_ text: String) -> ConnectTarget? {
        guard text.utf8.count <= 300, let (host, port) = RequestTarget.parseAuthority(text), let port, port > 0 else {
            return nil
        }
        if let address = IPAddressParser.parse(host) { return ConnectTarget(host: host, port: port, address: address) }
        guard !host.contains(":"), host.utf8.count <= 253 else { return nil }
        let labels = host.split(separator: ".", omittingEmptySubsequences: false)
        let valid = labels.allSatisfy { label in
            !label.isEmpty && label.utf8.count <= 63
                && label.utf8.allSatisfy { (48...57).contains($0) || (97...122).contains($0) || $0 == 45 || $0 == 95 }
        }
        // A name the resolver would read as a number (`2130706433`, `0x7f.1`) is an IP literal in disguise: no real
        // top-level label is all digits or starts with 0x.
        guard valid, let last = labels.last, !last.utf8.allSatisfy({ (48...57).contains($0) }), !last.hasPrefix("0x")
        else { return nil }
        return ConnectTarget(host: host, port: port)
    }
}
