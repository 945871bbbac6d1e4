import Foundation
import Testing
@testable import BackstopKeychain

@Suite struct KeychainCodecTests {
    let key = KeychainKey.generate()
    let entries: [String: KeychainEntry] = [
        "api/access_token": KeychainEntry(string: "tok-123", updated: Date(timeIntervalSince1970: 1_700_000_000.25)),
        "api/refresh_token": KeychainEntry(
            value: [0, 1, 2, 255, 10], updated: Date(timeIntervalSinceReferenceDate: 1.5)),
        "é/名前": KeychainEntry(value: [], updated: Date()),
    ]

    @Test func roundTrip() throws {
        let bytes = KeychainCodec.encode(entries, key: key)
        #expect(Array(bytes.prefix(4)) == Array("BKC1".utf8))
        #expect(try KeychainCodec.decode(bytes, key: key) == entries)
    }

    @Test func emptyRoundTrip() throws {
        let bytes = KeychainCodec.encode([:], key: key)
        #expect(bytes.count == KeychainCodec.headerSize + KeychainCodec.tagSize + 4)
        #expect(try KeychainCodec.decode(bytes, key: key).isEmpty)
    }

    @Test func payloadIsDeterministic() throws {
        var shuffled: [String: KeychainEntry] = [:]
        for (name, entry) in entries.shuffled() { shuffled[name] = entry }
        #expect(KeychainPayload.encode(entries) == KeychainPayload.encode(shuffled))
        let nonce = [UInt8](repeating: 7, count: 12)
        #expect(try KeychainCodec.encode(entries, key: key, nonce: nonce)
            == KeychainCodec.encode(shuffled, key: key, nonce: nonce))
    }

    @Test func freshNoncePerWrite() {
        #expect(KeychainCodec.encode(entries, key: key) != KeychainCodec.encode(entries, key: key))
    }

    @Test func wrongKey() {
        let bytes = KeychainCodec.encode(entries, key: key)
        #expect(throws: KeychainError.wrongKeyOrTampered(path: nil)) {
            try KeychainCodec.decode(bytes, key: KeychainKey.generate())
        }
        #expect(KeychainError.wrongKeyOrTampered(path: "/k").description
            == "cannot decrypt keychain /k: wrong key or file tampered with")
    }

    @Test func everyTruncationIsAnError() {
        let bytes = KeychainCodec.encode(entries, key: key)
        for length in 0..<bytes.count {
            #expect(throws: KeychainError.truncated(path: nil), "length \(length)") {
                try KeychainCodec.decode(Array(bytes.prefix(length)), key: key)
            }
        }
    }

    @Test func everySingleByteFlipIsAnError() {
        let bytes = KeychainCodec.encode(entries, key: key)
        for index in bytes.indices {
            for mask: UInt8 in [0x01, 0x80, 0xff] {
                var damaged = bytes
                damaged[index] ^= mask
                #expect(throws: KeychainError.self, "byte \(index) ^ \(mask)") {
                    try KeychainCodec.decode(damaged, key: key)
                }
            }
        }
    }

    @Test func flippedCiphertextIsReportedAsTampered() {
        var bytes = KeychainCodec.encode(entries, key: key)
        bytes[KeychainCodec.headerSize + 3] ^= 1
        #expect(throws: KeychainError.wrongKeyOrTampered(path: nil)) { try KeychainCodec.decode(bytes, key: key) }
    }

    @Test func trailingBytesAreTampering() {
        let bytes = KeychainCodec.encode(entries, key: key) + [0]
        #expect(throws: KeychainError.wrongKeyOrTampered(path: nil)) { try KeychainCodec.decode(bytes, key: key) }
    }

    @Test func badMagic() {
        var bytes = KeychainCodec.encode(entries, key: key)
        bytes[0] = UInt8(ascii: "X")
        #expect(throws: KeychainError.notAKeychain(path: nil)) { try KeychainCodec.decode(bytes, key: key) }
        #expect(throws: KeychainError.notAKeychain(path: nil)) {
            try KeychainCodec.decode(Array("version: 1\n".utf8), key: key)
        }
        #expect(throws: KeychainError.notAKeychain(path: nil)) {
            try KeychainCodec.decode([0x42, 0x4b, 0x00], key: key)
        }
    }

    @Test func unsupportedVersionAndAlgorithm() {
        var bytes = KeychainCodec.encode(entries, key: key)
        bytes[5] = 2
        #expect(throws: KeychainError.unsupportedVersion(2, path: nil)) { try KeychainCodec.decode(bytes, key: key) }
        bytes[5] = 1
        bytes[6] = 9
        #expect(throws: KeychainError.unsupportedAlgorithm(9, path: nil)) { try KeychainCodec.decode(bytes, key: key) }
    }

    @Test func descriptionsCarryNoSecrets() {
        let entry = KeychainEntry(string: "hunter2-secret")
        #expect(!"\(entry)".contains("hunter2"))
        #expect(!String(reflecting: entry).contains("hunter2"))
        var dumped = ""
        dump(entry, to: &dumped)
        #expect(!dumped.contains("value"))
        let text = key.base64
        #expect(!"\(key)".contains(text) && !String(reflecting: key).contains(text))
    }
}
