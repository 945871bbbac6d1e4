import BackstopCore
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Which curl results mean this host had no usable network, as measured with libcurl 7.88 in a network namespace
/// (the table in `NoUsableNetwork.classify`).
@Suite("NoUsableNetwork")
struct NoUsableNetworkTests {
    @Test(
        "curl code and errno to cause",
        arguments: [
            (7, Int(ENETUNREACH), NoUsableNetwork?.some(.networkUnreachable)),  // no route at all
            (7, Int(ENETDOWN), .networkUnreachable),
            (7, Int(EHOSTUNREACH), .hostUnreachable),  // `unreachable` route; no neighbour answering
            (6, 0, .nameResolution),  // resolver unreachable, or the name does not exist: curl tells neither apart
            (6, Int(ENETUNREACH), .nameResolution),
            (7, Int(ECONNREFUSED), nil),  // the upstream's host answered
            (7, Int(EACCES), nil),  // a `prohibit` route: policy
            (7, Int(EINVAL), nil),  // a `blackhole` route
            (7, Int(ETIMEDOUT), nil),
            (7, 0, nil),
            (28, Int(EHOSTUNREACH), nil),  // a timeout says nothing about this host's network
            (35, Int(ENETUNREACH), nil),  // TLS handshake failure
            (56, Int(ECONNRESET), nil),
            (0, 0, nil),
        ])
    func classify(curlCode: Int, osErrno: Int, expected: NoUsableNetwork?) {
        #expect(NoUsableNetwork.classify(curlCode: curlCode, osErrno: osErrno) == expected)
    }

    @Test("out-of-range errno values do not trap")
    func extremes() {
        #expect(NoUsableNetwork.classify(curlCode: 7, osErrno: .max) == nil)
        #expect(NoUsableNetwork.classify(curlCode: 7, osErrno: .min) == nil)
        #expect(
            NoUsableNetwork.allCases.map(\.rawValue) == ["network-unreachable", "host-unreachable", "name-resolution"])
    }
}
