import Foundation

/// The plaintext inside the AEAD box: a deterministic, length-prefixed binary list of entries.
///
///     count u32 | repeated, sorted by name: name length u32 | name (UTF-8) | updated u64 | value length u32 | value
///
/// `updated` is the bit pattern of `Date.timeIntervalSinceReferenceDate`, so dates round-trip exactly.
/// Binary rather than JSON so that values are not inflated by base64 and there is no parser to trust.
enum KeychainPayload {
    static func encode(_ entries: [String: KeychainEntry]) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(4 + entries.reduce(0) { $0 + 16 + $1.key.utf8.count + $1.value.value.count })
        out.appendBigEndian(UInt32(entries.count))
        for (name, entry) in entries.sorted(by: { $0.key.utf8.lexicographicallyPrecedes($1.key.utf8) }) {
            out.appendBigEndian(UInt32(name.utf8.count))
            out.append(contentsOf: name.utf8)
            out.appendBigEndian(entry.updated.timeIntervalSinceReferenceDate.bitPattern)
            out.appendBigEndian(UInt32(entry.value.count))
            out.append(contentsOf: entry.value)
        }
        return out
    }

    static func decode(_ bytes: [UInt8]) throws(KeychainError) -> [String: KeychainEntry] {
        var reader = Reader(bytes: bytes)
        let count = try reader.u32()
        var entries: [String: KeychainEntry] = [:]
        for _ in 0..<count {
            let nameBytes = try reader.bytes(Int(try reader.u32()))
            guard let name = String(validating: nameBytes, as: UTF8.self) else {
                throw .malformedContents(path: nil, reason: "entry name is not UTF-8")
            }
            let seconds = Double(bitPattern: try reader.u64())
            // A NaN or infinite date would compare unequal to itself and break every later age check.
            guard seconds.isFinite else {
                throw .malformedContents(path: nil, reason: "entry update time is not a finite date")
            }
            let updated = Date(timeIntervalSinceReferenceDate: seconds)
            let value = try reader.bytes(Int(try reader.u32()))
            guard entries.updateValue(KeychainEntry(value: value, updated: updated), forKey: name) == nil else {
                throw .malformedContents(path: nil, reason: "duplicate entry name")
            }
        }
        guard reader.offset == bytes.count else {
            throw .malformedContents(path: nil, reason: "trailing bytes after the last entry")
        }
        return entries
    }

    private struct Reader {
        let bytes: [UInt8]
        var offset = 0

        mutating func bytes(_ count: Int) throws(KeychainError) -> [UInt8] {
            guard count <= bytes.count - offset else {
                throw .malformedContents(path: nil, reason: "entry list ends early")
            }
            defer { offset += count }
            return Array(bytes[offset..<(offset + count)])
        }

        mutating func u32() throws(KeychainError) -> UInt32 {
            try bytes(4).reduce(0) { $0 << 8 | UInt32($1) }
        }

        mutating func u64() throws(KeychainError) -> UInt64 {
            try bytes(8).reduce(0) { $0 << 8 | UInt64($1) }
        }
    }
}
