import Foundation
import Testing

@testable import BackstopKeychain

@Suite struct KeychainBootstrapTests {
    @Test func neitherFileCreatesBoth() throws {
        let dir = try TemporaryDirectory()
        let opened = try KeychainBootstrap.open(path: dir.file("kc.bkc"), key: .file(path: dir.file("kc.key")))
        #expect(opened.outcome == .createdKeyAndKeychain)
        #expect(opened.entryCount == 0)
        #expect(try dir.mode("kc.key") == 0o600)
        #expect(try dir.mode("kc.bkc") == 0o600)
        let key = try KeychainKey.load(path: dir.file("kc.key"))
        #expect(try FileKeychain(path: dir.file("kc.bkc"), key: key).load().isEmpty)

        try opened.keychain.set("a", value: [1])
        let again = try KeychainBootstrap.open(path: dir.file("kc.bkc"), key: .file(path: dir.file("kc.key")))
        #expect(again.outcome == .openedExisting)
        #expect(again.entryCount == 1)
    }

    @Test func keyButNoKeychainCreatesKeychain() throws {
        let dir = try TemporaryDirectory()
        let key = KeychainKey.generate()
        try key.writeNewKeyFile(path: dir.file("kc.key"))
        let opened = try KeychainBootstrap.open(path: dir.file("kc.bkc"), key: .file(path: dir.file("kc.key")))
        #expect(opened.outcome == .createdKeychain)
        #expect(try FileKeychain(path: dir.file("kc.bkc"), key: key).load().isEmpty)
    }

    @Test func keychainButNoKeyRefuses() throws {
        let dir = try TemporaryDirectory()
        try FileKeychain(path: dir.file("kc.bkc"), key: .generate()).createIfMissing()
        let before = try dir.read("kc.bkc")
        let error = KeychainError.keyMissingForExistingKeychain(
            keychainPath: dir.file("kc.bkc"), keyPath: dir.file("kc.key"))
        #expect(throws: error) {
            try KeychainBootstrap.open(path: dir.file("kc.bkc"), key: .file(path: dir.file("kc.key")))
        }
        #expect(
            error.description == "keychain \(dir.file("kc.bkc")) exists but key file \(dir.file("kc.key")) "
                + "is missing; refusing to start (it would not be readable)")
        #expect(try dir.read("kc.bkc") == before)
        #expect(!FileManager.default.fileExists(atPath: dir.file("kc.key")))
    }

    @Test func wrongKeyRefusesAndLeavesFile() throws {
        let dir = try TemporaryDirectory()
        try FileKeychain(path: dir.file("kc.bkc"), key: .generate()).createIfMissing()
        try KeychainKey.generate().writeNewKeyFile(path: dir.file("kc.key"))
        let before = try dir.read("kc.bkc")
        #expect(throws: KeychainError.wrongKeyOrTampered(path: dir.file("kc.bkc"))) {
            try KeychainBootstrap.open(path: dir.file("kc.bkc"), key: .file(path: dir.file("kc.key")))
        }
        #expect(try dir.read("kc.bkc") == before)
    }

    @Test func insecureKeyRefuses() throws {
        let dir = try TemporaryDirectory()
        try dir.write("kc.key", Array(KeychainKey.generate().base64.utf8), mode: 0o644)
        #expect(throws: KeychainError.keyFileInsecureMode(path: dir.file("kc.key"), mode: 0o644)) {
            try KeychainBootstrap.open(path: dir.file("kc.bkc"), key: .file(path: dir.file("kc.key")))
        }
        #expect(try dir.names() == ["kc.key"])
    }

    @Test func missingCredentialIsNotCreated() throws {
        let dir = try TemporaryDirectory()
        let env = ["CREDENTIALS_DIRECTORY": dir.path]
        #expect(throws: KeychainError.keyFileMissing(path: dir.file("kc.key"))) {
            try KeychainBootstrap.open(path: dir.file("kc.bkc"), key: .credential(name: "kc.key"), environment: env)
        }
        #expect(try dir.names().isEmpty)
    }
}
