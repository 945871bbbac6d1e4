import BackstopCore
import BackstopTestSupport
import Foundation
import Testing

@testable import BackstopKeychain

/// End-to-end tests through the `backstop keychain` CLI in separate processes. They need the built executable
/// (`swift build` before `swift test`) and skip, saying so, when it is missing.
@Suite(.enabled(if: BackstopCLI.isAvailable, "needs .build/debug/backstop with `keychain`: run `swift build` first"))
struct KeychainProcessTests {
    /// A config whose keychain lives in a fresh temporary directory.
    struct Fixture: Sendable {
        let dir: TemporaryDirectory
        var keychainPath: String { dir.file("kc.bkc") }
        var keyPath: String { dir.file("kc.key") }
        var configPath: String { dir.file("backstop.yaml") }

        init() throws {
            dir = try TemporaryDirectory()
            try writeConfig(keyFile: keyPath)
        }

        func writeConfig(keyFile: String, keychain: Bool = true) throws {
            var yaml = "version: 1\nlisten:\n  - 127.0.0.1:18080\n"
            if keychain { yaml += "keychain:\n  path: \(keychainPath)\n  key_file: \(keyFile)\n" }
            try yaml.write(toFile: configPath, atomically: true, encoding: .utf8)
        }

        func cli(_ arguments: [String], stdin: String = "") throws -> BackstopCLI.Result {
            try BackstopCLI.run(["keychain"] + arguments + ["--config", configPath], stdin: Array(stdin.utf8))
        }

        func keychain(keyFile: String? = nil) throws -> FileKeychain {
            FileKeychain(path: keychainPath, key: try KeychainKey.load(path: keyFile ?? keyPath))
        }
    }

    @Test func commandsEndToEnd() throws {
        let f = try Fixture()
        let initial = try f.cli(["init"])
        #expect(initial.status == 0, "\(initial.stderr)")
        #expect(try f.dir.mode("kc.key") == 0o600)
        #expect(try f.cli(["init"]).stdout.contains("left unchanged"))

        #expect(try f.cli(["set", "api/token"], stdin: "s3cret-value\n").status == 0)
        #expect(try f.cli(["set", "api/other"], stdin: "two\nlines\n\n").status == 0)
        let got = try f.cli(["get", "api/token"])
        #expect(got.status == 0 && got.stdout == "s3cret-value\n")
        #expect(try f.keychain().entry("api/other")?.stringValue == "two\nlines\n")

        let list = try f.cli(["list"])
        #expect(list.status == 0)
        let lines = list.stdout.split(separator: "\n")
        #expect(lines.map { $0.split(separator: "\t").first.map(String.init) } == ["api/other", "api/token"])
        #expect(lines.allSatisfy { $0.split(separator: "\t").last?.hasSuffix("Z") == true })
        #expect(!list.stdout.contains("s3cret") && !list.stderr.contains("s3cret"))

        let absent = try f.cli(["get", "nope"])
        #expect(absent.status == 1 && absent.stdout.isEmpty && absent.stderr.contains("no entry nope in keychain"))
        #expect(try f.cli(["delete", "api/other"]).status == 0)
        #expect(try f.cli(["delete", "api/other"]).status == 1)
        #expect(try f.cli(["set", "empty"], stdin: "\n").status == 1)
        #expect(try f.cli(["set", "bad name"], stdin: "x").status == 1)
    }

    @Test func rekeyGeneratesMissingKeyFileAndOldKeyStopsWorking() throws {
        let f = try Fixture()
        #expect(try f.cli(["init"]).status == 0)
        #expect(try f.cli(["set", "a"], stdin: "alpha").status == 0)
        let newKey = f.dir.file("new.key")
        let rekey = try f.cli(["rekey", "--new-key-file", newKey])
        #expect(rekey.status == 0, "\(rekey.stderr)")
        #expect(rekey.stdout.contains("created new key file \(newKey)"))
        #expect(try f.dir.mode("new.key") == 0o600)
        let stale = try f.cli(["get", "a"])
        #expect(stale.status == 1 && stale.stderr.contains("wrong key or file tampered with"))
        try f.writeConfig(keyFile: newKey)
        #expect(try f.cli(["get", "a"]).stdout == "alpha\n")
        #expect(try f.dir.names() == ["backstop.yaml", "kc.bkc", "kc.bkc.lock", "kc.key", "new.key"])
    }

    @Test func userErrorsExitOneAndNameTheProblem() throws {
        let f = try Fixture()
        let missing = try f.cli(["get", "a"])
        #expect(missing.status == 1 && missing.stderr.contains(f.keyPath))
        #expect(try f.cli(["init"]).status == 0)
        try FileManager.default.removeItem(atPath: f.keyPath)
        let orphan = try f.cli(["get", "a"])
        #expect(orphan.status == 1 && orphan.stderr.contains("refusing to start"))
        #expect(try f.cli(["init"]).status == 1)
        try f.writeConfig(keyFile: f.keyPath, keychain: false)
        let noSection = try f.cli(["list"])
        #expect(noSection.status == 1 && noSection.stderr.contains("no keychain section in \(f.configPath)"))
    }

    @Test func eightConcurrentWritersAllLand() async throws {
        let f = try Fixture()
        #expect(try f.cli(["init"]).status == 0)
        let results = try await withThrowingTaskGroup(of: BackstopCLI.Result.self) { group in
            for i in 0..<8 {
                group.addTask { try f.cli(["set", "writer/\(i)"], stdin: "value-\(i)\n") }
            }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        #expect(results.allSatisfy { $0.status == 0 }, "\(results.map(\.stderr))")
        let entries = try f.keychain().load()
        #expect(entries.keys.sorted() == (0..<8).map { "writer/\($0)" })
        for i in 0..<8 { #expect(entries["writer/\(i)"]?.stringValue == "value-\(i)") }
    }

    @Test func killedWritersNeverTearTheFile() throws {
        let f = try Fixture()
        #expect(try f.cli(["init"]).status == 0)
        let keychain = try f.keychain()
        // A few MiB of entries make the encrypt-write-fsync window a large share of each writer's life.
        let seed = UInt64(Date().timeIntervalSince1970 * 1000)
        var rng = SplitMix64(seed: seed)
        for i in 0..<6 {
            try keychain.set("bulk/\(i)", value: (0..<(512 << 10)).map { _ in UInt8.random(in: 0...255, using: &rng) })
        }
        let value = String(repeating: "v", count: 900 << 10)
        let started = Date()
        let timing = try f.cli(["set", "timing"], stdin: value)
        #expect(timing.status == 0, "\(timing.stderr)")
        let runTime = Date().timeIntervalSince(started)

        var killedMidRun = 0
        for round in 0..<20 {
            let process = try BackstopCLI.start(
                ["keychain", "set", "k\(round)", "--config", f.configPath],
                stdin: Array(value.utf8))
            usleep(useconds_t(Double.random(in: 0...(runTime * 1.2), using: &rng) * 1_000_000))
            kill(process.pid, SIGKILL)
            let result = BackstopCLI.finish(process)
            if result.killedBySignal { killedMidRun += 1 }
            // Whatever the moment, the keychain opens and holds complete entries only.
            let entries = try keychain.load()
            #expect(entries.count >= 7, "seed \(seed) round \(round)")
            for (name, entry) in entries where name.hasPrefix("k") {
                #expect(entry.value.count == value.utf8.count, "seed \(seed) round \(round) entry \(name)")
            }
        }
        #expect(killedMidRun > 0, "seed \(seed): no writer was killed while running")
        // The next successful write sweeps up temporaries that killed writers left.
        #expect(try f.cli(["set", "final"], stdin: "done").status == 0)
        #expect(try keychain.entry("final")?.stringValue == "done")
        #expect(try f.dir.names().filter { $0.hasPrefix(".") }.isEmpty, "seed \(seed)")
    }
}
