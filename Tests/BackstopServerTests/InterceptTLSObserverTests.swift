import Testing

@testable import BackstopServer

/// How a failed interception handshake is described in the log: BoringSSL's reason names, never its build paths.
@Suite("Intercept TLS observer")
struct InterceptTLSObserverTests {
    private struct ErrorText: Error, CustomStringConvertible {
        var text: String
        var description: String { text }
    }

    @Test func describesBoringSSLErrorsByReasonName_otherErrorsAsThemselves() {
        let text =
            "handshakeFailed(NIOSSL.BoringSSLError.sslError([Error: 268435568 error:10000070:SSL routines:"
            + "OPENSSL_internal:BAD_PACKET_LENGTH at /work/main/.build/checkouts/swift-nio-ssl/Sources/CNIOBoringSSL/ssl/"
            + "ssl_aead_ctx.cc:242, Error: 268435595 error:1000008b:SSL routines:OPENSSL_internal:"
            + "DECRYPTION_FAILED_OR_BAD_RECORD_MAC at /work/main/.build/x.cc:1]))"
        #expect(
            InterceptTLSObserver.describe(ErrorText(text: text))
                == "BAD_PACKET_LENGTH,DECRYPTION_FAILED_OR_BAD_RECORD_MAC")
        #expect(InterceptTLSObserver.describe(ErrorText(text: "uncleanShutdown")) == "uncleanShutdown")
        let long = String(repeating: "x", count: 400)
        #expect(InterceptTLSObserver.describe(ErrorText(text: long)) == String(repeating: "x", count: 300) + "…")
    }
}
