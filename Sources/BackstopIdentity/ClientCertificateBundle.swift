import Foundation
import SwiftASN1
import X509

/// A client certificate chain and its private key from one keychain entry (PEM: the leaf, its intermediates, and
/// the key; docs/reference/config.md#client-certificates). Checked when read: the key must belong to the leaf and
/// each certificate must be issued by the next. Handed to the TLS library from memory only.
public struct ClientCertificateBundle: Sendable {
    /// Leaf first.
    public let chain: [Certificate]
    public let privateKey: ClientPrivateKey

    /// A certificate that expires within this long is logged as a warning at start and on reload.
    public static let expiryWarning: TimeInterval = 14 * 86_400

    public init(pem: [UInt8]) throws(ClientIdentityError) {
        let documents = try PEMBlocks.parse(pem)
        var chain: [Certificate] = []
        var key: ClientPrivateKey?
        for document in documents {
            if document.discriminator == "CERTIFICATE" {
                do {
                    chain.append(try Certificate(derEncoded: document.derBytes))
                } catch {
                    if let why = ClientPrivateKey.unusableCertificateKey(document.derBytes) {
                        throw .unsupportedCertificateKey(index: chain.count, why)
                    }
                    throw .unreadableCertificate(index: chain.count)
                }
            } else if PEMBlocks.isKey(document.discriminator) {
                guard key == nil else { throw .moreThanOneKey }
                key = try ClientPrivateKey(document: document)
            } else {
                throw .unexpectedBlock(document.discriminator)
            }
        }
        guard let leaf = chain.first else { throw .noCertificate }
        guard let key else { throw .noKey }
        guard leaf.publicKey == key.certificatePublicKey else { throw .keyMismatch }
        for index in 0..<(chain.count - 1) where chain[index].issuer != chain[index + 1].subject {
            throw .chainOrder(index: index)
        }
        self.chain = chain
        self.privateKey = key
    }

    public var leaf: Certificate { chain[0] }

    /// When the leaf stops being valid.
    public var notValidAfter: Date { leaf.notValidAfter }

    /// Why the leaf cannot be presented at `now` (expired, or not valid yet), nil when it can: a server refuses it,
    /// so nothing is sent with it (docs/reference/config.md#client-certificates).
    public func unusableReason(now: Date) -> String? {
        if leaf.notValidAfter <= now { return "the certificate expired at \(leaf.notValidAfter) (\(subject))" }
        if leaf.notValidBefore > now {
            return "the certificate is not valid before \(leaf.notValidBefore) (\(subject))"
        }
        return nil
    }

    /// Seconds from `now` until the leaf expires (negative once expired): the value of
    /// `backstop_client_certificate_expiry_seconds`.
    public func secondsUntilExpiry(now: Date) -> Double { notValidAfter.timeIntervalSince(now) }

    /// Whether the leaf expires within `expiryWarning` of `now` (or already has).
    public func expiresSoon(now: Date) -> Bool { secondsUntilExpiry(now: now) < Self.expiryWarning }

    /// The chain as PEM, leaf first (curl's `CURLOPT_SSLCERT_BLOB`).
    public var certificateChainPEM: [UInt8] {
        var out: [UInt8] = []
        for certificate in chain {
            // Serialising a certificate this type parsed cannot fail.
            guard let pem = try? certificate.serializeAsPEM().pemString else { continue }
            out += Array((pem + "\n").utf8)
        }
        return out
    }

    /// The key as PEM (curl's `CURLOPT_SSLKEY_BLOB`).
    public var privateKeyPEM: [UInt8] { privateKey.pemBytes }

    /// The leaf's subject, for logs.
    public var subject: String { leaf.subject.description }
}

extension ClientCertificateBundle: CustomStringConvertible, CustomDebugStringConvertible, CustomReflectable {
    public var description: String {
        "ClientCertificateBundle(\(subject), \(chain.count) certificate(s), \(privateKey.kind) key)"
    }
    public var debugDescription: String { description }
    public var customMirror: Mirror { Mirror(self, children: ["subject": subject, "certificates": chain.count]) }
}
