import Crypto
import Foundation
import SwiftASN1
import X509

/// A certificate authority Backstop signs with: its certificate and its ECDSA P-256 key. The root lives only in
/// the encrypted keychain, as one PEM bundle (certificate, then PKCS#8 key); intermediates and leaves are minted in
/// memory and never written anywhere (docs/reference/https-clients.md#the-local-ca).
public struct CAIdentity: Sendable {
    public let certificate: Certificate
    public let privateKey: P256.Signing.PrivateKey

    public init(certificate: Certificate, privateKey: P256.Signing.PrivateKey) {
        self.certificate = certificate
        self.privateKey = privateKey
    }

    /// Parses a bundle written by `pemBundle`: exactly one certificate and one P-256 key, which must belong together
    /// and make a CA certificate.
    public init(pemBundle: String) throws(CABundleError) {
        let documents: [PEMDocument]
        do {
            documents = try PEMDocument.parseMultiple(pemString: pemBundle)
        } catch {
            throw .malformed("not PEM")
        }
        var certificate: Certificate?
        var key: P256.Signing.PrivateKey?
        for document in documents {
            switch document.discriminator {
            case "CERTIFICATE":
                guard certificate == nil else { throw .malformed("more than one certificate") }
                do { certificate = try Certificate(pemDocument: document) } catch {
                    throw .malformed("unreadable certificate")
                }
            case "PRIVATE KEY", "EC PRIVATE KEY":
                guard key == nil else { throw .malformed("more than one key") }
                do {
                    key = try P256.Signing.PrivateKey(derRepresentation: document.derBytes)
                } catch {
                    throw .malformed("the key is not an ECDSA P-256 key")
                }
            default:
                throw .malformed("unexpected PEM block '\(document.discriminator)'")
            }
        }
        guard let certificate else { throw .malformed("no certificate") }
        guard let key else { throw .malformed("no private key") }
        guard certificate.publicKey == Certificate.PublicKey(key.publicKey) else {
            throw .malformed("the key does not belong to the certificate")
        }
        guard case .isCertificateAuthority? = try? certificate.extensions.basicConstraints else {
            throw .malformed("the certificate is not a CA certificate")
        }
        self.init(certificate: certificate, privateKey: key)
    }

    /// The certificate as PEM: what clients trust.
    public var certificatePEM: String {
        // Serializing a certificate this type parsed or built cannot fail.
        (try? certificate.serializeAsPEM().pemString) ?? ""
    }

    /// Certificate and key as one PEM string, for the keychain entry.
    public var pemBundle: String { certificatePEM + "\n" + privateKey.pemRepresentation + "\n" }

    /// The certificate in DER.
    public var certificateDER: [UInt8] { Self.der(certificate) }

    public static func der(_ certificate: Certificate) -> [UInt8] {
        var serializer = DER.Serializer()
        // Serializing an in-memory certificate cannot fail.
        try? serializer.serialize(certificate)
        return serializer.serializedBytes
    }

    /// The SHA-256 fingerprint of the certificate, as colon-separated hex (what `openssl x509 -fingerprint` prints).
    public var fingerprint: String {
        SHA256.hash(data: certificateDER).map { String(format: "%02X", $0) }.joined(separator: ":")
    }
}

/// A keychain entry that does not hold a usable CA.
public enum CABundleError: Error, Equatable, CustomStringConvertible {
    case malformed(String)

    public var description: String {
        switch self {
        case .malformed(let why): "not a Backstop CA bundle: \(why)"
        }
    }
}
