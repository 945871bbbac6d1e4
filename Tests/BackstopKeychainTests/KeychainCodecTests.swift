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
        #expect(
            try KeychainCodec.encode(entries, key: key, nonce: nonce)
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
        #expect(
            KeychainError.wrongKeyOrTampered(path: "/k").description
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

    /// Payload parser cases: a sealed file is authenticated, so these only arise from a writer bug, but the parser
    /// must still refuse them with a reason rather than trap or return entries that break later comparisons.
    @Test func malformedPayloadsAreRefused() throws {
        func payload(count: UInt32, name: String, seconds: Double, value: [UInt8]) -> [UInt8] {
            var out: [UInt8] = []
            out.appendBigEndian(count)
            out.appendBigEndian(UInt32(name.utf8.count))
            out.append(contentsOf: name.utf8)
            out.appendBigEndian(seconds.bitPattern)
            out.appendBigEndian(UInt32(value.count))
            out.append(contentsOf: value)
            return out
        }
        let good = payload(count: 1, name: "a", seconds: 1.5, value: [1, 2])
        #expect(
            try KeychainCodec.decodePayload(good) == [
                "a": KeychainEntry(value: [1, 2], updated: Date(timeIntervalSinceReferenceDate: 1.5))
            ])
        for seconds in [Double.nan, .infinity, -.infinity] {
            #expect(
                throws: KeychainError.malformedContents(path: nil, reason: "entry update time is not a finite date")
            ) {
                try KeychainCodec.decodePayload(payload(count: 1, name: "a", seconds: seconds, value: []))
            }
        }
        #expect(throws: KeychainError.malformedContents(path: nil, reason: "entry list ends early")) {
            try KeychainCodec.decodePayload(payload(count: 2, name: "a", seconds: 0, value: []))
        }
        #expect(throws: KeychainError.malformedContents(path: nil, reason: "entry list ends early")) {
            try KeychainCodec.decodePayload([0xff, 0xff, 0xff, 0xff])
        }
        #expect(throws: KeychainError.malformedContents(path: nil, reason: "trailing bytes after the last entry")) {
            try KeychainCodec.decodePayload(good + [0])
        }
        #expect(throws: KeychainError.malformedContents(path: nil, reason: "entry name is not UTF-8")) {
            try KeychainCodec.decodePayload(
                payload(count: 1, name: "a", seconds: 0, value: []).enumerated().map {
                    $0.offset == 8 ? 0xff : $0.element
                })
        }
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
