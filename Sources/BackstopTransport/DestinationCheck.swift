import BackstopCore
import CCurl
import NIOConcurrencyHelpers

/// Where new upstream connections may go, judged in curl's open-socket callback on the resolved address curl is
/// about to connect to, so no second lookup can differ (docs/reference/behaviour.md#loops-and-forbidden-destinations).
/// The rules are replaced by the server once it is bound (its own listeners) from any thread; they are read on the
/// transport thread.
struct DestinationCheck: Sendable {
    /// What the open-socket callback does.
    struct Verdict: Equatable {
        /// `1.2.3.4:80` or `[::1]:443`; nil for an address family other than IPv4 and IPv6 (not checked).
        var address: String?
        /// Why the connection is refused; nil to open it.
        var refusal: TransportFailure?
    }

    private let rules = NIOLockedValueBox(DestinationGuard())

    func replace(_ rules: DestinationGuard) {
        self.rules.withLockedValue { $0 = rules }
    }

    /// The open-socket callback of a transfer or a raw connection: checks `address`, and opens the socket when it
    /// is allowed (`sockets` learns its number). The fd is CURL_SOCKET_BAD when refused or when socket() failed
    /// (curl then fails the connect with its errno).
    func openSocket(
        _ address: UnsafeMutablePointer<curl_sockaddr>, passthrough: Bool, sockets: SocketWatch
    ) -> (fd: curl_socket_t, verdict: Verdict) {
        let verdict = check(address, passthrough: passthrough)
        if verdict.refusal != nil { return (bs_socket_bad(), verdict) }
        let fd = bs_open_socket(address)
        if fd >= 0 { sockets.opened(fd) }
        return (fd, verdict)
    }

    func check(_ address: UnsafeMutablePointer<curl_sockaddr>, passthrough: Bool) -> Verdict {
        var bytes = [UInt8](repeating: 0, count: 16)
        var port: Int32 = 0
        let count = Int(bs_sockaddr_bytes(address, &bytes, &port))
        guard count > 0 else { return Verdict(address: nil, refusal: nil) }
        return check(ip: Array(bytes[0..<count]), port: Int(port), passthrough: passthrough)
    }

    func check(ip: [UInt8], port: Int, passthrough: Bool) -> Verdict {
        let described = FailureClassification.describe(address: ip, port: port)
        switch rules.withLockedValue({ $0.check(address: ip, port: port, passthrough: passthrough) }) {
        case .allow:
            return Verdict(address: described, refusal: nil)
        case .loop:
            return Verdict(
                address: described, refusal: .loopDetected(detail: "\(described) is one of Backstop's own listeners"))
        case .denied:
            return Verdict(
                address: described,
                refusal: .destinationDenied(detail: "\(described) is a link-local or metadata address"))
        }
    }
}
