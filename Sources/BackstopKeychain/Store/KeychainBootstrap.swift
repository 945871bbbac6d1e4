import Foundation

/// The keychain creation policy of docs/reference/operations.md#keychain, shared by `backstop run` and `backstop keychain init`:
///
/// | keychain | key     | result                                                    |
/// | -------- | ------- | --------------------------------------------------------- |
/// | missing  | missing | create a key file (0600) and an empty keychain            |
/// | missing  | present | create an empty keychain                                  |
/// | present  | missing | refuse (`.keyMissingForExistingKeychain`): never orphan it |
/// | present  | present | open it; a wrong key or damaged file is an error          |
///
/// A systemd credential cannot be created by Backstop, so a missing credential is always an error.
/// Takes plain paths so that the module stays independent of the config model.
public enum KeychainBootstrap {
    /// What `open` had to do.
    public enum Outcome: Sendable, Equatable {
        case openedExisting
        case createdKeychain
        case createdKeyAndKeychain
    }

    /// An opened keychain, the entries read while verifying it, and what was created on the way.
    public struct Opened: Sendable {
        public let keychain: FileKeychain
        public let outcome: Outcome
        /// Number of entries found (0 for a new keychain). Loading them proves the key opens the file.
        public let entryCount: Int
    }

    public static func open(
        path: String, key source: KeychainKeySource,
        environment: [String: String] = ProcessInfo.processInfo.environment
    ) throws(KeychainError) -> Opened {
        // A fresh machine has no state directory yet (systemd's StateDirectory= makes it in production).
        try Posix.makeDirectories(Posix.directory(of: path), mode: 0o700)
        if case .file(let keyPath) = source { try Posix.makeDirectories(Posix.directory(of: keyPath), mode: 0o700) }
        let keychainExisted = try Posix.exists(path)
        var createdKey = false
        let key: KeychainKey
        do {
            key = try KeychainKey.load(source, environment: environment)
        } catch .keyFileMissing(let keyPath) {
            if keychainExisted { throw .keyMissingForExistingKeychain(keychainPath: path, keyPath: keyPath) }
            guard case .file = source else { throw .keyFileMissing(path: keyPath) }
            key = try createKey(at: keyPath)
            createdKey = true
        }
        let keychain = FileKeychain(path: path, key: key)
        let createdKeychain = try keychain.createIfMissing()
        let entryCount = try keychain.load().count
        let outcome: Outcome =
            createdKeychain ? (createdKey ? .createdKeyAndKeychain : .createdKeychain) : .openedExisting
        return Opened(keychain: keychain, outcome: outcome, entryCount: entryCount)
    }

    /// Creates a key file, or, when another process won the race to create it, loads theirs.
    static func createKey(at path: String) throws(KeychainError) -> KeychainKey {
        let key = KeychainKey.generate()
        do {
            try key.writeNewKeyFile(path: path)
            return key
        } catch .keyFileExists {
            return try KeychainKey.load(path: path)
        }
    }
}
