import Glibc

/// Finds which of a set of secrets appear in a log file, reading it once in fixed-size chunks: memory stays flat
/// however long the log is (a 25-minute soak writes gigabytes of debug lines).
///
/// Every secret the soak issues contains `salt` (a random string nothing else in the log can contain), so the scan
/// looks for the salt alone (`ByteSearch`) and, only where it occurs, reads the token around it (letters, digits,
/// `-`, `_`) and checks it against every secret. A healthy log has no occurrence at all.
struct SecretScanner {
    let secrets: Set<String>
    let salt: [UInt8]
    var chunkSize = 1 << 20

    struct Result: Equatable {
        /// Distinct secrets found.
        var found: Set<String> = []
        var lines = 0
    }

    func scan(path: String) -> Result {
        var result = Result()
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return result }
        defer { close(fd) }
        // A salt occurrence is judged with up to `context` bytes on either side (a secret is never longer).
        let context = secrets.map(\.utf8.count).max() ?? 0
        var buffer: [UInt8] = []
        // Occurrences starting before this offset of `buffer` were judged already.
        var judged = 0
        var chunk = [UInt8](repeating: 0, count: chunkSize)
        while true {
            let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, chunkSize) }
            let atEnd = n <= 0
            if n > 0 {
                buffer.append(contentsOf: chunk[0..<n])
                result.lines += chunk[0..<n].reduce(0) { $0 + ($1 == 0x0A ? 1 : 0) }
            }
            // Occurrences starting in the last `context + salt` bytes wait for their right context.
            let limit = atEnd ? buffer.count : max(judged, buffer.count - context - salt.count)
            inspect(buffer, from: judged, below: limit, into: &result)
            if atEnd { break }
            // Keep `context` bytes before the next unjudged offset as left context.
            let drop = max(0, limit - context)
            buffer.removeFirst(drop)
            judged = limit - drop
        }
        return result
    }

    private func inspect(_ buffer: [UInt8], from start: Int, below limit: Int, into result: inout Result) {
        guard !salt.isEmpty else { return }
        buffer.withUnsafeBytes { bytes in
            salt.withUnsafeBytes { needle in
                var offset = start
                while offset < limit, let at = ByteSearch.find(needle, in: bytes, from: offset) {
                    guard at < limit else { break }
                    var start = at
                    while start > 0, Self.isTokenByte(bytes[start - 1]) { start -= 1 }
                    var end = at + needle.count
                    while end < bytes.count, Self.isTokenByte(bytes[end]) { end += 1 }
                    let token = String(decoding: UnsafeRawBufferPointer(rebasing: bytes[start..<end]), as: UTF8.self)
                    for secret in secrets where token.contains(secret) { result.found.insert(secret) }
                    offset = at + 1
                }
            }
        }
    }

    private static func isTokenByte(_ b: UInt8) -> Bool {
        (b >= 0x30 && b <= 0x39) || (b >= 0x41 && b <= 0x5A) || (b >= 0x61 && b <= 0x7A) || b == 0x2D || b == 0x5F
    }
}
