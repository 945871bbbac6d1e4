import BackstopCore
import BackstopKeychain
import BackstopTestSupport
import Foundation
import Testing

@testable import BackstopServer

/// The upstream's own client certificate (`tls.client_cert_entry`, docs/reference/config.md#client-certificates),
/// over real sockets: an origin that requires a certificate from a CA the test makes.
@Suite("Upstream identity: client certificate to the upstream", .serialized)
struct UpstreamClientCertificateTests {
    static func config(directory: String, origin: TestOrigin, caFile: String, entry: String?) -> String {
        let tls = entry.map { "{ca_file: \(caFile), client_cert_entry: \($0)}" } ?? "{ca_file: \(caFile)}"
        return """
            \(keychainSection(directory: directory))
            upstreams:
              - name: partner
                match: {hosts: [partner.test]}
                url: \(origin.baseURL)
                retry: {attempts: 1}
                tls: \(tls)
            """
    }

    @Test(
        "the keychain's certificate is presented; without it the origin refuses; a rotated entry is used after reload; a missing one sends nothing"
    )
    func presentedFromTheKeychain() async throws {
        let certs = try UpstreamIdentityTests.Certificates()
        defer { TestFiles.remove(certs.directory) }
        // A certificate from a CA the origin does not trust: what a wrong (or stale) entry would hold.
        let otherDirectory = try TestFiles.makeTemporaryDirectory(prefix: "backstop-mtls-other")
        defer { TestFiles.remove(otherDirectory) }
        let otherCA = try TestCertificates.generate(in: otherDirectory)
        let stranger = try TestCertificates.makeCertificate(
            in: otherDirectory, name: "stranger", issuer: (otherCA.caCertPath, otherCA.caKeyPath), days: 30)
        let origin = try await TestOrigin.start(
            tls: certs.set.serverIdentity(requiringClientCertificatesFrom: certs.set.caCertPath)
        ) { _ in .text(200, "ok") }
        let (keychain, directory) = try TokenRefreshTests.makeKeychain([:])
        defer { TestFiles.remove(directory) }
        try keychain.set("partner/client", value: try certs.client.bundle())
        let marker = try UpstreamIdentityTests.makeScanMarker()
        defer { try? FileManager.default.removeItem(atPath: marker) }
        let capture = LogCapture()
        var failure: (any Error)?
        do {
            let yaml = Self.config(
                directory: directory, origin: origin, caFile: certs.set.caCertPath, entry: "partner/client")
            let proxy = try await ProxyHarness.start(yaml, keychain: keychain, capture: capture)
            let with = try await proxy.get("http://partner.test/a", host: "partner.test")
            #expect(with.status == 200)
            #expect(origin.requestCount == 1)

            // Rotated to a certificate the origin does not trust: the reload presents it, and the handshake fails.
            try keychain.set("partner/client", value: try stranger.bundle())
            try await proxy.reload(yaml, keychain: keychain)
            let rotated = try await proxy.get("http://partner.test/b", host: "partner.test")
            #expect(rotated.status == 502)
            #expect(rotated.header("X-Backstop-Error") == "upstream-unreachable")
            // And back: the next reload presents the good one again.
            try keychain.set("partner/client", value: try certs.client.bundle())
            try await proxy.reload(yaml, keychain: keychain)
            let back = try await proxy.get("http://partner.test/c", host: "partner.test")
            #expect(back.status == 200)
            #expect(origin.requests.map(\.uri) == ["/a", "/c"])

            // No entry configured: no certificate, and the origin refuses the handshake.
            try await proxy.reload(
                Self.config(directory: directory, origin: origin, caFile: certs.set.caCertPath, entry: nil))
            let without = try await proxy.get("http://partner.test/d", host: "partner.test")
            #expect(without.status == 502)
            #expect(without.header("X-Backstop-Error") == "upstream-unreachable")

            // An entry that is not in the keychain: nothing is sent, and the log says which entry.
            try await proxy.reload(
                Self.config(directory: directory, origin: origin, caFile: certs.set.caCertPath, entry: "partner/gone"),
                keychain: keychain)
            let connectionsBefore = origin.connectionCount
            let missing = try await proxy.get("http://partner.test/e", host: "partner.test")
            #expect(missing.status == 502)
            #expect(missing.header("X-Backstop-Error") == "token-unavailable")
            #expect(origin.connectionCount == connectionsBefore, "nothing may reach the origin without the certificate")
            #expect(capture.messages("client certificate unusable").contains { $0.contains("partner/gone") })
            await proxy.stop()
            #expect(origin.requests.map(\.uri) == ["/a", "/c"])
            try UpstreamIdentityTests.expectKeyNowhere(
                certs.client.keyPEM, capture: capture, directories: [directory], fixtures: [certs.directory],
                marker: marker)
        } catch {
            failure = error
        }
        try? await origin.shutdown()
        if let failure { throw failure }
    }
}
