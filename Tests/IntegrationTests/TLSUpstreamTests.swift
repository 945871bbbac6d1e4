import BackstopTestSupport
import Foundation
import Testing

/// A real TLS upstream with a CA generated in the test.
@Suite("TLS upstreams")
struct TLSUpstreamTests {
    @Test("HTTPS upstream verified against tls.ca_file; unknown CA → 502; insecure_skip_verify accepts it")
    func tlsOrigin() async throws {
        let directory = try TestFiles.makeTemporaryDirectory()
        defer { TestFiles.remove(directory) }
        let certificates = try TestCertificates.generate(in: directory)
        let origin = try await TestOrigin.start(tls: certificates.serverIdentity) { request in
            .text(200, "secure \(request.uri)")
        }
        let proxy = try await ProxyHarness.start("""
            upstreams:
              - name: trusted
                match: {hosts: [trusted.test]}
                url: https://localhost:\(origin.port)/base
                tls: {ca_file: \(certificates.caCertPath)}
              - name: untrusted
                match: {hosts: [untrusted.test]}
                url: https://localhost:\(origin.port)
                retry: {attempts: 1}
              - name: insecure
                match: {hosts: [insecure.test]}
                url: https://localhost:\(origin.port)
                tls: {insecure_skip_verify: true}
            """)
        let trusted = try await proxy.get("http://trusted.test/x?y=1", host: "trusted.test")
        #expect(trusted.status == 200)
        #expect(trusted.bodyString == "secure /base/x?y=1")
        let untrusted = try await proxy.get("http://untrusted.test/", host: "untrusted.test")
        #expect(untrusted.status == 502)
        #expect(untrusted.header("X-Backstop-Error") == "upstream-unreachable")
        let insecure = try await proxy.get("http://insecure.test/", host: "insecure.test")
        #expect(insecure.status == 200)
        // Easy handles are reused one request after another: neither the CA file nor the disabled verification of
        // the previous request may carry over to the next.
        let untrustedAgain = try await proxy.get("http://untrusted.test/again", host: "untrusted.test")
        #expect(untrustedAgain.status == 502)
        let trustedAgain = try await proxy.get("http://trusted.test/again", host: "trusted.test")
        #expect(trustedAgain.status == 200)
        #expect(origin.requests.map(\.uri) == ["/base/x?y=1", "/", "/base/again"])
        await proxy.stop()
        try await origin.shutdown()
    }
}
