import Crypto
import Foundation
import SwiftASN1
import X509

/// Mints the certificates of interception (docs/reference/https-clients.md#the-local-ca): the root (`ca init`), an
/// intermediate whose name constraints permit only the intercepting upstreams' names, and leaves. Pure apart from
/// key generation and serial numbers (random by design); time comes in as `now`.
public enum CertificateMinter {
    /// Clock skew a fresh certificate tolerates: it is valid from this long before `now`.
    static let backdate: TimeInterval = 300
    public static let rootLifetime: TimeInterval = 10 * 365 * 86_400
    /// The intermediate lives a little longer than a process may run without reload; it is re-minted on reload.
    public static let intermediateLifetime: TimeInterval = 400 * 86_400

    /// A self-signed root: ECDSA P-256, 10 years, CA with no path length limit (its intermediates carry the limit).
    public static func makeRoot(commonName: String, now: Date) throws -> CAIdentity {
        let key = P256.Signing.PrivateKey()
        let publicKey = Certificate.PublicKey(key.publicKey)
        let name = try DistinguishedName { CommonName(commonName) }
        let certificate = try Certificate(
            version: .v3, serialNumber: serialNumber(), publicKey: publicKey,
            notValidBefore: now - backdate, notValidAfter: now + rootLifetime, issuer: name, subject: name,
            signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.isCertificateAuthority(maxPathLength: nil))
                Critical(KeyUsage(keyCertSign: true, cRLSign: true))
                SubjectKeyIdentifier(hash: publicKey)
            },
            issuerPrivateKey: Certificate.PrivateKey(key))
        return CAIdentity(certificate: certificate, privateKey: key)
    }

    /// The intermediate that signs leaves: path length 0 and critical RFC 5280 name constraints permitting the
    /// names `permittedDNSNames(for:)` derives from the intercepting upstreams' host patterns and excluding every
    /// IPv4 and IPv6 address (a dNSName constraint says nothing about iPAddress names: without the exclusion, a
    /// leaked intermediate could still sign for any IP address).
    public static func makeIntermediate(root: CAIdentity, hostPatterns: [String], now: Date) throws -> CAIdentity {
        let key = P256.Signing.PrivateKey()
        let publicKey = Certificate.PublicKey(key.publicKey)
        let rootKeyID = try root.certificate.extensions.subjectKeyIdentifier?.keyIdentifier
        let permitted = permittedDNSNames(for: hostPatterns).map { GeneralName.dnsName($0) }
        let certificate = try Certificate(
            version: .v3, serialNumber: serialNumber(), publicKey: publicKey,
            notValidBefore: now - backdate,
            notValidAfter: min(now + intermediateLifetime, root.certificate.notValidAfter),
            issuer: root.certificate.subject,
            subject: try DistinguishedName { CommonName("Backstop interception intermediate") },
            signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.isCertificateAuthority(maxPathLength: 0))
                Critical(KeyUsage(keyCertSign: true, cRLSign: true))
                Critical(NameConstraints(permittedSubtrees: permitted, excludedSubtrees: everyIPAddress))
                SubjectKeyIdentifier(hash: publicKey)
                AuthorityKeyIdentifier(keyIdentifier: rootKeyID)
            },
            issuerPrivateKey: Certificate.PrivateKey(root.privateKey))
        return CAIdentity(certificate: certificate, privateKey: key)
    }

    /// A server leaf for `host`: SAN dNSName `host`, serverAuth, valid `lifetime` (never past its issuer).
    public static func makeLeaf(
        host: String, issuer: CAIdentity, lifetime: TimeInterval, now: Date
    ) throws
        -> (certificate: Certificate, privateKey: P256.Signing.PrivateKey)
    {
        let key = P256.Signing.PrivateKey()
        let publicKey = Certificate.PublicKey(key.publicKey)
        let issuerKeyID = try issuer.certificate.extensions.subjectKeyIdentifier?.keyIdentifier
        let certificate = try Certificate(
            version: .v3, serialNumber: serialNumber(), publicKey: publicKey,
            notValidBefore: now - backdate, notValidAfter: min(now + lifetime, issuer.certificate.notValidAfter),
            issuer: issuer.certificate.subject,
            subject: try DistinguishedName { CommonName(String(host.prefix(64))) },
            signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.notCertificateAuthority)
                Critical(KeyUsage(digitalSignature: true))
                try ExtendedKeyUsage([.serverAuth])
                SubjectAlternativeNames([.dnsName(host)])
                SubjectKeyIdentifier(hash: publicKey)
                AuthorityKeyIdentifier(keyIdentifier: issuerKeyID)
            },
            issuerPrivateKey: Certificate.PrivateKey(issuer.privateKey))
        return (certificate, key)
    }

    /// The dNSName subtrees for host patterns: `api.example.com` for an exact host, `example.com` for
    /// `*.example.com`; duplicates and names already covered by a shorter one dropped, sorted.
    ///
    /// RFC 5280 dNSName constraints permit a name and every name below it, and have no portable form for
    /// "subdomains only" (a leading dot is an OpenSSL/BoringSSL extension some verifiers reject), so this is the
    /// narrowest set every verifier reads the same way. Backstop itself mints leaves only for names the patterns
    /// match.
    public static func permittedDNSNames(for hostPatterns: [String]) -> [String] {
        let names = Set(hostPatterns.map { $0.hasPrefix("*.") ? String($0.dropFirst(2)) : $0 })
        return names.filter { name in
            !names.contains { other in other != name && name.hasSuffix("." + other) }
        }.sorted()
    }

    /// `0.0.0.0/0` and `::/0` as iPAddress subtrees (address then mask, RFC 5280 §4.2.1.10).
    static let everyIPAddress: [GeneralName] = [
        .ipAddress(ASN1OctetString(contentBytes: ArraySlice(repeating: 0, count: 8))),
        .ipAddress(ASN1OctetString(contentBytes: ArraySlice(repeating: 0, count: 32))),
    ]

    /// 20 random bytes with the top bit clear: positive and at most 20 octets in DER (RFC 5280 §4.1.2.2).
    static func serialNumber() -> Certificate.SerialNumber {
        var bytes = (0..<20).map { _ in UInt8.random(in: 0...255) }
        bytes[0] = (bytes[0] & 0x7F) | 0x01
        return Certificate.SerialNumber(bytes: bytes)
    }
}
