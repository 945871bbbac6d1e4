import Crypto
import SwiftASN1
import X509
import _CryptoExtras

/// A private key read from a keychain entry (PEM): what a client certificate proves possession of, or what signs
/// `private_key_jwt` assertions (docs/reference/config.md#client-certificates). EC on NIST curves or RSA of at
/// least 2048 bits; anything else is refused when the entry is read.
public enum ClientPrivateKey: Sendable {
    case p256(P256.Signing.PrivateKey)
    case p384(P384.Signing.PrivateKey)
    case p521(P521.Signing.PrivateKey)
    case rsa(_RSA.Signing.PrivateKey)

    /// The key of one PEM block: `PRIVATE KEY` (PKCS#8), `EC PRIVATE KEY` (SEC1) or `RSA PRIVATE KEY` (PKCS#1).
    init(document: PEMDocument) throws(ClientIdentityError) {
        let der = document.derBytes
        switch document.discriminator {
        case "EC PRIVATE KEY":
            guard let key = Self.ec(der) else {
                throw .unsupportedKey("an EC key on a curve other than P-256, P-384, P-521")
            }
            self = key
        case "RSA PRIVATE KEY":
            self = try Self.rsa(der)
        case "PRIVATE KEY":
            // The algorithm and curve the key names decide: swift-crypto's readers go by the scalar's length, so a
            // secp256k1 or brainpoolP256r1 key would be read as P-256 (and sign as another key than the one stored).
            switch Self.pkcs8Algorithm(der) {
            case .ec(let curve)?:
                guard let key = Self.ec(der, curve: curve) else {
                    throw .unsupportedKey("an EC key on a curve other than P-256, P-384, P-521")
                }
                self = key
            case .rsa?:
                self = try Self.rsa(der)
            case .other?, nil:
                throw .unsupportedKey("not an EC (P-256, P-384, P-521) or RSA (2048 bits or more) private key")
            }
        case "ENCRYPTED PRIVATE KEY":
            throw .encryptedKey
        default:
            throw .unexpectedBlock(document.discriminator)
        }
    }

    /// A PEM text holding exactly one private key (the `client_key_entry` of `private_key_jwt`).
    public init(pem: [UInt8]) throws(ClientIdentityError) {
        let documents = try PEMBlocks.parse(pem)
        let keys = documents.filter { PEMBlocks.isKey($0.discriminator) }
        guard documents.count == 1, keys.count == 1, let document = keys.first else {
            if keys.count > 1 { throw .moreThanOneKey }
            if let other = documents.first(where: { !PEMBlocks.isKey($0.discriminator) }) {
                throw .unexpectedKeyEntryBlock(other.discriminator)
            }
            throw .noKey
        }
        try self.init(document: document)
    }

    /// What a PKCS#8 `PrivateKeyInfo` (RFC 5208) says it holds: its algorithm, and for EC the named curve
    /// (RFC 5480); nil when it is not one.
    enum PKCS8Algorithm: Equatable {
        case ec(curve: ASN1ObjectIdentifier?)
        case rsa
        case other
    }

    static let idECPublicKey: ASN1ObjectIdentifier = [1, 2, 840, 10045, 2, 1]
    static let rsaEncryption: ASN1ObjectIdentifier = [1, 2, 840, 113549, 1, 1, 1]
    static let curveP256: ASN1ObjectIdentifier = [1, 2, 840, 10045, 3, 1, 7]
    static let curveP384: ASN1ObjectIdentifier = [1, 3, 132, 0, 34]
    static let curveP521: ASN1ObjectIdentifier = [1, 3, 132, 0, 35]

    static func pkcs8Algorithm(_ der: [UInt8]) -> PKCS8Algorithm? {
        guard let root = try? DER.parse(der) else { return nil }
        return try? DER.sequence(root, identifier: .sequence) { nodes -> PKCS8Algorithm in
            _ = try Int(derEncoded: &nodes)
            guard let algorithmNode = nodes.next() else { throw ASN1Error.invalidASN1Object(reason: "no algorithm") }
            let algorithm = try Self.algorithm(algorithmNode)
            while nodes.next() != nil {}
            return algorithm
        }
    }

    /// An `AlgorithmIdentifier` (RFC 5280 §4.1.1.2) as a key's kind: the algorithm, and for EC its named curve.
    private static func algorithm(_ node: ASN1Node) throws -> PKCS8Algorithm {
        try DER.sequence(node, identifier: .sequence) { inner in
            let oid = try ASN1ObjectIdentifier(derEncoded: &inner)
            let parameter = inner.next().flatMap { try? ASN1ObjectIdentifier(derEncoded: $0) }
            while inner.next() != nil {}
            switch oid {
            case idECPublicKey: return PKCS8Algorithm.ec(curve: parameter)
            case rsaEncryption: return .rsa
            default: return .other
            }
        }
    }

    /// What the public key of a certificate (DER) is, read from its `SubjectPublicKeyInfo` (RFC 5280 §4.1): for
    /// a certificate the X.509 reader refuses, to say why when the reason is its key. Nil when not even that reads.
    static func certificateKeyAlgorithm(_ der: [UInt8]) -> PKCS8Algorithm? {
        guard let root = try? DER.parse(der) else { return nil }
        return try? DER.sequence(root, identifier: .sequence) { certificate -> PKCS8Algorithm in
            guard let tbs = certificate.next() else { throw ASN1Error.invalidASN1Object(reason: "no TBSCertificate") }
            while certificate.next() != nil {}
            return try DER.sequence(tbs, identifier: .sequence) { fields -> PKCS8Algorithm in
                var all: [ASN1Node] = []
                while let node = fields.next() { all.append(node) }
                // version [0] is optional; then serial, signature, issuer, validity, subject, subjectPublicKeyInfo.
                let versioned = all.first?.identifier == ASN1Identifier(tagWithNumber: 0, tagClass: .contextSpecific)
                let index = versioned ? 6 : 5
                guard all.indices.contains(index) else { throw ASN1Error.invalidASN1Object(reason: "no key") }
                return try DER.sequence(all[index], identifier: .sequence) { info -> PKCS8Algorithm in
                    guard let algorithmNode = info.next() else {
                        throw ASN1Error.invalidASN1Object(reason: "no algorithm")
                    }
                    while info.next() != nil {}
                    return try Self.algorithm(algorithmNode)
                }
            }
        }
    }

    /// Why the X.509 reader refused a certificate, when its key is the reason: an RSA key it refuses is one
    /// shorter than 2048 bits (swift-crypto's floor), an EC key on another curve, or another kind of key.
    static func unusableCertificateKey(_ der: [UInt8]) -> String? {
        switch certificateKeyAlgorithm(der) {
        case .rsa?: "an RSA key shorter than 2048 bits"
        case .ec(let curve)? where ![curveP256, curveP384, curveP521].contains(curve): "an EC key on another curve"
        case .other?: "a key of another kind (not EC or RSA)"
        case .ec?, nil: nil
        }
    }

    /// A PKCS#8 EC key read as the curve it names, and only that one.
    private static func ec(_ der: [UInt8], curve: ASN1ObjectIdentifier?) -> ClientPrivateKey? {
        switch curve {
        case curveP256?: (try? P256.Signing.PrivateKey(derRepresentation: der)).map { .p256($0) }
        case curveP384?: (try? P384.Signing.PrivateKey(derRepresentation: der)).map { .p384($0) }
        case curveP521?: (try? P521.Signing.PrivateKey(derRepresentation: der)).map { .p521($0) }
        default: nil
        }
    }

    private static func ec(_ der: [UInt8]) -> ClientPrivateKey? {
        if let key = try? P256.Signing.PrivateKey(derRepresentation: der) { return .p256(key) }
        if let key = try? P384.Signing.PrivateKey(derRepresentation: der) { return .p384(key) }
        if let key = try? P521.Signing.PrivateKey(derRepresentation: der) { return .p521(key) }
        return nil
    }

    private static func rsa(_ der: [UInt8]) throws(ClientIdentityError) -> ClientPrivateKey {
        // Below 2048 bits the initialiser refuses the key; smaller RSA keys are not safe to present or sign with.
        guard let key = try? _RSA.Signing.PrivateKey(derRepresentation: der) else {
            throw .unsupportedKey("not an EC (P-256, P-384, P-521) or RSA (2048 bits or more) private key")
        }
        return .rsa(key)
    }

    /// The public half as a certificate carries it, for the certificate/key match.
    public var certificatePublicKey: Certificate.PublicKey {
        switch self {
        case .p256(let key): Certificate.PublicKey(key.publicKey)
        case .p384(let key): Certificate.PublicKey(key.publicKey)
        case .p521(let key): Certificate.PublicKey(key.publicKey)
        case .rsa(let key): Certificate.PublicKey(key.publicKey)
        }
    }

    /// `EC P-256`, `RSA 3072`: for messages (never the key).
    public var kind: String {
        switch self {
        case .p256: "EC P-256"
        case .p384: "EC P-384"
        case .p521: "EC P-521"
        case .rsa(let key): "RSA \(key.keySizeInBits)"
        }
    }

    /// The key as PEM, as the TLS library is given it (from memory, never a file).
    public var pemBytes: [UInt8] {
        let text: String
        switch self {
        case .p256(let key): text = key.pemRepresentation
        case .p384(let key): text = key.pemRepresentation
        case .p521(let key): text = key.pemRepresentation
        case .rsa(let key): text = key.pemRepresentation
        }
        return Array((text + "\n").utf8)
    }
}

extension ClientPrivateKey: CustomStringConvertible, CustomDebugStringConvertible, CustomReflectable {
    // A key must never reach a log through interpolation, `print` or `dump`.
    public var description: String { "ClientPrivateKey(\(kind))" }
    public var debugDescription: String { description }
    public var customMirror: Mirror { Mirror(self, children: ["kind": kind]) }
}

/// PEM text split into blocks, with the errors a keychain entry's reader reports.
enum PEMBlocks {
    static func parse(_ pem: [UInt8]) throws(ClientIdentityError) -> [PEMDocument] {
        guard let text = String(validating: pem, as: UTF8.self) else { throw .notPEM }
        // Encrypted traditional keys carry RFC 1421 headers; say what they are rather than "not PEM".
        if text.contains("Proc-Type: 4,ENCRYPTED") { throw .encryptedKey }
        let documents: [PEMDocument]
        do {
            documents = try PEMDocument.parseMultiple(pemString: text)
        } catch {
            throw .notPEM
        }
        guard !documents.isEmpty else { throw .notPEM }
        return documents
    }

    static func isKey(_ discriminator: String) -> Bool {
        ["PRIVATE KEY", "EC PRIVATE KEY", "RSA PRIVATE KEY", "ENCRYPTED PRIVATE KEY"].contains(discriminator)
    }
}

/// Why a keychain entry does not hold a usable client certificate or key. Never includes the entry's bytes.
public enum ClientIdentityError: Error, Sendable, Equatable, CustomStringConvertible {
    case notPEM
    case unexpectedBlock(String)
    /// A key entry (`client_key_entry`) holds one private key and nothing else.
    case unexpectedKeyEntryBlock(String)
    case encryptedKey
    case noCertificate
    case noKey
    case moreThanOneKey
    case unreadableCertificate(index: Int)
    /// The certificate carries a public key of a kind Backstop cannot present (`what`).
    case unsupportedCertificateKey(index: Int, String)
    case unsupportedKey(String)
    case keyMismatch
    case chainOrder(index: Int)
    /// The key cannot sign with the algorithm `private_key_jwt` would use.
    case keyUnusableForAssertion(String)
    case signingFailed

    public var description: String {
        switch self {
        case .notPEM: "not PEM text"
        case .unexpectedBlock(let name): "unexpected PEM block '\(name)' (only CERTIFICATE and one private key)"
        case .encryptedKey: "the private key is encrypted; store it unencrypted (the keychain encrypts it)"
        case .noCertificate: "no CERTIFICATE block (the entry holds the certificate chain, then its private key)"
        case .noKey: "no private key block"
        case .moreThanOneKey: "more than one private key"
        case .unexpectedKeyEntryBlock(let name): "unexpected PEM block '\(name)' (the entry holds one private key)"
        case .unreadableCertificate(let index): "certificate \(index + 1) cannot be read"
        case .unsupportedCertificateKey(let index, let what):
            "certificate \(index + 1) holds \(what); only EC P-256, P-384, P-521 or RSA of 2048 bits or more"
        case .unsupportedKey(let what): "unsupported private key: \(what)"
        case .keyMismatch: "the private key does not belong to the (first) certificate"
        case .chainOrder(let index):
            "certificate \(index + 2) did not issue certificate \(index + 1) (put the leaf first, then its issuers)"
        case .keyUnusableForAssertion(let kind):
            "an \(kind) key cannot sign private_key_jwt assertions (ES256 needs EC P-256, RS256 needs RSA)"
        case .signingFailed: "signing failed"
        }
    }
}
