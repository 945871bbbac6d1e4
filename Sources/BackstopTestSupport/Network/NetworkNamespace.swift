import Foundation
import NIOConcurrencyHelpers

/// A network namespace the test creates for itself, joined to this host by a veth pair, so a client with a
/// non-loopback address can be tested without sending anything off the machine. Needs `ip` (iproute2) and
/// CAP_NET_ADMIN; `isAvailable` says whether this machine allows it.
public final class NetworkNamespace: Sendable {
    public let name: String
    /// The host end of the veth pair (reachable from inside the namespace).
    public let hostAddress: String
    /// The address the namespace's traffic comes from.
    public let clientAddress: String
    /// The namespace's end of the veth pair.
    public let interface: String
    /// The host's end of the veth pair.
    public let hostInterface: String

    /// Whether namespaces can be created here (root with CAP_NET_ADMIN and iproute2).
    public static let isAvailable: Bool = {
        let probe = "bsprobe\(getpid())"
        guard (try? TestProcess.runBlocking("/usr/sbin/ip", ["netns", "add", probe]))?.status == 0 else { return false }
        _ = try? TestProcess.runBlocking("/usr/sbin/ip", ["netns", "del", probe])
        return true
    }()

    /// Creates namespace `bs<pid>n<index>` with `<network>.<index>.2/30`, the host side being
    /// `<network>.<index>.1/30`. The default network is private (RFC 1918); `198.18` (RFC 2544 benchmarking) is
    /// neither private nor routed, for tests of address deny lists.
    public init(index: Int, network: String = "10.231") throws {
        let id = "\(getpid() % 100_000)n\(index)"
        name = "bs\(id)"
        hostInterface = "bsh\(id)"
        let peer = "bsp\(id)"
        interface = peer
        hostAddress = "\(network).\(index).1"
        clientAddress = "\(network).\(index).2"
        Self.removeStale(index: index)
        let steps: [[String]] = [
            ["netns", "add", name],
            ["link", "add", hostInterface, "type", "veth", "peer", "name", peer],
            ["link", "set", peer, "netns", name],
            ["addr", "add", "\(hostAddress)/30", "dev", hostInterface],
            ["link", "set", hostInterface, "up"],
            ["netns", "exec", name, "ip", "addr", "add", "\(clientAddress)/30", "dev", peer],
            ["netns", "exec", name, "ip", "link", "set", peer, "up"],
            ["netns", "exec", name, "ip", "link", "set", "lo", "up"],
        ]
        for step in steps {
            let result = try TestProcess.runBlocking("/usr/sbin/ip", step)
            guard result.status == 0 else {
                Self.remove(name: name, hostInterface: hostInterface)
                throw NetworkNamespaceError.setupFailed("ip \(step.joined(separator: " ")): \(result.standardError)")
            }
        }
    }

    /// Removes namespaces of this index left by test processes that died before cleaning up (a crash, `kill -9`):
    /// their host interface would still hold the host address and swallow the new namespace's traffic.
    private static func removeStale(index: Int) {
        guard let list = try? TestProcess.runBlocking("/usr/sbin/ip", ["netns", "list"]) else { return }
        for line in list.standardOutput.split(separator: "\n") {
            let name = String(line.split(separator: " ").first ?? "")
            guard name.hasPrefix("bs"), name.hasSuffix("n\(index)"),
                let pid = Int32(name.dropFirst(2).dropLast("n\(index)".count)), pid != getpid() % 100_000,
                kill(pid, 0) != 0
            else { continue }
            remove(name: name, hostInterface: "bsh" + name.dropFirst(2))
        }
    }

    /// Runs a command inside the namespace.
    public func run(_ executable: String, _ arguments: [String]) async throws -> TestProcessResult {
        try await TestProcess.run("/usr/sbin/ip", ["netns", "exec", name, executable] + arguments)
    }

    /// Runs `body` on a thread of this process that has joined the namespace, and waits for it: a socket it opens
    /// belongs to the namespace for good (a netlink socket sees the namespace's links, addresses and routes). The
    /// thread ends with `body`, so no other thread ever runs in the namespace.
    public func runInside<T: Sendable>(_ body: @escaping @Sendable () throws -> T) throws -> T {
        let result = NIOLockedValueBox<Result<T, any Error>?>(nil)
        let finished = DispatchSemaphore(value: 0)
        let path = "/var/run/netns/\(name)"
        let thread = Thread {
            defer { finished.signal() }
            let outcome = Result {
                try Self.enter(path: path); return try body()
            }
            result.withLockedValue { $0 = outcome }
        }
        thread.start()
        finished.wait()
        return try result.withLockedValue { $0! }.get()
    }

    /// `setns(fd, CLONE_NEWNET)` for the calling thread. Glibc's `setns` is a GNU extension the Swift Glibc module
    /// does not export, so it is looked up by name.
    private static func enter(path: String) throws {
        typealias SetNamespace = @convention(c) (CInt, CInt) -> CInt
        let cloneNewNet: CInt = 0x4000_0000
        guard let symbol = dlsym(nil, "setns") else { throw NetworkNamespaceError.setupFailed("setns not found") }
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw NetworkNamespaceError.setupFailed("open \(path): errno \(errno)") }
        defer { close(fd) }
        guard unsafeBitCast(symbol, to: SetNamespace.self)(fd, cloneNewNet) == 0 else {
            throw NetworkNamespaceError.setupFailed("setns \(path): errno \(errno)")
        }
    }

    /// Deletes the namespace, the veth pair and the host route `takeRouteAway` may have left.
    public func remove() {
        Self.remove(name: name, hostInterface: hostInterface)
        _ = try? TestProcess.runBlocking("/usr/sbin/ip", ["route", "del", "\(clientAddress)/32"])
    }

    private static func remove(name: String, hostInterface: String) {
        _ = try? TestProcess.runBlocking("/usr/sbin/ip", ["link", "del", hostInterface])
        _ = try? TestProcess.runBlocking("/usr/sbin/ip", ["netns", "del", name])
    }
}

public enum NetworkNamespaceError: Error, CustomStringConvertible {
    case setupFailed(String)
    public var description: String {
        switch self {
        case .setupFailed(let detail): "network namespace setup failed: \(detail)"
        }
    }
}
