#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// What a header name means to the proxy, decided on its bytes without allocating (this runs for every field of
/// every request and response).
public enum HeaderName: Equatable {
    /// RFC 9110 §7.6.1 (`Connection`, `Keep-Alive`, `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade`) plus
    /// `Proxy-Connection`, `Proxy-Authenticate` and `Proxy-Authorization`, which are aimed at this proxy.
    case hopByHop
    case host, contentLength, expect, via
    /// `X-Backstop-Error`, `X-Backstop-Attempts`: only Backstop writes them.
    case backstopOwn
    case retryAfter, rateLimitReset
    /// `Location`, `Content-Location`: rewritten when they point at the upstream's own URL.
    case location
    case other

    static func classify(_ name: UnsafeRawBufferPointer) -> HeaderName {
        func named(_ candidate: StaticString) -> Bool { equals(name, candidate) }
        switch name.count {
        case 2: return named("te") ? .hopByHop : .other
        case 3: return named("via") ? .via : .other
        case 4: return named("host") ? .host : .other
        case 6: return named("expect") ? .expect : .other
        case 7: return named("upgrade") || named("trailer") ? .hopByHop : .other
        case 8: return named("location") ? .location : .other
        case 10: return named("connection") || named("keep-alive") ? .hopByHop : .other
        case 11: return named("retry-after") ? .retryAfter : .other
        case 14: return named("content-length") ? .contentLength : .other
        case 16:
            if named("proxy-connection") { return .hopByHop }
            if named("content-location") { return .location }
            return named("x-backstop-error") ? .backstopOwn : .other
        case 17:
            if named("transfer-encoding") { return .hopByHop }
            return named("x-ratelimit-reset") ? .rateLimitReset : .other
        case 18: return named("proxy-authenticate") ? .hopByHop : .other
        case 19:
            if named("proxy-authorization") { return .hopByHop }
            return named("x-backstop-attempts") ? .backstopOwn : .other
        default: return .other
        }
    }

    static func classify(_ name: String) -> HeaderName {
        withBytes(of: name) { classify($0) }
    }

    /// `String.withUTF8Bytes` as raw bytes, which the name rules take.
    @inline(__always)
    static func withBytes<R>(of text: String, _ body: (UnsafeRawBufferPointer) -> R) -> R {
        text.withUTF8Bytes { body(UnsafeRawBufferPointer($0)) }
    }

    /// The name as a `String`: one of the names apps send most, spelled exactly as they are (case included: a
    /// name is forwarded as the client spelled it), is a string literal; any other is decoded. Decoding and
    /// validating a name cost ~150 instructions, comparing it with the two or three spellings of its length ~20
    /// (docs/performance.md#realistic-requests); this runs for every field of every request.
    static func string(_ name: UnsafeRawBufferPointer) -> String {
        func spelled(_ candidate: StaticString) -> Bool {
            memcmp(name.baseAddress!, candidate.utf8Start, name.count) == 0
        }
        switch name.count {
        case 4: if spelled("Host") { return "Host" }
        case 5: if spelled("Range") { return "Range" }
        case 6:
            if spelled("Accept") { return "Accept" }
            if spelled("Cookie") { return "Cookie" }
            if spelled("Origin") { return "Origin" }
        case 7: if spelled("Referer") { return "Referer" }
        case 10:
            if spelled("User-Agent") { return "User-Agent" }
            if spelled("Connection") { return "Connection" }
        case 11: if spelled("traceparent") { return "traceparent" }
        case 12:
            if spelled("Content-Type") { return "Content-Type" }
            if spelled("X-Request-Id") { return "X-Request-Id" }
            if spelled("X-Request-ID") { return "X-Request-ID" }
        case 13:
            if spelled("Authorization") { return "Authorization" }
            if spelled("Cache-Control") { return "Cache-Control" }
            if spelled("If-None-Match") { return "If-None-Match" }
        case 14: if spelled("Content-Length") { return "Content-Length" }
        case 15:
            if spelled("Accept-Encoding") { return "Accept-Encoding" }
            if spelled("Accept-Language") { return "Accept-Language" }
            if spelled("X-Forwarded-For") { return "X-Forwarded-For" }
        default: break
        }
        return String(decoding: name, as: UTF8.self)
    }

    /// ASCII case-insensitive equality with a lowercase name.
    public static func equals(_ bytes: UnsafeRawBufferPointer, _ lowercase: StaticString) -> Bool {
        let count = lowercase.utf8CodeUnitCount
        guard bytes.count == count else { return false }
        let expected = UnsafeRawPointer(lowercase.utf8Start)
        guard count >= 8, let base = bytes.baseAddress else {
            for i in 0..<count {
                let b = bytes[i]
                if (b >= 65 && b <= 90 ? b + 32 : b) != expected.load(fromByteOffset: i, as: UInt8.self) {
                    return false
                }
            }
            return true
        }
        // Eight bytes at a time, the last word overlapping the one before it: byte by byte a 10-byte name cost ~125
        // instructions, and names are compared for every field of every request and response
        // (docs/performance.md#parsing-heads).
        var i = 0
        while i < count - 8 {
            if lowercased(base.loadUnaligned(fromByteOffset: i, as: UInt64.self))
                != expected.loadUnaligned(fromByteOffset: i, as: UInt64.self)
            {
                return false
            }
            i += 8
        }
        return lowercased(base.loadUnaligned(fromByteOffset: count - 8, as: UInt64.self))
            == expected.loadUnaligned(fromByteOffset: count - 8, as: UInt64.self)
    }

    /// Each of the eight bytes of `word` ASCII-lowercased, as `b >= 65 && b <= 90 ? b + 32 : b` would: a byte is an
    /// upper-case letter when its low seven bits are at least 0x41 (adding 0x3F sets its high bit) and not above
    /// 0x5A (adding 0x25 does not), and its own high bit is clear. No sum carries into the next byte (0x7F + 0x3F is
    /// below 0x100); each letter's mark, 0x80, shifted right twice is the 0x20 that lowercases it.
    @inline(__always)
    static func lowercased(_ word: UInt64) -> UInt64 {
        let highBits: UInt64 = 0x8080_8080_8080_8080
        let low7 = word & ~highBits
        let atLeastA = low7 &+ 0x3F3F_3F3F_3F3F_3F3F
        let aboveZ = low7 &+ 0x2525_2525_2525_2525
        let upper = atLeastA & ~aboveZ & ~word & highBits
        return word | upper >> 2
    }

    /// Adds the comma-separated tokens of a `Connection` value, trimmed and lowercased, that name a field still to
    /// be removed: `close` names none, and hop-by-hop fields (`keep-alive`, `upgrade`…) go anyway. A set: a value
    /// can list thousands, each looked up once per field (an array made both quadratic).
    public static func appendTokens(of value: UnsafeRawBufferPointer, to names: inout Set<String>) {
        var start = 0
        while start <= value.count {
            var end = start
            while end < value.count, value[end] != UInt8(ascii: ",") { end += 1 }
            var from = start
            var to = end
            while from < to, value[from] == 0x20 || value[from] == 0x09 { from += 1 }
            while to > from, value[to - 1] == 0x20 || value[to - 1] == 0x09 { to -= 1 }
            let raw = UnsafeRawBufferPointer(rebasing: value[from..<to])
            if from < to, classify(raw) != .hopByHop, !equals(raw, "close") {
                names.insert(String(asciiLowercasing: value[from..<to]))
            }
            start = end + 1
        }
    }
}

extension StringProtocol {
    /// Trims the given ASCII characters from both ends.
    func trimmingCharacters(in set: String) -> String {
        var s = self[...]
        while let f = s.first, set.contains(f) { s = s.dropFirst() }
        while let l = s.last, set.contains(l) { s = s.dropLast() }
        return String(s)
    }
}

extension String {
    /// `bytes` as a string, ASCII letters lowercased (names and hosts are ASCII: no Unicode case mapping).
    init(asciiLowercasing bytes: some Collection<UInt8>) {
        self.init(decoding: bytes.map { $0 >= 65 && $0 <= 90 ? $0 + 32 : $0 }, as: UTF8.self)
    }
}

extension StringProtocol {
    /// Lowercases ASCII letters only: header names are ASCII tokens, and this skips Unicode case mapping.
    public func asciiLowercased() -> String {
        var bytes = Array(utf8)
        var changed = false
        for i in bytes.indices where bytes[i] >= 65 && bytes[i] <= 90 {
            bytes[i] += 32
            changed = true
        }
        return changed ? String(decoding: bytes, as: UTF8.self) : String(self)
    }
}

extension String {
    /// ASCII case-insensitive comparison (header names are ASCII).
    @inlinable
    public func caseInsensitiveEquals(_ other: String) -> Bool {
        // O(1) for native strings, and most names compared differ in length.
        guard utf8.count == other.utf8.count else { return false }
        // The bytes compared in place (native strings are contiguous): through `UTF8View`'s iterator each byte cost
        // ~100 instructions.
        let compared = utf8.withContiguousStorageIfAvailable { a in
            other.utf8.withContiguousStorageIfAvailable { b in Self.asciiCaseInsensitiveEquals(a, b) }
        }
        if case .some(.some(let equal)) = compared { return equal }
        var a = self.utf8.makeIterator()
        var b = other.utf8.makeIterator()
        while true {
            let x = a.next()
            let y = b.next()
            if x == nil && y == nil { return true }
            guard let x, let y else { return false }
            if x == y { continue }
            let lx = (x >= 65 && x <= 90) ? x + 32 : x
            let ly = (y >= 65 && y <= 90) ? y + 32 : y
            if lx != ly { return false }
        }
    }

    /// Byte buffers of the same length equal but for the case of ASCII letters.
    @inlinable
    static func asciiCaseInsensitiveEquals(_ a: UnsafeBufferPointer<UInt8>, _ b: UnsafeBufferPointer<UInt8>) -> Bool {
        guard a.count == b.count else { return false }
        for i in 0..<a.count {
            let x = a[i]
            let y = b[i]
            if x == y { continue }
            let lx = (x >= 65 && x <= 90) ? x + 32 : x
            let ly = (y >= 65 && y <= 90) ? y + 32 : y
            if lx != ly { return false }
        }
        return true
    }
}
