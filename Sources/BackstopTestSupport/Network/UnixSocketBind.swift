import Foundation

/// Binds `fd` (an `AF_UNIX` socket) to `path`: the tests' one way to fill a `sockaddr_un`. Returns `bind`'s result
/// (0, or -1 with `errno` set); a path longer than `sun_path` holds is refused with -1 and `ENAMETOOLONG`.
public func bindUnixSocket(_ fd: Int32, path: String) -> Int32 {
    var address = sockaddr_un()
    address.sun_family = sa_family_t(AF_UNIX)
    let bytes = Array(path.utf8)
    guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else {
        errno = ENAMETOOLONG
        return -1
    }
    withUnsafeMutableBytes(of: &address.sun_path) { raw in
        for (i, byte) in bytes.enumerated() { raw[i] = byte }
    }
    return withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
            bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
        }
    }
}
