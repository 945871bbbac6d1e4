import BackstopCA
import Crypto
import Foundation
import SwiftASN1
import Testing
import X509

/// The local CA: root bundle round trip, the intermediate's name constraints, leaves (docs/reference/https-clients.md).
@Suite("CertificateMinter")
struct CertificateMinterTests {
    static let now = Date(timeIntervalSince1970: 1_800_000_000)

    @Test("a root survives the keychain bundle round trip and is a 10-year P-256 CA")
    func rootRoundTrip() throws {
        let root = try CertificateMinter.makeRoot(commonName: "Backstop test root", now: Self.now)
        let parsed = try CAIdentity(pemBundle: root.pemBundle)
        #expect(parsed.certificate == root.certificate)
        #expect(parsed.privateKey.rawRepresentation == root.privateKey.rawRepresentation)
        #expect(root.pemBundle.contains("-----BEGIN CERTIFICATE-----"))
        #expect(root.pemBundle.contains("-----BEGIN PRIVATE KEY-----"))
        #expect(!root.certificatePEM.contains("PRIVATE KEY"))
        #expect(root.certificate.notValidAfter.timeIntervalSince(Self.now) == CertificateMinter.rootLifetime)
        #expect(try root.certificate.extensions.basicConstraints == .isCertificateAuthority(maxPathLength: nil))
        #expect(root.certificate.subject.description.contains("Backstop test root"))
        #expect(root.fingerprint.split(separator: ":").count == 32)
    }

    @Test(
        "bundles that are not a CA are refused with what is wrong",
        arguments: [
            ("", "no certificate"),
            ("garbage", "no certificate"),
            ("-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n", "not PEM"),
        ])
    func badBundles(text: String, problem: String) {
        #expect(throws: CABundleError.malformed(problem)) { try CAIdentity(pemBundle: text) }
    }

    @Test("a bundle whose key does not match its certificate, or a leaf in place of a CA, is refused")
    func mismatchedBundles() throws {
        let one = try CertificateMinter.makeRoot(commonName: "one", now: Self.now)
        let two = try CertificateMinter.makeRoot(commonName: "two", now: Self.now)
        #expect(throws: CABundleError.malformed("the key does not belong to the certificate")) {
            try CAIdentity(pemBundle: one.certificatePEM + "\n" + two.privateKey.pemRepresentation)
        }
        #expect(throws: CABundleError.malformed("no private key")) { try CAIdentity(pemBundle: one.certificatePEM) }
        let leaf = try CertificateMinter.makeLeaf(host: "a.test", issuer: one, lifetime: 3600, now: Self.now)
        let leafPEM = try leaf.certificate.serializeAsPEM().pemString
        #expect(throws: CABundleError.malformed("the certificate is not a CA certificate")) {
            try CAIdentity(pemBundle: leafPEM + "\n" + leaf.privateKey.pemRepresentation)
        }
        #expect(throws: CABundleError.malformed("more than one certificate")) {
            try CAIdentity(pemBundle: one.certificatePEM + "\n" + two.certificatePEM)
        }
    }

    @Test("permitted names: exact hosts as they are, wildcards as their base, covered names dropped")
    func permittedNames() {
        #expect(CertificateMinter.permittedDNSNames(for: ["api.test"]) == ["api.test"])
        #expect(
            CertificateMinter.permittedDNSNames(for: ["*.example.com", "api.test"]) == ["api.test", "example.com"])
        #expect(
            CertificateMinter.permittedDNSNames(for: ["*.example.com", "a.example.com", "example.com"]) == [
                "example.com"
            ])
        #expect(CertificateMinter.permittedDNSNames(for: ["api.test", "api.test"]) == ["api.test"])
        #expect(CertificateMinter.permittedDNSNames(for: ["xapi.test", "api.test"]) == ["api.test", "xapi.test"])
    }

    @Test("the intermediate's name constraints are critical; leaves inside them verify, leaves outside do not")
    func nameConstraints() async throws {
        let root = try CertificateMinter.makeRoot(commonName: "root", now: Date())
        let intermediate = try CertificateMinter.makeIntermediate(
            root: root, hostPatterns: ["api.test", "*.svc.test"], now: Date())
        let constraints = try #require(try intermediate.certificate.extensions.nameConstraints)
        #expect(Set(constraints.permittedDNSDomains) == ["api.test", "svc.test"])
        #expect(intermediate.certificate.extensions[oid: .X509ExtensionID.nameConstraints]?.critical == true)
        #expect(try intermediate.certificate.extensions.basicConstraints == .isCertificateAuthority(maxPathLength: 0))

        var verifier = Verifier(rootCertificates: CertificateStore([root.certificate])) { RFC5280Policy() }
        for host in ["api.test", "x.svc.test", "a.b.svc.test"] {
            let leaf = try CertificateMinter.makeLeaf(host: host, issuer: intermediate, lifetime: 3600, now: Date())
            let result = await verifier.validate(
                leaf: leaf.certificate, intermediates: CertificateStore([intermediate.certificate]))
            guard case .validCertificate = result else {
                Issue.record("\(host) should verify: \(result)")
                continue
            }
        }
        for host in ["evil.test", "api.test.evil", "svc.test.evil", "xapi.test"] {
            let leaf = try CertificateMinter.makeLeaf(host: host, issuer: intermediate, lifetime: 3600, now: Date())
            let result = await verifier.validate(
                leaf: leaf.certificate, intermediates: CertificateStore([intermediate.certificate]))
            guard case .couldNotValidate(let failures) = result else {
                Issue.record("\(host) must not verify")
                continue
            }
            #expect(failures.contains { $0.policyFailureReason.description.contains("permitted subtree") }, "\(host)")
        }
    }

    @Test("a leaf: SAN of its host, serverAuth, not a CA, its lifetime but never past its issuer, a 20-octet serial")
    func leaf() throws {
        let root = try CertificateMinter.makeRoot(commonName: "root", now: Self.now)
        let intermediate = try CertificateMinter.makeIntermediate(root: root, hostPatterns: ["api.test"], now: Self.now)
        let leaf = try CertificateMinter.makeLeaf(
            host: "api.test", issuer: intermediate, lifetime: 86_400, now: Self.now)
        let certificate = leaf.certificate
        #expect(try certificate.extensions.subjectAlternativeNames == SubjectAlternativeNames([.dnsName("api.test")]))
        #expect(try certificate.extensions.basicConstraints == .notCertificateAuthority)
        #expect(try certificate.extensions.extendedKeyUsage == ExtendedKeyUsage([.serverAuth]))
        #expect(certificate.notValidAfter == Self.now + 86_400)
        #expect(certificate.issuer == intermediate.certificate.subject)
        #expect(certificate.serialNumber.bytes.count == 20)
        #expect(certificate.serialNumber.bytes.first! & 0x80 == 0)
        let long = try CertificateMinter.makeLeaf(host: "api.test", issuer: intermediate, lifetime: 1e10, now: Self.now)
        #expect(long.certificate.notValidAfter == intermediate.certificate.notValidAfter)
    }

    @Test("the intermediate excludes every IP address: a leaf naming one does not verify, even for a permitted name")
    func ipAddressesExcluded() async throws {
        let root = try CertificateMinter.makeRoot(commonName: "root", now: Date())
        let intermediate = try CertificateMinter.makeIntermediate(root: root, hostPatterns: ["api.test"], now: Date())
        let constraints = try #require(try intermediate.certificate.extensions.nameConstraints)
        #expect(constraints.excludedSubtrees.count == 2)
        for address in [[UInt8]([10, 0, 0, 1]), [UInt8](repeating: 0, count: 15) + [1]] {
            let key = P256.Signing.PrivateKey()
            let leaf = try Certificate(
                version: .v3, serialNumber: Certificate.SerialNumber(), publicKey: Certificate.PublicKey(key.publicKey),
                notValidBefore: Date() - 60, notValidAfter: Date() + 3600, issuer: intermediate.certificate.subject,
                subject: try DistinguishedName { CommonName("api.test") }, signatureAlgorithm: .ecdsaWithSHA256,
                extensions: try Certificate.Extensions {
                    Critical(BasicConstraints.notCertificateAuthority)
                    SubjectAlternativeNames([
                        .dnsName("api.test"), .ipAddress(ASN1OctetString(contentBytes: ArraySlice(address))),
                    ])
                },
                issuerPrivateKey: Certificate.PrivateKey(intermediate.privateKey))
            var verifier = Verifier(rootCertificates: CertificateStore([root.certificate])) { RFC5280Policy() }
            let result = await verifier.validate(
                leaf: leaf, intermediates: CertificateStore([intermediate.certificate]))
            guard case .couldNotValidate = result else {
                Issue.record("a leaf naming \(address) must not verify")
                continue
            }
        }
    }
}
