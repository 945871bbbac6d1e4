import Foundation

/// Key types the identity tests generate with `openssl genpkey`.
public enum TestKeyType: Sendable, Equatable {
    case p256, p384
    case rsa(bits: Int)
    case ed25519

    var genpkeyArguments: [String] {
        switch self {
        case .p256: ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"]
        case .p384: ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-384"]
        case .rsa(let bits): ["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:\(bits)"]
        case .ed25519: ["-algorithm", "ED25519"]
        }
    }
}

/// A client certificate and its key as PEM files, signed by a test CA.
public struct TestClientIdentityFiles: Sendable {
    public let certificatePath: String
    public let keyPath: String

    /// Certificate (and any `extraCertificates`, in order) then key, as a `client_cert_entry` holds them.
    public func bundle(extraCertificates: [String] = []) throws -> [UInt8] {
        var bytes = try Array(Data(contentsOf: URL(fileURLWithPath: certificatePath)))
        for path in extraCertificates { bytes += try Array(Data(contentsOf: URL(fileURLWithPath: path))) }
        return bytes + (try Array(Data(contentsOf: URL(fileURLWithPath: keyPath))))
    }

    public var keyPEM: [UInt8] { (try? Array(Data(contentsOf: URL(fileURLWithPath: keyPath)))) ?? [] }
}

extension TestCertificates {
    /// A new private key (PKCS#8 PEM) at `path`.
    public static func makeKey(_ type: TestKeyType, at path: String) throws {
        try runOpenSSL(["genpkey"] + type.genpkeyArguments + ["-out", path])
    }

    /// The key at `path` rewritten in its traditional form (`EC PRIVATE KEY` / `RSA PRIVATE KEY`) at `output`.
    public static func traditionalKey(_ path: String, ec: Bool, to output: String) throws {
        try runOpenSSL((ec ? ["ec"] : ["rsa", "-traditional"]) + ["-in", path, "-out", output])
    }

    /// A client certificate for `commonName`, signed by `issuer` (certificate and key paths), valid `days` days,
    /// with `extendedKeyUsage = clientAuth`; `ca: true` makes an intermediate CA instead.
    public static func makeCertificate(
        in directory: String, name: String, issuer: (certificate: String, key: String), key: TestKeyType = .p256,
        days: Int = 2, ca: Bool = false
    ) throws -> TestClientIdentityFiles {
        let base = URL(fileURLWithPath: directory)
        let keyPath = base.appendingPathComponent("\(name).key").path
        let certificatePath = base.appendingPathComponent("\(name).pem").path
        let csrPath = base.appendingPathComponent("\(name).csr").path
        let extensionsPath = base.appendingPathComponent("\(name).ext").path
        let extensions =
            ca
            ? "basicConstraints = critical, CA:TRUE\nkeyUsage = critical, keyCertSign, cRLSign\n"
            : "basicConstraints = critical, CA:FALSE\nkeyUsage = critical, digitalSignature\nextendedKeyUsage = clientAuth\n"
        try Data(extensions.utf8).write(to: URL(fileURLWithPath: extensionsPath))
        try makeKey(key, at: keyPath)
        try runOpenSSL(["req", "-new", "-key", keyPath, "-out", csrPath, "-subj", "/CN=\(name)"])
        try runOpenSSL([
            "x509", "-req", "-in", csrPath, "-CA", issuer.certificate, "-CAkey", issuer.key,
            "-set_serial", "0x" + randomSerialHex(), "-days", String(days), "-sha256", "-extfile", extensionsPath,
            "-out", certificatePath,
        ])
        return TestClientIdentityFiles(certificatePath: certificatePath, keyPath: keyPath)
    }
}
