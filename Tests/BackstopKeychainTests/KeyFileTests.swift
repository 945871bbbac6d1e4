import Foundation
import Testing

@testable import BackstopKeychain

@Suite struct KeyFileTests {
    let raw: [UInt8] = (0..<32).map { UInt8($0 * 7 % 256) }
    var base64: String { Data(raw).base64EncodedString() }

    @Test func rawAndBase64FormsLoadTheSameKey() throws {
        let dir = try TemporaryDirectory()
        try dir.write("raw.key", raw, mode: 0o600)
        try dir.write("b64.key", Array(base64.utf8), mode: 0o600)
        try dir.write("b64nl.key", Array((base64 + "\n").utf8), mode: 0o400)
        let expected = try KeychainKey(bytes: raw)
        for name in ["raw.key", "b64.key", "b64nl.key"] {
            #expect(try KeychainKey.load(path: dir.file(name)).matches(expected), "\(name)")
        }
    }

    @Test func groupOrWorldAccessibleIsRefused() throws {
        let dir = try TemporaryDirectory()
        for mode in [0o644, 0o640, 0o604, 0o620, 0o601, 0o660] {
            try dir.write("k", raw, mode: mode)
            let path = dir.file("k")
            #expect(throws: KeychainError.keyFileInsecureMode(path: path, mode: UInt32(mode))) {
                try KeychainKey.load(path: path)
            }
        }
        #expect(
            KeychainError.keyFileInsecureMode(path: "/k", mode: 0o644).description
                == "key file /k has mode 0644; must be 0600 or stricter (chmod 600 /k)")
    }

    @Test func missingIsDistinct() throws {
        let dir = try TemporaryDirectory()
        #expect(throws: KeychainError.keyFileMissing(path: dir.file("nope"))) {
            try KeychainKey.load(path: dir.file("nope"))
        }
    }

    @Test func wrongLengthsAreRefused() throws {
        let dir = try TemporaryDirectory()
        let bad: [[UInt8]] = [
            [], Array(raw.prefix(31)), raw + [1], Array((base64 + "\n\n").utf8),
            Array(String(base64.dropLast()).utf8), Array(String(repeating: "!", count: 44).utf8),
            Array(Data(raw + [1, 2]).base64EncodedString().utf8), [UInt8](repeating: 65, count: 4096),
        ]
        for (index, contents) in bad.enumerated() {
            try dir.write("k", contents, mode: 0o600)
            let error = #expect(throws: KeychainError.self, "case \(index)") {
                try KeychainKey.load(path: dir.file("k"))
            }
            guard case .keyFileMalformed(let path, _) = error else {
                Issue.record("case \(index): \(String(describing: error))")
                continue
            }
            #expect(path == dir.file("k"))
        }
    }

    @Test func directoryIsRefused() throws {
        let dir = try TemporaryDirectory()
        try FileManager.default.createDirectory(
            atPath: dir.file("d"), withIntermediateDirectories: false, attributes: [.posixPermissions: 0o700])
        #expect(throws: KeychainError.self) { try KeychainKey.load(path: dir.file("d")) }
    }

    /// A FIFO with no writer: opening it for reading used to wait forever (`check` and every keychain command hung).
    @Test func fifoIsRefusedAtOnce() throws {
        let dir = try TemporaryDirectory()
        let path = dir.file("fifo.key")
        #expect(mkfifo(path, 0o600) == 0)
        #expect(throws: KeychainError.keyFileMalformed(path: path, reason: "it is not a regular file")) {
            try KeychainKey.load(path: path)
        }
        let keychain = FileKeychain(path: path, key: try KeychainKey(bytes: raw))
        #expect(throws: KeychainError.malformedContents(path: path, reason: "it is not a regular file")) {
            try keychain.load()
        }
        // A device is not read whole into memory either.
        let zero = FileKeychain(path: "/dev/zero", key: try KeychainKey(bytes: raw))
        #expect(throws: KeychainError.malformedContents(path: "/dev/zero", reason: "it is not a regular file")) {
            try zero.load()
        }
    }

    @Test func ownerMismatchMessage() {
        #expect(
            KeychainError.keyFileWrongOwner(path: "/k", owner: 0, expected: 1000).description
                == "key file /k is owned by uid 0, not the running user 1000")
    }

    @Test func newKeyFileIsBase64Mode0600AndNeverOverwrites() throws {
        let dir = try TemporaryDirectory()
        let key = KeychainKey.generate()
        let path = dir.file("new.key")
        let oldMask = umask(0)  // the file must be 0600 regardless of a permissive umask
        defer { umask(oldMask) }
        try key.writeNewKeyFile(path: path)
        #expect(try dir.mode("new.key") == 0o600)
        #expect(try dir.read("new.key") == Array((key.base64 + "\n").utf8))
        #expect(try KeychainKey.load(path: path).matches(key))
        #expect(throws: KeychainError.keyFileExists(path: path)) {
            try KeychainKey.generate().writeNewKeyFile(path: path)
        }
        #expect(try KeychainKey.load(path: path).matches(key))
        #expect(try dir.names() == ["new.key"])
    }

    @Test func credentialFromDirectory() throws {
        let dir = try TemporaryDirectory()
        try dir.write("keychain.key", Array(base64.utf8), mode: 0o440)
        let key = try KeychainKey.fromCredential(name: "keychain.key", environment: ["CREDENTIALS_DIRECTORY": dir.path])
        #expect(key.matches(try KeychainKey(bytes: raw)))
        try dir.write("world.key", Array(base64.utf8), mode: 0o444)
        #expect(throws: KeychainError.keyFileInsecureMode(path: dir.file("world.key"), mode: 0o444)) {
            try KeychainKey.fromCredential(name: "world.key", environment: ["CREDENTIALS_DIRECTORY": dir.path])
        }
        #expect(throws: KeychainError.credentialsDirectoryUnset(name: "keychain.key")) {
            try KeychainKey.fromCredential(name: "keychain.key", environment: [:])
        }
        #expect(throws: KeychainError.self) {
            try KeychainKey.fromCredential(name: "../etc/passwd", environment: ["CREDENTIALS_DIRECTORY": dir.path])
        }
    }

    @Test func generatedKeysDiffer() {
        #expect(!KeychainKey.generate().matches(KeychainKey.generate()))
        #expect(throws: KeychainError.invalidKeyLength(16)) { try KeychainKey(bytes: Array(raw.prefix(16))) }
    }
}

/// Needs root to hand a file to another user; skipped otherwise.
@Suite(.enabled(if: geteuid() == 0, "needs root to chown a key file to another user"))
struct KeyFileOwnerTests {
    @Test func foreignOwnerIsRefused() throws {
        let dir = try TemporaryDirectory()
        try KeychainKey.generate().writeNewKeyFile(path: dir.file("k"))
        #expect(chown(dir.file("k"), 4242, 4242) == 0)
        #expect(throws: KeychainError.keyFileWrongOwner(path: dir.file("k"), owner: 4242, expected: 0)) {
            try KeychainKey.load(path: dir.file("k"))
        }
        // systemd credentials may be root-owned, but a file of some other user is refused there too.
        let env = ["CREDENTIALS_DIRECTORY": dir.path]
        #expect(throws: KeychainError.keyFileWrongOwner(path: dir.file("k"), owner: 4242, expected: 0)) {
            try KeychainKey.fromCredential(name: "k", environment: env)
        }
    }
}
