#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// Loopback ports for connect-failure tests.
public enum FreePort {
    /// A 127.0.0.1 port that refuses connections: bound to learn a free number, then closed without listening.
    /// Another process could claim it in between, but the kernel hands out ephemeral ports round-robin, so that
    /// does not happen within a test's lifetime in practice.
    public static func reserveClosedPort() throws -> Int {
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
        address.sin_port = 0
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let bound = withUnsafePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard bound == 0 else {
            throw FreePortError.systemCall("bind", errno)
        }

        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let named = withUnsafeMutablePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                getsockname(descriptor, $0, &length)
            }
        }
        guard named == 0 else {
            throw FreePortError.systemCall("getsockname", errno)
        }
        return Int(UInt16(bigEndian: address.sin_port))
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
