import Crypto
import Foundation

/// The on-disk keychain format, without any disk access.
///
/// Layout (integers big-endian):
///
///     magic "BKC1" (4) | version u16 | algorithm u8 | ciphertext length u32 | nonce (12) | ciphertext | tag (16)
///
/// The 23 header bytes are the AEAD associated data, so changing the version, algorithm, length or nonce fails
/// authentication just like changing the ciphertext. The explicit length lets a short file be reported as
/// truncated rather than as a wrong key.
public enum KeychainCodec {
    public static let magic: [UInt8] = Array("BKC1".utf8)
    public static let formatVersion: UInt16 = 1
    /// Algorithm id 1: AES-256-GCM with a 96-bit random nonce and a 128-bit tag.
    public static let aes256GCM: UInt8 = 1
    static let nonceSize = 12
    static let tagSize = 16
    static let headerSize = 4 + 2 + 1 + 4 + nonceSize

    /// Seals `entries` under `key` with a fresh random nonce.
    public static func encode(_ entries: [String: KeychainEntry], key: KeychainKey) -> [UInt8] {
        encode(entries, key: key, nonce: AES.GCM.Nonce())
    }

    /// Tests pass a fixed nonce to check determinism; production code must never reuse one.
    static func encode(_ entries: [String: KeychainEntry], key: KeychainKey, nonce: [UInt8]) throws -> [UInt8] {
        try encode(entries, key: key, nonce: AES.GCM.Nonce(data: nonce))
    }

    static func encode(_ entries: [String: KeychainEntry], key: KeychainKey, nonce: AES.GCM.Nonce) -> [UInt8] {
        let plaintext = KeychainPayload.encode(entries)
        var header = magic
        header.appendBigEndian(formatVersion)
        header.append(aes256GCM)
        header.appendBigEndian(UInt32(plaintext.count))
        header.append(contentsOf: nonce)
        // seal only fails for invalid key or nonce sizes, which the types rule out.
        let box = try! AES.GCM.seal(plaintext, using: key.symmetricKey, nonce: nonce, authenticating: header)
        return header + box.ciphertext + box.tag
    }

    /// The plaintext payload format alone, as it is after decryption. Public so the fuzzer can reach the payload
    /// parser without forging authenticated ciphertext; nothing else needs it.
    public static func decodePayload(_ bytes: [UInt8]) throws(KeychainError) -> [String: KeychainEntry] {
        try KeychainPayload.decode(bytes)
    }

    /// Opens a keychain. Checks run outside-in so that each failure gets the most specific error.
    public static func decode(_ bytes: [UInt8], key: KeychainKey) throws(KeychainError) -> [String: KeychainEntry] {
        let magicLength = min(bytes.count, magic.count)
        guard bytes[0..<magicLength].elementsEqual(magic[0..<magicLength]) else { throw .notAKeychain(path: nil) }
        guard bytes.count >= 6 else { throw .truncated(path: nil) }
        let version = UInt16(bytes[4]) << 8 | UInt16(bytes[5])
        guard version == formatVersion else { throw .unsupportedVersion(version, path: nil) }
        guard bytes.count >= 7 else { throw .truncated(path: nil) }
        guard bytes[6] == aes256GCM else { throw .unsupportedAlgorithm(bytes[6], path: nil) }
        guard bytes.count >= headerSize else { throw .truncated(path: nil) }
        let length = Int(UInt32(bytes[7]) << 24 | UInt32(bytes[8]) << 16 | UInt32(bytes[9]) << 8 | UInt32(bytes[10]))
        let expected = headerSize + length + tagSize
        guard bytes.count >= expected else { throw .truncated(path: nil) }
        // Trailing bytes are not covered by the tag; accepting them would let the file grow unnoticed.
        guard bytes.count == expected else { throw .wrongKeyOrTampered(path: nil) }

        let header = bytes[0..<headerSize]
        let plaintext: Data
        do {
            let box = try AES.GCM.SealedBox(
                nonce: AES.GCM.Nonce(data: bytes[(headerSize - nonceSize)..<headerSize]),
                ciphertext: bytes[headerSize..<(headerSize + length)],
                tag: bytes[(headerSize + length)...]
            )
            plaintext = try AES.GCM.open(box, using: key.symmetricKey, authenticating: header)
        } catch {
            throw .wrongKeyOrTampered(path: nil)
        }
        return try KeychainPayload.decode(Array(plaintext))
    }
}

extension Array where Element == UInt8 {
    mutating func appendBigEndian<T: FixedWidthInteger>(_ value: T) {
        Swift.withUnsafeBytes(of: value.bigEndian) { append(contentsOf: $0) }
    }
}
