import BackstopTestSupport
import Foundation

/// Keys and certificates made with openssl once per test, in a temporary directory.
struct IdentityTestFiles {
    let directory: String
    let ca: TestCertificateSet

    init() throws {
        directory = try TestFiles.makeTemporaryDirectory(prefix: "backstop-identity")
        ca = try TestCertificates.generate(in: directory)
    }

    var issuer: (certificate: String, key: String) { (ca.caCertPath, ca.caKeyPath) }

    func certificate(_ name: String, key: TestKeyType = .p256, days: Int = 30) throws -> TestClientIdentityFiles {
        try TestCertificates.makeCertificate(in: directory, name: name, issuer: issuer, key: key, days: days)
    }

    func read(_ path: String) throws -> [UInt8] { Array(try Data(contentsOf: URL(fileURLWithPath: path))) }

    func remove() { TestFiles.remove(directory) }
}

/// The repository root (scripts/sigv4 lives there).
enum RepositoryRoot {
    static var path: String {
        var url = URL(fileURLWithPath: #filePath)
        for _ in 0..<3 { url.deleteLastPathComponent() }
        return url.path
    }
}
