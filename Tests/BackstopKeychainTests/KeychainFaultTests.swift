import BackstopTestSupport
import Foundation
import Testing

@testable import BackstopKeychain

/// Failures injected into the real `backstop` binary's system calls (`FaultShim`) at every step of `rekey` and of
/// key creation: whatever fails, exactly one key opens the keychain and that key file exists, and no plaintext
/// key copy is left behind (docs/reference/operations.md#rekey).
@Suite(.enabled(if: BackstopCLI.isAvailable, "needs .build/debug/backstop: run `swift build` first"))
struct KeychainFaultTests {
    /// The keychain and its current key in `main/`, the new key's directory `new/` (so faults can target one of
    /// them by path), a config pointing at `main/`.
    struct Fixture {
        let dir: TemporaryDirectory
        var mainDir: String { dir.file("main") }
        var newDir: String { dir.file("new") }
        var keychainPath: String { mainDir + "/kc.bkc" }
        var keyPath: String { mainDir + "/kc.key" }
        var newKeyPath: String { newDir + "/new.key" }
        var configPath: String { dir.file("backstop.yaml") }

        init() throws {
            dir = try TemporaryDirectory()
            for sub in [mainDir, newDir] {
                try FileManager.default.createDirectory(atPath: sub, withIntermediateDirectories: false)
            }
            try "version: 1\nlisten: [127.0.0.1:18080]\nkeychain:\n  path: \(keychainPath)\n  key_file: \(keyPath)\n"
                .write(toFile: configPath, atomically: true, encoding: .utf8)
        }

        func cli(_ arguments: [String], fault: String? = nil, stdin: String = "") throws -> BackstopCLI.Result {
            var environment: [String: String] = [:]
            if let fault {
                environment["LD_PRELOAD"] = try FaultShim.library.get()
                environment["BACKSTOP_FAULT"] = fault
            }
            return try BackstopCLI.run(
                ["keychain"] + arguments + ["--config", configPath], stdin: Array(stdin.utf8), environment: environment)
        }

        /// Which of the two key files exist and open the keychain.
        func keysThatOpen() -> [String] {
            [keyPath, newKeyPath].filter { path in
                guard let key = try? KeychainKey.load(path: path) else { return false }
                return (try? FileKeychain(path: keychainPath, key: key).load()) != nil
            }
        }

        /// Files whose name marks them as a writer's temporary.
        func leftoverTemporaries() throws -> [String] {
            try [mainDir, newDir].flatMap { directory in
                try FileManager.default.contentsOfDirectory(atPath: directory).filter { $0.contains(".tmp-") }
            }
        }
    }

    static let rekeyFaults: [(fault: String, replaced: Bool)] = [
        ("write:/new/", false),  // writing the new key file
        ("write:/main/.kc.bkc.tmp-", false),  // writing the re-encrypted keychain
        ("fsync:/main/.kc.bkc.tmp-", false),  // syncing it before the rename
        ("kill-after-rename", true),  // a crash right after the rename
        ("fsync-dir-after-rename", true),  // syncing the directory after the rename
    ]

    @Test(
        "rekey with a failure at every step: exactly one key opens the keychain, and that key file exists",
        arguments: rekeyFaults.indices)
    func rekeyFault(index: Int) throws {
        guard case .success = FaultShim.library else {
            Issue.record("fault shim unavailable: \(FaultShim.library)")
            return
        }
        let (fault, replaced) = Self.rekeyFaults[index]
        let f = try Fixture()
        #expect(try f.cli(["init"]).status == 0)
        #expect(try f.cli(["set", "api/token"], stdin: "kept-value").status == 0)

        let result = try f.cli(["rekey", "--new-key-file", f.newKeyPath], fault: fault)
        let opening = f.keysThatOpen()
        #expect(opening.count == 1, "\(fault): keys that open the keychain: \(opening); \(result.stderr)")
        #expect(opening == [replaced ? f.newKeyPath : f.keyPath], "\(fault)")
        if let key = opening.first {
            let entry = try FileKeychain(path: f.keychainPath, key: try KeychainKey.load(path: key)).entry("api/token")
            #expect(entry?.stringValue == "kept-value")
        }
        if fault == "fsync-dir-after-rename" {
            // The keychain was replaced: a warning, not a failure, and the new key stays.
            #expect(result.status == 0, "\(result.stderr)")
            #expect(result.stderr.contains("warning"))
        }
        if fault != "kill-after-rename" { #expect(try f.leftoverTemporaries().isEmpty) }
    }

    @Test("a key file creation killed at any moment leaves no plaintext copy of the key behind")
    func killedKeyCreation() throws {
        guard case .success = FaultShim.library else {
            Issue.record("fault shim unavailable: \(FaultShim.library)")
            return
        }
        let f = try Fixture()
        let killed = try f.cli(["init"], fault: "kill-on-fsync:/main/")
        #expect(killed.killedBySignal)
        #expect(try f.leftoverTemporaries().isEmpty)
        #expect(!FileManager.default.fileExists(atPath: f.keyPath))
        // The next attempt creates the key and keychain normally.
        #expect(try f.cli(["init"]).status == 0)
        #expect(f.keysThatOpen() == [f.keyPath])
    }
}
