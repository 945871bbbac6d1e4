import Foundation
import Testing

@testable import BackstopKeychain

@Suite struct FileKeychainTests {
    @Test func setLoadRemove() throws {
        let dir = try TemporaryDirectory()
        let keychain = FileKeychain(path: dir.file("kc.bkc"), key: .generate())
        #expect(throws: KeychainError.missing(path: dir.file("kc.bkc"))) { try keychain.load() }
        #expect(try keychain.createIfMissing())
        #expect(try !keychain.createIfMissing())
        #expect(try keychain.load().isEmpty)
        let when = Date(timeIntervalSince1970: 1_700_000_000)
        try keychain.set("api/token", value: Array("s3cret".utf8), now: when)
        #expect(try keychain.entry("api/token") == KeychainEntry(string: "s3cret", updated: when))
        #expect(try keychain.remove("api/token")?.stringValue == "s3cret")
        #expect(try keychain.remove("api/token") == nil)
        #expect(try keychain.load().isEmpty)
        #expect(try dir.mode("kc.bkc") == 0o600)
        #expect(try dir.mode("kc.bkc.lock") == 0o600)
        #expect(try dir.names() == ["kc.bkc", "kc.bkc.lock"])
    }

    @Test func setOnMissingKeychainFails() throws {
        let dir = try TemporaryDirectory()
        let keychain = FileKeychain(path: dir.file("kc.bkc"), key: .generate())
        #expect(throws: KeychainError.missing(path: dir.file("kc.bkc"))) { try keychain.set("a", value: [1]) }
        #expect(try !keychain.exists())
    }

    @Test func invalidNamesAreRefused() throws {
        let dir = try TemporaryDirectory()
        let keychain = FileKeychain(path: dir.file("kc.bkc"), key: .generate())
        try keychain.createIfMissing()
        for name in ["", "a b", "a\tb", "a\nb", String(repeating: "x", count: 256)] {
            #expect(throws: KeychainError.self, "\(name.debugDescription)") { try keychain.set(name, value: [1]) }
        }
    }

    @Test func unreadableFileIsNeverOverwritten() throws {
        let dir = try TemporaryDirectory()
        let path = dir.file("kc.bkc")
        let good = FileKeychain(path: path, key: .generate())
        try good.createIfMissing()
        try good.set("a", value: [1, 2, 3])
        let original = try dir.read("kc.bkc")

        let wrong = FileKeychain(path: path, key: .generate())
        #expect(throws: KeychainError.wrongKeyOrTampered(path: path)) { try wrong.set("b", value: [4]) }
        #expect(throws: KeychainError.wrongKeyOrTampered(path: path)) { try wrong.rekey(to: .generate()) }
        #expect(throws: KeychainError.wrongKeyOrTampered(path: path)) { try wrong.update { $0 = [:] } }
        #expect(try dir.read("kc.bkc") == original)

        let truncated = Array(original.prefix(original.count - 5))
        try dir.write("kc.bkc", truncated, mode: 0o600)
        #expect(throws: KeychainError.truncated(path: path)) { try good.set("b", value: [4]) }
        #expect(try dir.read("kc.bkc") == truncated)
        #expect(try dir.names() == ["kc.bkc", "kc.bkc.lock"])
    }

    @Test func updateWritesOnlyOnChangeAndRethrowsBodyErrors() throws {
        struct Boom: Error {}
        let dir = try TemporaryDirectory()
        let keychain = FileKeychain(path: dir.file("kc.bkc"), key: .generate())
        try keychain.createIfMissing()
        let before = try dir.read("kc.bkc")
        let count = try keychain.update { $0.count }
        #expect(count == 0)
        #expect(try dir.read("kc.bkc") == before)  // unchanged entries: no rewrite (a rewrite changes the nonce)
        #expect(throws: Boom.self) {
            try keychain.update { entries in
                entries["x"] = KeychainEntry(value: [1])
                throw Boom()
            }
        }
        #expect(try dir.read("kc.bkc") == before)
        try keychain.update { $0["x"] = KeychainEntry(value: [1]) }
        #expect(try keychain.load().keys.sorted() == ["x"])
    }

    @Test func exclusiveLockSessionLetsCallerDecide() throws {
        let dir = try TemporaryDirectory()
        let keychain = FileKeychain(path: dir.file("kc.bkc"), key: .generate())
        try keychain.createIfMissing()
        var escaped: KeychainLockedSession?
        let refreshed = try keychain.withExclusiveLock { session -> Bool in
            escaped = session
            guard session.entries["tok"] == nil else { return false }
            try session.write(["tok": KeychainEntry(string: "fresh")])
            #expect(session.entries["tok"]?.stringValue == "fresh")
            return true
        }
        #expect(refreshed)
        #expect(try keychain.entry("tok")?.stringValue == "fresh")
        #expect(throws: KeychainError.lockReleased(path: keychain.path)) { try escaped?.write([:]) }
        #expect(try keychain.entry("tok")?.stringValue == "fresh")
    }

    @Test func nonBlockingLockReportsBusy() throws {
        let dir = try TemporaryDirectory()
        let keychain = FileKeychain(path: dir.file("kc.bkc"), key: .generate())
        try keychain.createIfMissing()
        try keychain.withExclusiveLock { _ in
            // Another open file description (as another process would have) cannot take the lock meanwhile.
            #expect(throws: KeychainError.lockBusy(path: keychain.lockPath)) {
                try keychain.withExclusiveLock(wait: false) { _ in }
            }
        }
        try keychain.withExclusiveLock(wait: false) { _ in }
    }

    @Test func threadsAreSerialized() async throws {
        let dir = try TemporaryDirectory()
        let keychain = FileKeychain(path: dir.file("kc.bkc"), key: .generate())
        try keychain.createIfMissing()
        // Read-modify-write of one counter from many threads: any lost update would show as a smaller count.
        try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0..<8 {
                group.addTask {
                    for _ in 0..<10 {
                        try keychain.update { entries in
                            let n = Int(entries["n"]?.stringValue ?? "0")!
                            entries["n"] = KeychainEntry(string: String(n + 1))
                        }
                    }
                }
            }
            try await group.waitForAll()
        }
        #expect(try keychain.entry("n")?.stringValue == "80")
    }

    @Test func rekeyReencryptsAtomically() throws {
        let dir = try TemporaryDirectory()
        let oldKey = KeychainKey.generate()
        let keychain = FileKeychain(path: dir.file("kc.bkc"), key: oldKey)
        try keychain.createIfMissing()
        try keychain.set("a", value: [9])
        let newKey = KeychainKey.generate()
        let rekeyed = try keychain.rekey(to: newKey)
        #expect(try rekeyed.entry("a")?.value == [9])
        #expect(throws: KeychainError.wrongKeyOrTampered(path: keychain.path)) { try keychain.load() }
        #expect(try dir.names() == ["kc.bkc", "kc.bkc.lock"])
    }

    @Test func writesLeaveNoTemporariesAndCleanUpStaleOnes() throws {
        let dir = try TemporaryDirectory()
        let keychain = FileKeychain(path: dir.file("kc.bkc"), key: .generate())
        try keychain.createIfMissing()
        for i in 0..<20 { try keychain.set("k\(i)", value: Array(repeating: UInt8(i), count: 1000)) }
        #expect(try dir.names() == ["kc.bkc", "kc.bkc.lock"])
        // What a writer killed between mkstemp and rename leaves behind:
        try dir.write(".kc.bkc.tmp-AbC123", [1, 2, 3], mode: 0o600)
        try keychain.set("after", value: [1])
        #expect(try dir.names() == ["kc.bkc", "kc.bkc.lock"])
        #expect(try keychain.load().count == 21)
    }

    @Test func failedWriteLeavesNoTemporary() throws {
        let dir = try TemporaryDirectory()
        // Renaming a file over a non-empty directory fails after the temporary file was written.
        let path = dir.file("kc.bkc")
        try FileManager.default.createDirectory(atPath: path + "/sub", withIntermediateDirectories: true)
        #expect(throws: KeychainError.self) { try AtomicFile.replace(path, with: [1, 2, 3]) }
        #expect(try dir.names() == ["kc.bkc"])
    }
}

@Suite struct FileKeychainAsyncLockTests {
    /// Stands in for a token endpoint: the refresh awaits it while holding the lock.
    actor SlowTokenEndpoint {
        private var calls = 0
        func fetch() async -> String {
            calls += 1
            await Task.yield()
            return "token-\(calls)"
        }
        var callCount: Int { calls }
    }

    @Test func lockIsHeldAcrossAwaitsAndRefreshHappensOnce() async throws {
        let dir = try TemporaryDirectory()
        let keychain = FileKeychain(path: dir.file("kc.bkc"), key: .generate())
        try keychain.createIfMissing()
        let endpoint = SlowTokenEndpoint()
        // Ten concurrent "lock, re-read, maybe refresh, write" sequences: only the first finds no token.
        try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0..<10 {
                group.addTask {
                    try await keychain.withExclusiveLock { session in
                        guard session.entries["api/access_token"] == nil else { return }
                        // Another holder must not be able to take the lock while we await the endpoint.
                        #expect(throws: KeychainError.lockBusy(path: keychain.lockPath)) {
                            try keychain.withExclusiveLock(wait: false) { _ in }
                        }
                        let token = await endpoint.fetch()
                        try session.write(["api/access_token": KeychainEntry(string: token)])
                    }
                }
            }
            try await group.waitForAll()
        }
        #expect(await endpoint.callCount == 1)
        #expect(try keychain.entry("api/access_token")?.stringValue == "token-1")
    }

    @Test func asyncCountersDoNotLoseUpdates() async throws {
        let dir = try TemporaryDirectory()
        let keychain = FileKeychain(path: dir.file("kc.bkc"), key: .generate())
        try keychain.createIfMissing()
        try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0..<6 {
                group.addTask {
                    for _ in 0..<5 {
                        try await keychain.withExclusiveLock { session in
                            let n = Int(session.entries["n"]?.stringValue ?? "0")!
                            await Task.yield()
                            try session.write(["n": KeychainEntry(string: String(n + 1))])
                        }
                    }
                }
            }
            try await group.waitForAll()
        }
        #expect(try keychain.entry("n")?.stringValue == "30")
    }
}
