import Crypto
import Foundation

/// Seals records kept outside the keychain file, such as the fleet token store's rows
/// (docs/reference/token-store.md#what-the-database-holds), under a key derived from the keychain key: every
/// instance that shares the key file can read them, the database never can. AES-256-GCM with a subkey from HKDF-SHA256
/// (so the keychain key itself never encrypts anything else), and `context` bound as associated data so a record
/// cannot be moved to another row or table.
public struct RecordSealer: Sendable {
    private let key: SymmetricKey
    static let info = Data("backstop record sealing v1".utf8)
    /// Format byte in front of each sealed record.
    static let version: UInt8 = 1

    public init(keychainKey: KeychainKey) {
        key = HKDF<SHA256>.deriveKey(inputKeyMaterial: keychainKey.symmetricKey, info: Self.info, outputByteCount: 32)
    }

    public init(keychain: FileKeychain) { self.init(keychainKey: keychain.key) }

    /// `version ‖ nonce ‖ ciphertext ‖ tag`.
    public func seal(_ plaintext: [UInt8], context: String) -> [UInt8] {
        // Sealing with a fresh random nonce and a valid key cannot fail.
        let box = try! AES.GCM.seal(plaintext, using: key, authenticating: Data(context.utf8))
        return [Self.version] + Array(box.combined!)
    }

    /// The plaintext, or nil when the record was sealed under another key, for another context, or was altered.
    public func open(_ sealed: [UInt8], context: String) -> [UInt8]? {
        guard sealed.first == Self.version, sealed.count >= 1 + 12 + 16,
            let box = try? AES.GCM.SealedBox(combined: sealed.dropFirst()),
            let plaintext = try? AES.GCM.open(box, using: key, authenticating: Data(context.utf8))
        else { return nil }
        return Array(plaintext)
    }
}
