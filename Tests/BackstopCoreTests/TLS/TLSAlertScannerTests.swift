import Testing

@testable import BackstopCore

/// `TLSAlertScanner`: the plaintext alert of a TLS 1.3 client that rejects the leaf, found in the client's record
/// stream however it is split; anything else yields no alert.
@Suite("TLS alert scanner")
struct TLSAlertScannerTests {
    /// A ClientHello-sized handshake record, a compatibility-mode ChangeCipherSpec, then a plaintext fatal
    /// `unknown_ca` alert: what OpenSSL sends when it rejects the server's certificate in TLS 1.3.
    static let stream: [UInt8] =
        [22, 3, 1, 0, 6] + [1, 0, 0, 2, 3, 3]
        + [20, 3, 3, 0, 1, 1]
        + [21, 3, 3, 0, 2, 2, 48]

    @Test("the alert is found whatever the read sizes", arguments: [1, 2, 3, 5, 7, 100])
    func split(size: Int) {
        var scanner = TLSAlertScanner()
        var start = 0
        while start < Self.stream.count {
            scanner.scan(Self.stream[start..<min(start + size, Self.stream.count)])
            start += size
        }
        #expect(scanner.alert == 48)
        #expect(scanner.alert.map(TLSAlertScanner.name(ofAlert:)) == "TLSV1_ALERT_UNKNOWN_CA")
    }

    @Test("an encrypted alert (longer than 2 bytes) is BoringSSL's to read; no alert, no confusion after it")
    func encrypted() {
        var scanner = TLSAlertScanner()
        let encryptedAlert: [UInt8] = [21, 3, 3, 0, 19] + [UInt8](repeating: 0xAA, count: 19)
        scanner.scan([22, 3, 1, 0, 1, 1] + encryptedAlert + [23, 3, 3, 0, 1, 9])
        #expect(scanner.alert == nil)
    }

    @Test("bytes that are not TLS records (a plain HTTP request) end the scan without an alert")
    func notTLS() {
        var scanner = TLSAlertScanner()
        scanner.scan(Array("GET / HTTP/1.1\r\n\r\n".utf8) + [21, 3, 3, 0, 2, 2, 48])
        #expect(scanner.alert == nil)
    }

    @Test("the first alert counts; names follow BoringSSL's reasons; unknown codes are numbered")
    func names() {
        var scanner = TLSAlertScanner()
        scanner.scan([21, 3, 3, 0, 2, 2, 42, 21, 3, 3, 0, 2, 2, 48])
        #expect(scanner.alert == 42)
        #expect(TLSAlertScanner.name(ofAlert: 42) == "SSLV3_ALERT_BAD_CERTIFICATE")
        #expect(TLSAlertScanner.name(ofAlert: 46) == "SSLV3_ALERT_CERTIFICATE_UNKNOWN")
        #expect(TLSAlertScanner.name(ofAlert: 250) == "TLS_ALERT_250")
    }

    @Test("BoringSSL's error text gives its reason names, never the build paths")
    func reasons() {
        let text =
            "handshakeFailed(NIOSSL.BoringSSLError.sslError([Error: 268435568 error:10000070:SSL routines:"
            + "OPENSSL_internal:BAD_PACKET_LENGTH at /work/main/.build/checkouts/swift-nio-ssl/Sources/CNIOBoringSSL/ssl/"
            + "ssl_aead_ctx.cc:242, Error: 268435595 error:1000008b:SSL routines:OPENSSL_internal:"
            + "DECRYPTION_FAILED_OR_BAD_RECORD_MAC at /work/main/.build/x.cc:1, Error: 1 error:1:SSL routines:"
            + "OPENSSL_internal:BAD_PACKET_LENGTH at /a.cc:2]))"
        #expect(TLSAlertScanner.reasonNames(in: text) == ["BAD_PACKET_LENGTH", "DECRYPTION_FAILED_OR_BAD_RECORD_MAC"])
    }

    @Test("a reason name stops at the first byte outside A-Z 0-9 _, a combining mark included")
    func reasonNameStopsAtCombiningMark() {
        // From the tls-alert fuzz target: "V" + U+0320 is one Character that sorts between "A" and "Z".
        let text = "x:OPENSSL_internal:TLSV\u{0320}49:OPENSSL_internal:\u{00C9}TAT:OPENSSL_internal:OK_1 at"
        #expect(TLSAlertScanner.reasonNames(in: text) == ["TLSV", "OK_1"])
    }
}
