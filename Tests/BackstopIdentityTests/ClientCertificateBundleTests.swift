import BackstopIdentity
import BackstopTestSupport
import Foundation
import Testing
import X509

/// Keychain entries holding a client certificate chain and key (docs/reference/config.md#client-certificates):
/// what is accepted, what is refused and why, and what goes to curl.
@Suite("Client certificate bundles")
struct ClientCertificateBundleTests {
    @Test("EC P-256, P-384 and RSA keys in PKCS#8 and traditional forms are accepted and matched to the leaf")
    func accepted() throws {
        let files = try IdentityTestFiles()
        defer { files.remove() }
        for (name, key, kind) in [
            ("ec256", TestKeyType.p256, "EC P-256"), ("ec384", .p384, "EC P-384"),
            ("rsa", .rsa(bits: 2048), "RSA 2048"),
        ] {
            let identity = try files.certificate(name, key: key)
            let bundle = try ClientCertificateBundle(pem: try identity.bundle())
            #expect(bundle.privateKey.kind == kind)
            #expect(bundle.chain.count == 1)
            #expect(bundle.subject.contains("CN=\(name)"))
            // What curl gets parses back to the same certificate and key.
            let again = try ClientCertificateBundle(pem: bundle.certificateChainPEM + bundle.privateKeyPEM)
            #expect(again.leaf == bundle.leaf)
            #expect(again.privateKey.certificatePublicKey == bundle.privateKey.certificatePublicKey)
            let traditional = files.directory + "/\(name)-traditional.key"
            try TestCertificates.traditionalKey(identity.keyPath, ec: name.hasPrefix("ec"), to: traditional)
            let text = String(decoding: try files.read(traditional), as: UTF8.self)
            #expect(text.contains(name.hasPrefix("ec") ? "EC PRIVATE KEY" : "RSA PRIVATE KEY"))
            let fromTraditional = try ClientCertificateBundle(
                pem: try files.read(identity.certificatePath) + files.read(traditional))
            #expect(fromTraditional.privateKey.kind == kind)
        }
    }

    @Test("a chain through an intermediate is kept leaf first; the wrong order is refused")
    func chain() throws {
        let files = try IdentityTestFiles()
        defer { files.remove() }
        let intermediate = try TestCertificates.makeCertificate(
            in: files.directory, name: "intermediate", issuer: files.issuer, ca: true)
        let leaf = try TestCertificates.makeCertificate(
            in: files.directory, name: "leaf", issuer: (intermediate.certificatePath, intermediate.keyPath))
        let bundle = try ClientCertificateBundle(
            pem: try leaf.bundle(extraCertificates: [intermediate.certificatePath]))
        #expect(bundle.chain.count == 2)
        #expect(
            String(decoding: bundle.certificateChainPEM, as: UTF8.self).components(separatedBy: "BEGIN CERTIFICATE")
                .count == 3)
        let reversed = try files.read(intermediate.certificatePath) + files.read(leaf.certificatePath) + leaf.keyPEM
        #expect(throws: ClientIdentityError.keyMismatch) { try ClientCertificateBundle(pem: reversed) }
        let wrongOrder = try files.read(leaf.certificatePath) + files.read(files.ca.caCertPath) + leaf.keyPEM
        #expect(throws: ClientIdentityError.chainOrder(index: 0)) { try ClientCertificateBundle(pem: wrongOrder) }
    }

    @Test(
        "a PKCS#8 EC key is read as the curve it names: secp256k1 and brainpool keys are refused, not signed with as P-256 or P-384",
        arguments: ["secp256k1", "brainpoolP256r1", "brainpoolP384r1", "prime256v1", "secp384r1", "secp521r1"])
    func pkcs8Curves(curve: String) throws {
        let files = try IdentityTestFiles()
        defer { files.remove() }
        let path = files.directory + "/\(curve).key"
        let made = try TestProcess.runBlocking(
            "/usr/bin/openssl", ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:\(curve)", "-out", path])
        try #require(made.status == 0, "\(made.standardError)")
        let pem = try files.read(path)
        #expect(String(decoding: pem, as: UTF8.self).hasPrefix("-----BEGIN PRIVATE KEY-----"))
        let kinds = ["prime256v1": "EC P-256", "secp384r1": "EC P-384", "secp521r1": "EC P-521"]
        if let kind = kinds[curve] {
            #expect(try ClientPrivateKey(pem: pem).kind == kind)
        } else {
            // Before the fix: secp256k1 and brainpoolP256r1 read as P-256 (their scalars are 32 bytes).
            #expect(throws: ClientIdentityError.unsupportedKey("an EC key on a curve other than P-256, P-384, P-521")) {
                try ClientPrivateKey(pem: pem)
            }
        }
    }

    @Test("refusals say what is wrong and never echo the entry")
    func refused() throws {
        let files = try IdentityTestFiles()
        defer { files.remove() }
        let good = try files.certificate("good")
        let other = try files.certificate("other")
        let cert = try files.read(good.certificatePath)
        let key = good.keyPEM
        try TestCertificates.makeKey(.ed25519, at: files.directory + "/ed.key")
        try TestCertificates.makeKey(.rsa(bits: 1024), at: files.directory + "/small.key")
        let encryptedPath = files.directory + "/encrypted.key"
        _ = try TestProcess.runBlocking(
            "/usr/bin/openssl",
            [
                "pkcs8", "-topk8", "-in", good.keyPath, "-out", encryptedPath, "-v2", "aes-256-cbc", "-passout",
                "pass:x",
            ])
        // Certificates whose keys the X.509 reader refuses: the refusal names the key, not an unreadable certificate.
        let smallRSA = try files.certificate("small", key: .rsa(bits: 1024))
        let koblitzKey = files.directory + "/k1.key"
        let koblitzCertificate = files.directory + "/k1.pem"
        for arguments in [
            ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:secp256k1", "-out", koblitzKey],
            [
                "req", "-x509", "-new", "-key", koblitzKey, "-out", koblitzCertificate, "-days", "30", "-subj",
                "/CN=k1",
            ],
        ] {
            let made = try TestProcess.runBlocking("/usr/bin/openssl", arguments)
            try #require(made.status == 0, "\(made.standardError)")
        }
        let cases: [(String, [UInt8], ClientIdentityError)] = [
            (
                "certificate with an RSA 1024 key", try smallRSA.bundle(),
                .unsupportedCertificateKey(index: 0, "an RSA key shorter than 2048 bits")
            ),
            (
                "certificate with a secp256k1 key",
                try files.read(koblitzCertificate) + (try files.read(koblitzKey)),
                .unsupportedCertificateKey(index: 0, "an EC key on another curve")
            ),
            ("garbage", Array("not a pem".utf8), .notPEM),
            ("not UTF-8", [0xFF, 0xFE, 0x00], .notPEM),
            ("key only", key, .noCertificate),
            ("certificate only", cert, .noKey),
            ("two keys", cert + key + key, .moreThanOneKey),
            ("another certificate's key", cert + other.keyPEM, .keyMismatch),
            (
                "ed25519", cert + (try files.read(files.directory + "/ed.key")),
                .unsupportedKey("not an EC (P-256, P-384, P-521) or RSA (2048 bits or more) private key")
            ),
            (
                "RSA 1024", cert + (try files.read(files.directory + "/small.key")),
                .unsupportedKey("not an EC (P-256, P-384, P-521) or RSA (2048 bits or more) private key")
            ),
            ("encrypted", cert + (try files.read(encryptedPath)), .encryptedKey),
            (
                "public key block",
                cert + Array("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n".utf8) + key,
                .unexpectedBlock("PUBLIC KEY")
            ),
        ]
        for (label, pem, expected) in cases {
            #expect(throws: expected, "\(label)") { try ClientCertificateBundle(pem: pem) }
            #expect(!expected.description.contains("BEGIN"), "\(label)")
        }
    }

    @Test("expiry: a certificate within 14 days is flagged, and the seconds left are the metric's value")
    func expiry() throws {
        let files = try IdentityTestFiles()
        defer { files.remove() }
        let now = Date()
        let soon = try ClientCertificateBundle(pem: try files.certificate("soon", days: 7).bundle())
        let later = try ClientCertificateBundle(pem: try files.certificate("later", days: 30).bundle())
        #expect(soon.expiresSoon(now: now))
        #expect(!later.expiresSoon(now: now))
        #expect(abs(soon.secondsUntilExpiry(now: now) - 7 * 86_400) < 120)
        #expect(later.expiresSoon(now: now + 17 * 86_400))
        #expect(later.secondsUntilExpiry(now: now + 31 * 86_400) < 0)
        #expect("\(later)".contains("CN=later") && !"\(later)".contains("PRIVATE"))
        #expect(!"\(later.privateKey)".contains("PRIVATE"))
        // Expired, or not valid yet: unusable (not presented by run, refused by check --online), saying which.
        #expect(later.unusableReason(now: now) == nil)
        #expect(later.unusableReason(now: now + 31 * 86_400)?.hasPrefix("the certificate expired at ") == true)
        #expect(later.unusableReason(now: now - 2 * 86_400)?.hasPrefix("the certificate is not valid before ") == true)
        #expect(later.unusableReason(now: now + 31 * 86_400)?.contains("CN=later") == true)
    }
}
