import BackstopCore
import BackstopIdentity
import BackstopKeychain
import BackstopTestSupport
import BackstopTransport
import Crypto
import Foundation
import NIOCore
import NIOPosix
import Testing
import _CryptoExtras

@testable import BackstopServer
@testable import BackstopSoak

/// Upstream identity on the token endpoint side (docs/reference/config.md#upstream-identity), over real sockets:
/// mutual TLS with a client certificate from the keychain, `private_key_jwt` verified by the endpoint, and the
/// key found nowhere but the keychain.
@Suite("Upstream identity: token endpoint", .serialized)
struct UpstreamIdentityTests {
    /// A CA, a localhost server certificate and a client certificate it issued, in a fresh directory.
    struct Certificates {
        let directory: String
        let set: TestCertificateSet
        let client: TestClientIdentityFiles
        init() throws {
            directory = try TestFiles.makeTemporaryDirectory(prefix: "backstop-mtls")
            set = try TestCertificates.generate(in: directory)
            client = try TestCertificates.makeCertificate(
                in: directory, name: "backstop-client", issuer: (set.caCertPath, set.caKeyPath), days: 30)
        }
    }

    /// One oauth2 upstream `api` with `authLines` under `auth`; `prefix` keeps each proxy's tokens apart when several
    /// share a keychain.
    static func config(
        auth: TestAuthServer, origin: TestOrigin, directory: String, authLines: String, prefix: String = "api"
    ) -> String {
        """
        \(keychainSection(directory: directory))
        \(OAuth2TestConfig.upstreams(
            originURL: origin.baseURL, tokenURL: auth.tokenURL, prefix: prefix,
            authLines: ["grant: client_credentials", "client_id: backstop"] + authLines.split(separator: "\n").map(String.init)))
        """
    }

    @Test("tls_client_auth: with the keychain's certificate the token call succeeds; without it the handshake fails")
    func mutualTLSTokenEndpoint() async throws {
        let certs = try Certificates()
        defer { TestFiles.remove(certs.directory) }
        let auth = try await TestAuthServer.start(
            tls: certs.set.serverIdentity(requiringClientCertificatesFrom: certs.set.caCertPath))
        let origin = try await TestOrigin.start(script: auth.protectedScript())
        let (keychain, directory) = try TokenRefreshTests.makeKeychain([:])
        defer { TestFiles.remove(directory) }
        try keychain.set("idp/client", value: try certs.client.bundle())
        var failure: (any Error)?
        do {
            let with = try await ProxyHarness.start(
                Self.config(
                    auth: auth, origin: origin, directory: directory,
                    authLines:
                        "client_auth: tls_client_auth\ntls: {ca_file: \(certs.set.caCertPath), client_cert_entry: idp/client}"
                ),
                keychain: keychain)
            let ok = try await with.get("http://api.test/data", host: "api.test")
            await with.stop()
            #expect(ok.status == 200)
            #expect(auth.tokenCalls == 1)
            #expect(auth.requestBodies == ["grant_type=client_credentials&client_id=backstop"])

            let without = try await ProxyHarness.start(
                Self.config(
                    auth: auth, origin: origin, directory: directory,
                    authLines: "tls: {ca_file: \(certs.set.caCertPath)}", prefix: "without"), keychain: keychain)
            let refused = try await without.get("http://api.test/data", host: "api.test")
            await without.stop()
            #expect(refused.status == 502)
            #expect(refused.header("X-Backstop-Error") == "token-unavailable")
            #expect(auth.tokenCalls == 1, "a call without the certificate must not reach the endpoint")

            let capture = LogCapture()
            let missing = try await ProxyHarness.start(
                Self.config(
                    auth: auth, origin: origin, directory: directory,
                    authLines:
                        "client_auth: tls_client_auth\ntls: {ca_file: \(certs.set.caCertPath), client_cert_entry: idp/gone}",
                    prefix: "missing"), keychain: keychain, capture: capture)
            let gone = try await missing.get("http://api.test/data", host: "api.test")
            await missing.stop()
            #expect(gone.status == 502)
            #expect(capture.messages("token endpoint client credentials unusable").first?.contains("idp/gone") == true)
        } catch {
            failure = error
        }
        try? await origin.shutdown()
        try? await auth.origin.shutdown()
        if let failure { throw failure }
    }

    @Test("a client certificate that expires within 14 days is warned about at start; its expiry is a metric")
    func expiryWarningAndMetric() async throws {
        let certs = try Certificates()
        defer { TestFiles.remove(certs.directory) }
        let soon = try TestCertificates.makeCertificate(
            in: certs.directory, name: "soon", issuer: (certs.set.caCertPath, certs.set.caKeyPath), days: 7)
        let auth = try await TestAuthServer.start()
        let origin = try await TestOrigin.start(script: auth.protectedScript())
        let (keychain, directory) = try TokenRefreshTests.makeKeychain([:])
        defer { TestFiles.remove(directory) }
        try keychain.set("idp/soon", value: try soon.bundle())
        try keychain.set("idp/later", value: try certs.client.bundle(extraCertificates: []))
        let capture = LogCapture()
        // The token URL is loopback http here: only the inventory is under test, so point it at an https name.
        let yaml =
            Self.config(
                auth: auth, origin: origin, directory: directory, authLines: "tls: {client_cert_entry: idp/soon}"
            )
            .replacingOccurrences(of: auth.tokenURL, with: "https://localhost:1/token")
            + "\n  - name: other\n    match: {hosts: [other.test]}\n    url: https://other.test\n"
            + "    auth:\n      type: oauth2\n      token_url: https://localhost:1/t\n      keychain_prefix: o\n"
            + "      tls: {client_cert_entry: idp/later}\n  - name: broken\n    match: {hosts: [b.test]}\n"
            + "    url: https://b.test\n    auth:\n      type: oauth2\n      token_url: https://localhost:1/t\n"
            + "      keychain_prefix: b\n      tls: {client_cert_entry: idp/gone}\n"
        let proxy = try await ProxyHarness.start(yaml, keychain: keychain, capture: capture)
        let metrics = proxy.server.metricsText()
        await proxy.stop()
        try? await origin.shutdown()
        try? await auth.origin.shutdown()
        let warnings = capture.messages("client certificate expires soon")
        #expect(warnings.count == 1)
        #expect(
            warnings.first?.contains("upstream=api") == true && warnings.first?.contains("days_left=6") == true,
            "\(warnings)")
        #expect(capture.messages("client certificate unusable").first?.contains("idp/gone") == true)
        let lines = metrics.split(separator: "\n").filter {
            $0.hasPrefix("backstop_client_certificate_expiry_seconds{")
        }
        #expect(lines.count == 2, "\(lines)")
        let soonValue =
            lines.first { $0.contains("upstream=\"api\",target=\"token_endpoint\"") }
            .flatMap { $0.split(separator: " ").last }.flatMap { Int($0) } ?? 0
        #expect(soonValue > 6 * 86_400 && soonValue <= 7 * 86_400)
    }

    @Test("one transport: a connection or TLS session made with a client certificate never serves a request without it")
    func noIdentityLeaksAcrossRequests() async throws {
        let certs = try Certificates()
        defer { TestFiles.remove(certs.directory) }
        let origin = try await TestOrigin.start(
            tls: certs.set.serverIdentity(requiringClientCertificatesFrom: certs.set.caCertPath)
        ) { _ in .text(200, "ok") }
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let transport = CurlMultiTransport()
        let fetcher = TransportFetcher(transport: transport, eventLoop: group.next())
        let bundle = try ClientCertificateBundle(pem: try certs.client.bundle())
        let identity = TransportClientIdentity(
            certificateChainPEM: bundle.certificateChainPEM, privateKeyPEM: bundle.privateKeyPEM)
        func fetch(_ identity: TransportClientIdentity?) async -> Int? {
            let request = TransportRequest(
                url: origin.baseURL + "/x", method: "GET", headers: [("Host", "localhost:\(origin.port)")],
                tls: TransportTLSOptions(caFile: certs.set.caCertPath, clientIdentity: identity))
            guard case .success(let response) = await fetcher.fetch(request, timeout: .seconds(10)) else { return nil }
            return response.head.status
        }
        var results: [Int?] = []
        for identity in [identity, nil, identity, nil] { results.append(await fetch(identity)) }
        #expect(results == [200, nil, 200, nil])
        #expect("\(TransportTLSOptions(clientIdentity: identity))".contains("key redacted"))
        await transport.shutdown()
        try await group.shutdownGracefully()
        try await origin.shutdown()
    }

    @Test(
        "private_key_jwt (ES256 and RS256): every token call carries a fresh assertion the endpoint verifies; the key stays in the keychain"
    )
    func privateKeyJWT() async throws {
        let keys: [(String, [UInt8])] = [
            ("ES256", Array(P256.Signing.PrivateKey().pemRepresentation.utf8)),
            ("RS256", Array(try _RSA.Signing.PrivateKey(keySize: .bits2048).pemRepresentation.utf8)),
        ]
        for (algorithm, pem) in keys {
            let auth = try await TestAuthServer.start()
            let publicKey = try TestAssertionKey(privateKeyPEM: pem)
            auth.update {
                $0.clientAuthentication = .privateKeyJWT(clientID: "backstop", key: publicKey, keyID: "key-1")
                // The first call fails: its retry must carry a new assertion (a replayed jti is refused).
                $0.failNext = 1
            }
            let origin = try await TestOrigin.start(script: auth.protectedScript())
            let (keychain, directory) = try TokenRefreshTests.makeKeychain([:])
            defer { TestFiles.remove(directory) }
            try keychain.set("idp/signing-key", value: pem)
            let capture = LogCapture()
            let marker = try Self.makeScanMarker()
            defer { try? FileManager.default.removeItem(atPath: marker) }
            var failure: (any Error)?
            do {
                let proxy = try await ProxyHarness.start(
                    Self.config(
                        auth: auth, origin: origin, directory: directory,
                        authLines:
                            "client_auth: private_key_jwt\nclient_key_entry: idp/signing-key\nclient_key_id: key-1"),
                    keychain: keychain, capture: capture)
                let first = try await proxy.get("http://api.test/a", host: "api.test")
                auth.revokeAllAccessTokens()
                let second = try await proxy.get("http://api.test/b", host: "api.test")
                await proxy.stop()
                #expect(first.status == 200, "\(algorithm)")
                #expect(second.status == 200, "\(algorithm)")
                #expect(auth.failedCalls == 1)
                #expect(auth.clientAuthFailures == [], "\(algorithm)")
                let assertions = auth.acceptedAssertions
                #expect(assertions.count == 3, "\(algorithm): the failed call's, its retry's, and the refresh's")
                #expect(Set(assertions.map(\.jti)).count == assertions.count)
                #expect(assertions.allSatisfy { $0.header["alg"] == algorithm && $0.header["kid"] == "key-1" })
                #expect(assertions.allSatisfy { $0.audience == auth.tokenURL && $0.expiresAt - $0.issuedAt <= 300 })
                #expect(auth.requestBodies.allSatisfy { !$0.contains("client_secret") })
                try Self.expectKeyNowhere(pem, capture: capture, directories: [directory], marker: marker)
            } catch {
                failure = error
            }
            try? await origin.shutdown()
            try? await auth.origin.shutdown()
            if let failure { throw failure }
        }
    }

    @Test("client_secret_basic: the endpoint gets Basic credentials, form-urlencoded first, and no secret in the body")
    func clientSecretBasic() async throws {
        let auth = try await TestAuthServer.start()
        auth.update { $0.clientAuthentication = .basic(id: "backstop", secret: "s3cr:t é") }
        let origin = try await TestOrigin.start(script: auth.protectedScript())
        let (keychain, directory) = try TokenRefreshTests.makeKeychain(["idp/secret": "s3cr:t é"])
        defer { TestFiles.remove(directory) }
        let proxy = try await ProxyHarness.start(
            Self.config(
                auth: auth, origin: origin, directory: directory,
                authLines: "client_auth: client_secret_basic\nclient_secret_entry: idp/secret"), keychain: keychain)
        let response = try await proxy.get("http://api.test/a", host: "api.test")
        await proxy.stop()
        try? await origin.shutdown()
        try? await auth.origin.shutdown()
        #expect(response.status == 200)
        #expect(auth.clientAuthFailures == [])
        #expect(auth.requestBodies == ["grant_type=client_credentials"])
    }

    /// A file where temporary files go whose time is the floor of `expectKeyNowhere`'s scan there: file times come
    /// from the kernel's coarse clock, up to a tick behind `Date()`, so the floor is a file time too. Remove it after.
    static func makeScanMarker() throws -> String {
        let marker = "/tmp/backstop-key-scan-\(UUID().uuidString)"
        try #require(FileManager.default.createFile(atPath: marker, contents: Data("marker".utf8)))
        return marker
    }

    /// The key's PEM body lines (and its DER) appear in no log line, no file under the test's directories (its
    /// keychain, encrypted, among them) and no file written since `marker` (`makeScanMarker`, made before the daemon
    /// started) where temporary files go, except under `fixtures`: where the test itself wrote the key.
    static func expectKeyNowhere(
        _ pem: [UInt8], capture: LogCapture, directories: [String], fixtures: [String] = [], marker: String
    ) throws {
        let text = String(decoding: pem, as: UTF8.self)
        let allLines = text.split(separator: "\n").filter { !$0.hasPrefix("-----") }
        // The first line is mostly the algorithm's fixed header, the same in every key of its kind: not evidence.
        let bodyLines = allLines.dropFirst().filter { $0.count >= 40 }.map { Array($0.utf8) }
        #expect(!bodyLines.isEmpty)
        let der = Base64.decode(Array(allLines.joined().utf8)) ?? []
        #expect(der.count > 64)
        let needles = bodyLines + [Array(der.suffix(48))]
        let log = Array(capture.all.joined(separator: "\n").utf8)
        for needle in needles { #expect(!ByteSearch.contains(log, needle), "key material in a log line") }
        var scanned = 0
        var markerRead = false
        let since = try #require(try FileManager.default.attributesOfItem(atPath: marker)[.modificationDate] as? Date)
        // The test's own directories are read whole.
        for root in directories + ["/tmp", "/var/tmp", "/dev/shm"] {
            let floor = directories.contains(root) ? Date.distantPast : since
            guard let walker = FileManager.default.enumerator(atPath: root) else { continue }
            for case let relative as String in walker {
                let path = root + "/" + relative
                if fixtures.contains(where: { path.hasPrefix($0 + "/") }) { continue }
                guard let attributes = try? FileManager.default.attributesOfItem(atPath: path),
                    attributes[.type] as? FileAttributeType == .typeRegular,
                    let modified = attributes[.modificationDate] as? Date, modified >= floor,
                    let size = attributes[.size] as? Int, size < 64 << 20,
                    let contents = FileManager.default.contents(atPath: path)
                else { continue }
                scanned += 1
                if path == marker { markerRead = true }
                let bytes = Array(contents)
                for needle in needles { #expect(!ByteSearch.contains(bytes, needle), "key material in \(path)") }
            }
        }
        #expect(scanned > 1, "the keychain at least was read")
        #expect(markerRead, "files where temporary files go were read from the marker's time on")
    }
}
