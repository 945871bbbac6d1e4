import Foundation

/// Generates a throwaway CA and server certificate with the `openssl` command-line tool.
public enum TestCertificates {
    /// The tool that is run; `/usr/bin/openssl` unless `OPENSSL` names another.
    static var opensslPath: String {
        ProcessInfo.processInfo.environment["OPENSSL"] ?? "/usr/bin/openssl"
    }

    /// Writes `ca.pem`, `ca.key`, `server.pem` and `server.key` into `directory` (which must exist). The server
    /// certificate is valid for DNS `localhost` and IP `127.0.0.1`. P-256 keys keep generation fast.
    /// `extraNames` are added to the server certificate's SAN (`DNS:name` or `IP:address` as written).
    public static func generate(in directory: String, extraNames: [String] = []) throws -> TestCertificateSet {
        let base = URL(fileURLWithPath: directory)
        let set = TestCertificateSet(
            caCertPath: base.appendingPathComponent("ca.pem").path,
            caKeyPath: base.appendingPathComponent("ca.key").path,
            serverCertPath: base.appendingPathComponent("server.pem").path,
            serverKeyPath: base.appendingPathComponent("server.key").path
        )
        let csrPath = base.appendingPathComponent("server.csr").path
        let extensionsPath = base.appendingPathComponent("server.ext").path
        let extensions = """
            subjectAltName = \((["DNS:localhost", "IP:127.0.0.1"] + extraNames).joined(separator: ", "))
            basicConstraints = critical, CA:FALSE
            keyUsage = critical, digitalSignature, keyEncipherment
            extendedKeyUsage = serverAuth

            """
        try Data(extensions.utf8).write(to: URL(fileURLWithPath: extensionsPath))

        try runOpenSSL([
            "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", set.caKeyPath, "-out", set.caCertPath, "-days", "2",
            "-subj", "/CN=Backstop Test CA \(UUID().uuidString)",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        ])
        try runOpenSSL([
            "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", set.serverKeyPath, "-out", csrPath, "-subj", "/CN=localhost",
        ])
        try runOpenSSL([
            "x509", "-req", "-in", csrPath, "-CA", set.caCertPath, "-CAkey", set.caKeyPath,
            "-set_serial", "0x" + randomSerialHex(), "-days", "2", "-sha256",
            "-extfile", extensionsPath, "-out", set.serverCertPath,
        ])
        return set
    }

    static func randomSerialHex() -> String {
        var bytes = (0..<16).map { _ in UInt8.random(in: 0...255) }
        // A positive serial without a leading zero byte, as RFC 5280 asks.
        bytes[0] = UInt8.random(in: 1...0x7f)
        return bytes.map { String(format: "%02x", $0) }.joined()
    }

    static func runOpenSSL(_ arguments: [String]) throws {
        let result = try TestProcess.runBlocking(opensslPath, arguments)
        guard result.status == 0 else {
            throw TestCertificateError.opensslFailed(
                command: arguments.first ?? "", status: result.status, output: result.standardError)
        }
    }
}

/// Failures of `TestCertificates.generate`.
public enum TestCertificateError: Error, CustomStringConvertible {
    case opensslFailed(command: String, status: Int32, output: String)

    public var description: String {
        switch self {
        case .opensslFailed(let command, let status, let output):
            return "openssl \(command) exited with \(status): \(output)"
        }
    }
}
