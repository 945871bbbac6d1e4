import BackstopCore
import CCurl
import Testing

@testable import BackstopTransport

#if canImport(Glibc)
import Glibc
#endif

/// Which curl results mean this host had no usable network, as measured with libcurl 7.88 in a network namespace
/// (the table in `FailureClassification.noUsableNetwork`).
@Suite("No usable network")
struct NoUsableNetworkTests {
    @Test(
        "curl code and errno to cause",
        arguments: [
            (CURLE_COULDNT_CONNECT, Int(ENETUNREACH), NoUsableNetwork?.some(.networkUnreachable)),  // no route at all
            (CURLE_COULDNT_CONNECT, Int(ENETDOWN), .networkUnreachable),
            (CURLE_COULDNT_CONNECT, Int(EHOSTUNREACH), .hostUnreachable),  // `unreachable` route; no neighbour
            (CURLE_COULDNT_RESOLVE_HOST, 0, .nameResolution),  // resolver unreachable, or no such name: alike
            (CURLE_COULDNT_RESOLVE_HOST, Int(ENETUNREACH), .nameResolution),
            (CURLE_COULDNT_CONNECT, Int(ECONNREFUSED), nil),  // the upstream's host answered
            (CURLE_COULDNT_CONNECT, Int(EACCES), nil),  // a `prohibit` route: policy
            (CURLE_COULDNT_CONNECT, Int(EINVAL), nil),  // a `blackhole` route
            (CURLE_COULDNT_CONNECT, Int(ETIMEDOUT), nil),
            (CURLE_COULDNT_CONNECT, 0, nil),
            (CURLE_OPERATION_TIMEDOUT, Int(EHOSTUNREACH), nil),  // a timeout says nothing about this host's network
            (CURLE_SSL_CONNECT_ERROR, Int(ENETUNREACH), nil),  // TLS handshake failure
            (CURLE_RECV_ERROR, Int(ECONNRESET), nil),
            (CURLE_OK, 0, nil),
        ] as [(CURLcode, Int, NoUsableNetwork?)])
    func classify(code: CURLcode, osErrno: Int, expected: NoUsableNetwork?) {
        #expect(FailureClassification.noUsableNetwork(CurlFailureFacts(code: code, osErrno: osErrno)) == expected)
    }

    @Test("out-of-range errno values do not trap; the causes' names are stable")
    func extremes() {
        #expect(
            FailureClassification.noUsableNetwork(CurlFailureFacts(code: CURLE_COULDNT_CONNECT, osErrno: .max)) == nil)
        #expect(
            FailureClassification.noUsableNetwork(CurlFailureFacts(code: CURLE_COULDNT_CONNECT, osErrno: .min)) == nil)
        #expect(
            NoUsableNetwork.allCases.map(\.rawValue) == ["network-unreachable", "host-unreachable", "name-resolution"])
    }
}
