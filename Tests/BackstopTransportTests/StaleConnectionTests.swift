import Testing

@testable import BackstopTransport

/// The resend rule for a request whose reused upstream connection turned out closed, over every combination of the
/// facts the transport reads from curl.
@Suite("Stale upstream connections")
struct StaleConnectionTests {
    @Test("resent once, only after a failed send or receive on a reused connection that returned nothing")
    func everyCombination() {
        var resends = 0
        for failedSending in [false, true] {
            for failedReceiving in [false, true] {
                for reused in [false, true] {
                    for responseBytes in [0, 1, 512] {
                        for alreadyResent in [false, true] {
                            let resend = StaleConnection.shouldResend(
                                failedSending: failedSending, failedReceiving: failedReceiving,
                                connectionWasReused: reused, responseBytes: responseBytes, alreadyResent: alreadyResent)
                            let expected =
                                (failedSending || failedReceiving) && reused && responseBytes == 0
                                && !alreadyResent
                            #expect(
                                resend == expected,
                                "send \(failedSending) recv \(failedReceiving) reused \(reused) bytes \(responseBytes) resent \(alreadyResent)"
                            )
                            if resend { resends += 1 }
                        }
                    }
                }
            }
        }
        // Three failure kinds (send, receive, both) on a reused connection with nothing back, not yet resent.
        #expect(resends == 3)
        // A new connection that failed is a real failure, and so is one that had started answering.
        #expect(
            !StaleConnection.shouldResend(
                failedSending: true, failedReceiving: false, connectionWasReused: false, responseBytes: 0,
                alreadyResent: false))
        #expect(
            !StaleConnection.shouldResend(
                failedSending: false, failedReceiving: true, connectionWasReused: true, responseBytes: 17,
                alreadyResent: false))
    }
}
