import Foundation

/// An origin inside the namespace and a route to it that the test takes away and gives back: the host "loses its
/// network" to that origin and gets it back, as the kernel announces it (docs/reference/behaviour.md#the-network-coming-back).
extension NetworkNamespace {
    /// Serves `script` on a TCP socket opened, bound (`clientAddress`, an ephemeral port) and listening inside the
    /// namespace; reached from this host through the veth pair.
    public func startOrigin(script: @escaping TestOrigin.Script) async throws -> TestOrigin {
        let address = clientAddress
        let descriptor = try runInside { try Self.listeningSocket(address) }
        do {
            return try await TestOrigin.start(listeningSocket: descriptor, host: address, script: script)
        } catch {
            close(descriptor)
            throw error
        }
    }

    /// Makes `clientAddress` unreachable from this host: the host's route to it becomes an `unreachable` one, so a
    /// connection fails at once with `EHOSTUNREACH` (the host's default route cannot carry it elsewhere). Adding an
    /// `unreachable` route is not a network change.
    public func takeRouteAway() throws {
        try ip(["route", "replace", "unreachable", "\(clientAddress)/32"])
    }

    /// Gives the route back: a unicast route to `clientAddress` through the veth pair (announced as `RTM_NEWROUTE`).
    public func giveRouteBack() throws {
        try ip(["route", "replace", "\(clientAddress)/32", "dev", hostInterface])
    }

    private func ip(_ arguments: [String]) throws {
        let result = try TestProcess.runBlocking("/usr/sbin/ip", arguments)
        guard result.status == 0 else {
            throw NetworkNamespaceError.setupFailed("ip \(arguments.joined(separator: " ")): \(result.standardError)")
        }
    }

    /// An IPv4 TCP socket bound to `address` (port 0) and listening, in the calling thread's network namespace.
    private static func listeningSocket(_ address: String) throws -> CInt {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw NetworkNamespaceError.setupFailed("socket: errno \(errno)") }
        var socketAddress = sockaddr_in()
        socketAddress.sin_family = sa_family_t(AF_INET)
        guard inet_pton(AF_INET, address, &socketAddress.sin_addr) == 1 else {
            close(fd)
            throw NetworkNamespaceError.setupFailed("not an IPv4 address: \(address)")
        }
        let bound = withUnsafePointer(to: &socketAddress) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard bound == 0, listen(fd, 128) == 0 else {
            let code = errno
            close(fd)
            throw NetworkNamespaceError.setupFailed("bind/listen \(address): errno \(code)")
        }
        return fd
    }
}
