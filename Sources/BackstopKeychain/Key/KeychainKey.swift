import Crypto
import Foundation

/// The 256-bit key that seals a keychain. Its description never shows the key material.
public struct KeychainKey: Sendable {
    let symmetricKey: SymmetricKey

    /// Key size in bytes.
    public static let byteCount = 32

    public init(bytes: [UInt8]) throws(KeychainError) {
        guard bytes.count == Self.byteCount else { throw .invalidKeyLength(bytes.count) }
        symmetricKey = SymmetricKey(data: bytes)
    }

    /// A fresh random key from the system CSPRNG.
    public static func generate() -> KeychainKey {
        KeychainKey(symmetricKey: SymmetricKey(size: .bits256))
    }

    private init(symmetricKey: SymmetricKey) {
        self.symmetricKey = symmetricKey
    }

    /// The key as it is written to key files: 44 base64 characters.
    public var base64: String {
        symmetricKey.withUnsafeBytes { Data($0).base64EncodedString() }
    }

    /// Whether two keys are the same, compared in constant time.
    public func matches(_ other: KeychainKey) -> Bool {
        symmetricKey == other.symmetricKey
    }
}

extension KeychainKey: CustomStringConvertible, CustomDebugStringConvertible, CustomReflectable {
    public var description: String { "KeychainKey(redacted)" }
    public var debugDescription: String { description }
    public var customMirror: Mirror { Mirror(self, children: [:]) }
}
