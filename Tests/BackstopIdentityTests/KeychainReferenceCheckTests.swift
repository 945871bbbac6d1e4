import BackstopCore
import BackstopIdentity
import Crypto
import Foundation
import Testing

/// `check --online` for identity entries (docs/reference/cli.md#check---online): each problem at the config key
/// that names the entry.
@Suite("Keychain reference check")
struct KeychainReferenceCheckTests {
    static func reference(_ entry: String, _ content: KeychainReference.Content, line: Int) -> KeychainReference {
        KeychainReference(
            entry: entry, content: content, key: "upstream 'p': k\(line)",
            location: SourceLocation(file: "c.yaml", line: line, column: 7))
    }

    @Test(
        "missing entries, unusable certificates and keys, non-credentials and empty secrets are reported; good ones pass"
    )
    func problems() throws {
        let files = try IdentityTestFiles()
        defer { files.remove() }
        let good = try files.certificate("good")
        let expired = try files.certificate("old", days: 1)
        let entries: [String: [UInt8]] = [
            "cert/good": try good.bundle(),
            "cert/mismatch": try files.read(good.certificatePath) + (try files.certificate("x").keyPEM),
            "cert/old": try expired.bundle(), "key/p256": Array(P256.Signing.PrivateKey().pemRepresentation.utf8),
            "key/p384": Array(P384.Signing.PrivateKey().pemRepresentation.utf8), "proxy/good": Array("u:p".utf8),
            "proxy/bad": Array("nocolon".utf8), "secret/empty": [], "secret/good": Array("s".utf8),
        ]
        let references = [
            Self.reference("cert/good", .clientCertificate, line: 1),
            Self.reference("cert/mismatch", .clientCertificate, line: 2),
            Self.reference("cert/gone", .clientCertificate, line: 3),
            Self.reference("key/p256", .assertionSigningKey, line: 4),
            Self.reference("key/p384", .assertionSigningKey, line: 5),
            Self.reference("proxy/good", .proxyCredentials, line: 6),
            Self.reference("proxy/bad", .proxyCredentials, line: 7),
            Self.reference("secret/empty", .secret, line: 8),
            Self.reference("secret/good", .secret, line: 9),
            Self.reference("cert/old", .clientCertificate, line: 10),
        ]
        let found = KeychainReferenceCheck.problems(references, entry: { entries[$0] }, now: Date() + 2 * 86_400)
        #expect(found.map(\.location.line) == [2, 3, 5, 7, 8, 10])
        #expect(
            found.map(\.description) == [
                "c.yaml:2:7: upstream 'p': k2: keychain entry 'cert/mismatch' is not a client certificate chain and key: "
                    + "the private key does not belong to the (first) certificate",
                "c.yaml:3:7: upstream 'p': k3: keychain entry 'cert/gone' is missing; store it with: backstop keychain set cert/gone",
                "c.yaml:5:7: upstream 'p': k5: keychain entry 'key/p384' is unusable: an EC P-384 key cannot sign "
                    + "private_key_jwt assertions (ES256 needs EC P-256, RS256 needs RSA)",
                "c.yaml:7:7: upstream 'p': k7: keychain entry 'proxy/bad' does not hold user:password",
                "c.yaml:8:7: upstream 'p': k8: keychain entry 'secret/empty' is empty",
                found.last?.description ?? "",
            ])
        #expect(found.last?.message.contains("expired") == true)
    }

    @Test("a header value (static auth, AWS keys): present, non-empty, no control character")
    func headerValues() {
        let entries: [String: [UInt8]] = [
            "h/good": Array("Bearer abc\tdef".utf8), "h/crlf": Array("abc\r\nX-Injected: 1".utf8),
            "h/nul": [0x61, 0x00], "h/del": [0x61, 0x7F], "h/empty": [],
        ]
        let references = ["h/good", "h/crlf", "h/nul", "h/del", "h/empty", "h/gone"].enumerated().map {
            Self.reference($0.element, .headerValue, line: $0.offset + 1)
        }
        let found = KeychainReferenceCheck.problems(references, entry: { entries[$0] }, now: Date())
        #expect(found.map(\.location.line) == [2, 3, 4, 5, 6])
        #expect(found.prefix(3).allSatisfy { $0.message.contains("holds a control character") }, "\(found)")
        #expect(found.dropFirst(3).first?.message.hasSuffix("is empty") == true)
        #expect(found.last?.message.contains("is missing") == true)
        #expect(!found.contains { $0.description.contains("X-Injected") }, "never prints the value")
    }
}

/// The client certificates a config names, for the expiry warning and metric.
@Suite("Client certificate inventory")
struct ClientCertificateInventoryTests {
    @Test("each upstream and token endpoint certificate with its expiry, or why it has none")
    func inventory() throws {
        let files = try IdentityTestFiles()
        defer { files.remove() }
        let soon = try files.certificate("soon", days: 7)
        let yaml = """
            version: 1
            listen: [127.0.0.1:8080]
            keychain: {path: k.bkc, key_file: k.key}
            upstreams:
              - name: a
                match: {hosts: [a.test]}
                url: https://a.test
                tls: {client_cert_entry: c/soon}
                auth: {type: oauth2, token_url: https://idp.test/t, keychain_prefix: a, tls: {client_cert_entry: c/gone}}
              - {name: b, match: {hosts: [b.test]}, url: https://b.test}
            """
        let config = try ConfigLoader.parse(yaml: yaml, file: "c.yaml", baseDirectory: "/etc")
        let entries = ["c/soon": try soon.bundle()]
        let items = ClientCertificateInventory.read(config) { entries[$0] }
        #expect(items.map(\.upstream) == ["a", "a"])
        #expect(items.map(\.target) == [.upstream, .tokenEndpoint])
        #expect(items[0].problem == nil && items[0].expiresSoon(now: Date()))
        #expect(!items[0].expiresSoon(now: Date() - 30 * 86_400))
        #expect(items[1].notValidAfter == nil && items[1].problem == "keychain entry 'c/gone' is missing")
        #expect(!items[1].expiresSoon(now: Date()))
        #expect(ClientCertificateInventory.Target.tokenEndpoint.rawValue == "token_endpoint")
    }
}
