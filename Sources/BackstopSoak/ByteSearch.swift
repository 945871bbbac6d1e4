import Glibc

/// Substring search on raw bytes (`memchr` for the first byte, `memcmp` for the rest): Glibc's `memmem` is a GNU
/// extension Swift does not import.
enum ByteSearch {
    /// The offset of the first `needle` in `haystack` at or after `from`, or nil.
    static func find(_ needle: UnsafeRawBufferPointer, in haystack: UnsafeRawBufferPointer, from: Int = 0) -> Int? {
        guard let first = needle.first, let base = haystack.baseAddress, let needleBase = needle.baseAddress else {
            return nil
        }
        var offset = from
        while offset + needle.count <= haystack.count {
            guard let hit = memchr(base + offset, Int32(first), haystack.count - offset - needle.count + 1) else {
                return nil
            }
            let at = base.distance(to: UnsafeRawPointer(hit))
            if memcmp(base + at, needleBase, needle.count) == 0 { return at }
            offset = at + 1
        }
        return nil
    }

    static func contains(_ haystack: [UInt8], _ needle: [UInt8]) -> Bool {
        haystack.withUnsafeBytes { h in needle.withUnsafeBytes { find($0, in: h) != nil } }
    }
}
