import NIOConcurrencyHelpers

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// Loopback ports for connect-failure tests.
public enum FreePort {
    private static let handedOut = NIOLockedValueBox(Set<Int>())

    /// A 127.0.0.1 port that refuses connections, for connect-failure tests and for daemons under test to bind.
    ///
    /// Drawn at random from 20000–31999, below Linux's ephemeral range (32768–60999), and checked free by
    /// binding it once: a port from the ephemeral range could be handed to another test's `bind(:0)` a moment
    /// later (seen: a "closed" upstream port answered by another test's proxy).
    /// Never the same port twice in one test process: several daemons of one test reserve their ports before any
    /// binds, and two random draws may coincide (seen: a fleet test's daemon finding its admin port taken).
    public static func reserveClosedPort() throws -> Int {
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<200 {
            let port = Int.random(in: 20000..<32000, using: &generator)
            guard handedOut.withLockedValue({ $0.insert(port).inserted }) else { continue }
            if try isFree(port) { return port }
        }
        throw FreePortError.systemCall("bind (no free port found)", EADDRINUSE)
    }

    private static func isFree(_ port: Int) throws -> Bool {
        #if canImport(Darwin)
        let descriptor = socket(AF_INET, SOCK_STREAM, 0)
        #else
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        #endif
        guard descriptor >= 0 else {
            throw FreePortError.systemCall("socket", errno)
        }
        defer { close(descriptor) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let bound = withUnsafePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        return bound == 0
    }
}

/// Failures of `FreePort`.
public enum FreePortError: Error, CustomStringConvertible {
    case systemCall(String, Int32)

    public var description: String {
        switch self {
        case .systemCall(let name, let code):
            return "\(name) failed with errno \(code)"
        }
    }
}
