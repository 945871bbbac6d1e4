import BackstopTestSupport
import Foundation
import Testing

/// `backstop ca init|export` and the daemon's use of the root, with the real binary: refusals, output, and the
/// root key never leaving the encrypted keychain (docs/reference/https-clients.md#the-local-ca).
@Suite("CA commands")
struct CACommandTests {
    private let binary = DaemonProcess.binaryPath()

    private func config(directory: String, port: Int, originPort: Int, caFile: String) throws -> String {
        let path = directory + "/backstop.yaml"
        try """
        version: 1
        listen: [127.0.0.1:\(port)]
        keychain: {path: state/keychain.bkc, key_file: state/keychain.key}
        intercept: {ca_entry: ca/test-root}
        upstreams:
          - name: api
            match: {hosts: [api.test]}
            url: https://localhost:\(originPort)
            tls: {ca_file: \(caFile)}
            intercept: true
        """.write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    @Test(
        "run refuses to start without the root CA and says how to make one; ca init creates it once, refuses to replace it; ca export prints only the certificate"
    )
    func initExportAndRefusals() async throws {
        let directory = try TestFiles.makeTemporaryDirectory()
        defer { TestFiles.remove(directory) }
        // A regular file (run refuses a ca_file that is not one); what it holds does not matter here.
        let caFile = directory + "/upstream-ca.pem"
        #expect(FileManager.default.createFile(atPath: caFile, contents: Data()))
        let path = try config(
            directory: directory, port: try FreePort.reserveClosedPort(), originPort: 9, caFile: caFile)

        let refused = try await TestProcess.run(binary, ["run", "--config", path])
        #expect(refused.status == 1)
        #expect(
            refused.standardError.contains(
                "keychain entry 'ca/test-root' holds no root CA; create one with 'backstop ca init'"),
            "\(refused.standardError)")

        let first = try await TestProcess.run(binary, ["ca", "init", "--subject", "Test Root", "--config", path])
        #expect(first.status == 0, "\(first.standardError)")
        #expect(first.standardOutput.contains("created root CA 'Test Root' in ca/test-root"))
        let second = try await TestProcess.run(binary, ["ca", "init", "--config", path])
        #expect(second.status == 1)
        #expect(second.standardError.contains("already exists; it is left unchanged"), "\(second.standardError)")

        let exported = try await TestProcess.run(binary, ["ca", "export", "--config", path])
        #expect(exported.status == 0)
        #expect(exported.standardOutput.hasPrefix("-----BEGIN CERTIFICATE-----\n"))
        #expect(exported.standardOutput.hasSuffix("-----END CERTIFICATE-----\n"))
        #expect(!exported.standardOutput.contains("PRIVATE KEY"))
        let rootPath = directory + "/root.pem"
        try exported.standardOutput.write(toFile: rootPath, atomically: true, encoding: .utf8)
        let text = try await TestProcess.run(
            "/usr/bin/openssl", ["x509", "-in", rootPath, "-noout", "-subject", "-text"])
        #expect(text.standardOutput.contains("CN = Test Root") || text.standardOutput.contains("CN=Test Root"))
        #expect(text.standardOutput.contains("CA:TRUE"))
        #expect(text.standardOutput.contains("prime256v1") || text.standardOutput.contains("P-256"))

        let bad = try await TestProcess.run(binary, ["ca", "init", "--subject", "", "--config", path])
        #expect(bad.status == 2)
    }

    @Test(
        "after ca init, a daemon run and an intercepted request, the root key exists nowhere on disk but inside the encrypted keychain"
    )
    func rootKeyNeverOnDisk() async throws {
        let started = Date()
        let directory = try TestFiles.makeTemporaryDirectory()
        defer { TestFiles.remove(directory) }
        let certificates = try TestCertificates.generate(in: directory)
        let origin = try await TestOrigin.start(tls: certificates.serverIdentity) { request in
            .text(200, "hi \(request.uri)")
        }
        let port = try FreePort.reserveClosedPort()
        let path = try config(
            directory: directory, port: port, originPort: origin.port, caFile: certificates.caCertPath)
        #expect(try await TestProcess.run(binary, ["ca", "init", "--config", path]).status == 0)
        // The key as the keychain holds it (read through the CLI, as an operator could).
        let bundle = try await TestProcess.run(binary, ["keychain", "get", "ca/test-root", "--config", path])
            .standardOutput
        let keyBody =
            bundle.components(separatedBy: "-----BEGIN PRIVATE KEY-----").last?
            .components(separatedBy: "-----END PRIVATE KEY-----").first?
            .replacingOccurrences(of: "\n", with: "") ?? ""
        #expect(keyBody.count > 40)
        let keyDER = Data(base64Encoded: keyBody) ?? Data()
        #expect(keyDER.count > 60)
        let rootPath = directory + "/root.pem"
        try await TestProcess.run(binary, ["ca", "export", "--config", path]).standardOutput
            .write(toFile: rootPath, atomically: true, encoding: .utf8)

        let daemon = try DaemonProcess.start(binary: binary, arguments: ["run", "--config", path])
        try await daemon.waitUntilListening(port: port)
        let curl = try await TestProcess.run(
            "/usr/bin/curl",
            [
                "-s", "--max-time", "10", "--proxy", "http://127.0.0.1:\(port)", "--cacert", rootPath,
                "https://api.test/x",
            ])
        #expect(curl.standardOutput == "hi /x", "\(curl.standardError) \(daemon.output)")
        await daemon.stop()
        try await origin.shutdown()

        // Needles: the raw P-256 scalar (bytes 36..<68 of PKCS#8: what follows is the public key), its base64 (which
        // starts at character 48, split where PEM wraps its lines at 64), and the whole DER. The PKCS#8 header before
        // them is the same for every P-256 key.
        let scalarBase64 = Array(keyBody.utf8)
        let needles: [[UInt8]] = [
            Array(scalarBase64[48..<64]), Array(scalarBase64[64..<88]), Array(keyDER), Array(keyDER[36..<68]),
        ]
        // The scan finds the key where it is written in the clear (checked on a copy the test writes and removes).
        let probe = directory + "/probe.pem"
        try bundle.write(toFile: probe, atomically: true, encoding: .utf8)
        let probeBytes = [UInt8](FileManager.default.contents(atPath: probe) ?? Data())
        #expect(needles[0...1].allSatisfy { probeBytes.firstRange(of: $0) != nil })
        unlink(probe)
        var scanned = 0
        var hits: [String] = []
        for root in [directory, NSTemporaryDirectory()] {
            guard let walker = FileManager.default.enumerator(atPath: root) else { continue }
            while let relative = walker.nextObject() as? String, scanned < 50_000 {
                let file = (root as NSString).appendingPathComponent(relative)
                var isDirectory: ObjCBool = false
                // Files written since the test began: whatever the commands and the daemon left behind.
                guard FileManager.default.fileExists(atPath: file, isDirectory: &isDirectory), !isDirectory.boolValue,
                    let attributes = try? FileManager.default.attributesOfItem(atPath: file),
                    (attributes[.modificationDate] as? Date ?? .distantPast) >= started - 1,
                    (attributes[.size] as? Int ?? 0) < 16 << 20, let data = FileManager.default.contents(atPath: file)
                else { continue }
                scanned += 1
                let bytes = [UInt8](data)
                for needle in needles where bytes.firstRange(of: needle) != nil { hits.append(file) }
            }
        }
        #expect(scanned > 3)
        #expect(hits.isEmpty, "root key material found in \(hits)")
        // In the state directory, nothing but the encrypted keychain, its lock and the key file; no PEM anywhere.
        let state = try FileManager.default.contentsOfDirectory(atPath: directory + "/state").sorted()
        #expect(state == ["keychain.bkc", "keychain.bkc.lock", "keychain.key"], "\(state)")
        for name in state {
            let data = FileManager.default.contents(atPath: directory + "/state/" + name) ?? Data()
            #expect([UInt8](data).firstRange(of: Array("-----BEGIN".utf8)) == nil, "\(name) holds PEM")
        }
    }
}
