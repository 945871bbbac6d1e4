import CCurl
import Testing

@testable import BackstopTransport

/// `FailureClassification`: curl's results in `retry.on` terms, and causes that never carry a stale errno.
@Suite("Failure classification")
struct FailureClassificationTests {
    @Test func aCertificateThatDoesNotVerifyIsNotAConnectFailureAndSaysWhy() {
        // What curl reports after a refused IPv6 attempt and a connected IPv4 one whose certificate did not verify.
        let facts = CurlFailureFacts(
            code: CURLE_PEER_FAILED_VERIFICATION, osErrno: 111, verifyResult: 20, connected: true,
            address: "127.0.0.1:8443")
        let failure = FailureClassification.failure(facts)
        #expect(
            failure
                == .tlsVerificationFailed(
                    detail:
                        "curl=60 (SSL peer certificate or SSH remote key was not OK) verify=20 (unable to get local issuer certificate) address=127.0.0.1:8443"
                ))
        #expect(failure.label == "tls-verification-failed")
        #expect(!failure.detail.contains("errno"))
    }

    @Test func errnoOnlyWhereCurlRecordedItForThisFailure() {
        let refused = CurlFailureFacts(code: CURLE_COULDNT_CONNECT, osErrno: 111, address: "127.0.0.1:9")
        #expect(
            FailureClassification.failure(refused)
                == .connectFailure(
                    detail: "curl=7 (Couldn't connect to server) errno=111 (Connection refused) address=127.0.0.1:9"))
        let handshake = CurlFailureFacts(code: CURLE_SSL_CONNECT_ERROR, osErrno: 111, connected: true)
        #expect(
            FailureClassification.failure(handshake)
                == .connectFailure(
                    detail: "curl=35 (SSL connect error)"))
        let sent = CurlFailureFacts(code: CURLE_SEND_ERROR, osErrno: 32, reusedConnection: true)
        #expect(
            FailureClassification.failure(sent)
                == .reset(
                    detail: "curl=55 (Failed sending data to the peer) errno=32 (Broken pipe)"))
    }

    /// Table-driven: curl's code (and whether a connection was made) to the failure's label.
    @Test(arguments: [
        (CURLE_COULDNT_RESOLVE_HOST, false, "connect-failure"), (CURLE_COULDNT_CONNECT, false, "connect-failure"),
        (CURLE_SSL_CONNECT_ERROR, true, "connect-failure"), (CURLE_SSL_CACERT_BADFILE, false, "connect-failure"),
        (CURLE_PEER_FAILED_VERIFICATION, true, "tls-verification-failed"),
        (CURLE_SSL_ISSUER_ERROR, true, "tls-verification-failed"),
        (CURLE_SSL_PINNEDPUBKEYNOTMATCH, true, "tls-verification-failed"),
        (CURLE_OPERATION_TIMEDOUT, false, "connect-failure"), (CURLE_OPERATION_TIMEDOUT, true, "timeout"),
        (CURLE_ABORTED_BY_CALLBACK, true, "client-body-failed"), (CURLE_WEIRD_SERVER_REPLY, true, "bad-response"),
        (CURLE_RECV_ERROR, true, "reset"), (CURLE_GOT_NOTHING, true, "reset"), (CURLE_PARTIAL_FILE, true, "reset"),
    ])
    func label(_ code: CURLcode, _ connected: Bool, _ label: String) {
        #expect(FailureClassification.failure(CurlFailureFacts(code: code, connected: connected)).label == label)
    }

    @Test func staleLookingFailuresAreSendOrReceiveOnAReusedConnectionWithNothingBack() {
        for code in [CURLE_SEND_ERROR, CURLE_RECV_ERROR, CURLE_GOT_NOTHING] {
            #expect(FailureClassification.lookedStale(CurlFailureFacts(code: code, reusedConnection: true)))
            #expect(!FailureClassification.lookedStale(CurlFailureFacts(code: code, reusedConnection: false)))
            #expect(
                !FailureClassification.lookedStale(
                    CurlFailureFacts(code: code, reusedConnection: true, responseHeaderBytes: 12)))
        }
        #expect(
            !FailureClassification.lookedStale(
                CurlFailureFacts(code: CURLE_PEER_FAILED_VERIFICATION, reusedConnection: true)))
    }

    @Test func addressesAreWrittenAsCurlWouldConnect() {
        #expect(FailureClassification.describe(address: [127, 0, 0, 1], port: 80) == "127.0.0.1:80")
        #expect(
            FailureClassification.describe(address: [UInt8](repeating: 0, count: 15) + [1], port: 443)
                == "[0:0:0:0:0:0:0:1]:443")
    }
}
