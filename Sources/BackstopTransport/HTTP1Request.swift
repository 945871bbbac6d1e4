import BackstopCore
import CCurl
import NIOCore

/// An upstream URL as the raw HTTP/1.1 path needs it (docs/performance.md#libcurl-as-the-connection): where to
/// connect (`origin`, what connections are pooled by) and the request target, sent byte for byte. Pure.
///
/// Offsets into the URL's UTF-8 rather than substrings of it: the value is read for every request on the transport
/// thread, and a substring is a reference to the URL's storage, so each copy of three of them cost three atomic
/// retains and releases (docs/performance.md#reference-counting-per-request). The URL itself stays with the
/// request (`TransportRequest.url`), which every use has at hand.
struct HTTP1URL: Equatable {
    /// `https`: TLS to the upstream.
    var secure: Bool
    /// Where the authority starts (after `scheme://`), where the path starts (the authority's end: `/`, `?`, `#` or
    /// the end) and where the fragment starts (or the URL's length), in UTF-8 bytes.
    private(set) var authorityStart: Int
    private(set) var pathStart: Int
    private(set) var fragmentStart: Int
    /// Where the `Host` value curl would send ends: the authority's end, or before the scheme's default port.
    private(set) var hostEnd: Int
    /// Whether the target starts with a `/` the URL does not have: no path at all, or only a query.
    private(set) var targetNeedsSlash: Bool

    /// Nil for what the raw path leaves to curl: another scheme, no authority, or user information in it (curl
    /// would turn that into an `Authorization` field). `borrowing`: an initialiser's parameters are taken (+1) by
    /// default, which cost the caller a retain of the request's URL.
    init?(_ url: borrowing String) {
        // Offsets found on the contiguous UTF-8 in one pass (this runs for every request).
        let found = url.withUTF8Bytes { bytes -> HTTP1URL? in
            var colon = 0
            while colon < bytes.count, bytes[colon] != UInt8(ascii: ":") { colon += 1 }
            let secure: Bool
            switch colon {
            case 4 where Self.startsWithLetters(bytes, "http"): secure = false
            case 5 where Self.startsWithLetters(bytes, "https"): secure = true
            default: return nil
            }
            guard colon + 2 < bytes.count, bytes[colon + 1] == UInt8(ascii: "/"), bytes[colon + 2] == UInt8(ascii: "/")
            else { return nil }
            let authority = colon + 3
            var path = authority
            while path < bytes.count {
                let byte = bytes[path]
                if byte == UInt8(ascii: "/") || byte == UInt8(ascii: "?") || byte == UInt8(ascii: "#") { break }
                if byte == UInt8(ascii: "@") { return nil }
                path += 1
            }
            guard path > authority else { return nil }
            var fragment = path
            while fragment < bytes.count, bytes[fragment] != UInt8(ascii: "#") { fragment += 1 }
            // The `Host` value drops the scheme's default port, and only when something is left before it.
            let defaultPort: StaticString = secure ? ":443" : ":80"
            let portLength = defaultPort.utf8CodeUnitCount
            var hostEnd = path
            if path - authority > portLength,
                memcmp(bytes.baseAddress! + path - portLength, defaultPort.utf8Start, portLength) == 0
            {
                hostEnd = path - portLength
            }
            return HTTP1URL(
                secure: secure, authorityStart: authority, pathStart: path, fragmentStart: fragment, hostEnd: hostEnd,
                targetNeedsSlash: fragment == path || bytes[path] != UInt8(ascii: "/"))
        }
        guard let found else { return nil }
        self = found
    }

    private init(
        secure: Bool, authorityStart: Int, pathStart: Int, fragmentStart: Int, hostEnd: Int, targetNeedsSlash: Bool
    ) {
        self.secure = secure
        self.targetNeedsSlash = targetNeedsSlash
        self.authorityStart = authorityStart
        self.pathStart = pathStart
        self.fragmentStart = fragmentStart
        self.hostEnd = hostEnd
    }

    /// Whether `bytes` starts with the lowercase letters `word`, in any case.
    private static func startsWithLetters(_ bytes: UnsafeBufferPointer<UInt8>, _ word: StaticString) -> Bool {
        guard bytes.count >= word.utf8CodeUnitCount else { return false }
        for i in 0..<word.utf8CodeUnitCount where bytes[i] | 0x20 != word.utf8Start[i] { return false }
        return true
    }

    /// `scheme://authority` of `url` (the string this value was made from), as the URL spells it.
    func origin(in url: String) -> Substring { Self.slice(url, 0..<pathStart) }

    func authority(in url: String) -> Substring { Self.slice(url, authorityStart..<pathStart) }

    /// The path and query as the URL has them (`/` when it has no path), without a fragment.
    func target(in url: String) -> String {
        (targetNeedsSlash ? "/" : "") + Self.slice(url, pathStart..<fragmentStart)
    }

    /// The `Host` value curl would send for this URL: the authority, without the scheme's default port.
    func hostValue(in url: String) -> Substring { Self.slice(url, authorityStart..<hostEnd) }

    private static func slice(_ url: String, _ range: Range<Int>) -> Substring {
        let utf8 = url.utf8
        let lower = utf8.index(utf8.startIndex, offsetBy: range.lowerBound)
        let upper = utf8.index(lower, offsetBy: range.count)
        return url[lower..<upper]
    }
}

/// How the request body goes on the wire.
enum HTTP1BodyFraming: Equatable {
    case none
    case length(Int)
    /// `Transfer-Encoding: chunked`: a streamed body whose length the client did not declare.
    case chunked
}

/// Writes the head of an upstream HTTP/1.1 request as curl's HTTP layer did (docs/reference/behaviour.md#forwarding):
/// the request line with the target byte for byte, `Host` (the request's own, else the URL's), the request's fields
/// in order, then the body's framing. Pure.
enum HTTP1RequestHead {
    /// How `request`'s body is framed: as `HandleConfiguration.configure` told curl (a bodiless POST sends
    /// `Content-Length: 0`; a HEAD never sends a body).
    static func framing(of request: TransportRequest) -> HTTP1BodyFraming {
        if request.method == "HEAD" { return .none }
        switch request.body {
        case .empty: return HandleConfiguration.hasNoImplicitBody(request.method) ? .none : .length(0)
        case .buffered(let buffer): return .length(buffer.readableBytes)
        case .streaming(let stream): return stream.expectedLength.map(HTTP1BodyFraming.length) ?? .chunked
        }
    }

    /// The head in a buffer of its own, sized for it and `extraCapacity` more bytes (a small body sent with it), so
    /// that writing it never grows the buffer.
    static func buffer(
        _ request: TransportRequest, url: HTTP1URL, framing: HTTP1BodyFraming, extraCapacity: Int = 0,
        allocator: ByteBufferAllocator
    ) -> ByteBuffer {
        request.headers.withFieldBytes { fieldBytes, fields in
            request.url.withUTF8Bytes { urlBytes in
                let size = self.size(method: request.method, fieldBytes, fields, url: url, urlBytes: urlBytes)
                var buffer = allocator.buffer(capacity: size.bytes + extraCapacity)
                write(
                    method: request.method, fieldBytes, fields, url: url, urlBytes: urlBytes, framing: framing,
                    size: size, into: &buffer)
                return buffer
            }
        }
    }

    /// Appends the head to `buffer`. `Content-Length` and `Transfer-Encoding` fields are left out: the framing
    /// written is the body's. The fields are copied as their bytes: `HeaderFields` holds no byte that could split a
    /// line (its names are tokens, its values field-value bytes).
    static func write(
        _ request: TransportRequest, url: HTTP1URL, framing: HTTP1BodyFraming, into buffer: inout ByteBuffer
    ) {
        request.headers.withFieldBytes { fieldBytes, fields in
            request.url.withUTF8Bytes { urlBytes in
                let size = self.size(method: request.method, fieldBytes, fields, url: url, urlBytes: urlBytes)
                write(
                    method: request.method, fieldBytes, fields, url: url, urlBytes: urlBytes, framing: framing,
                    size: size, into: &buffer)
            }
        }
    }

    /// Bytes the head takes at most, and whether the request has its own `Host`.
    private static func size(
        method: String, _ fieldBytes: UnsafeRawBufferPointer, _ fields: UnsafeBufferPointer<HeaderFields.Line>,
        url: HTTP1URL, urlBytes: UnsafeBufferPointer<UInt8>
    ) -> (bytes: Int, hasHost: Bool) {
        var hasHost = false
        var size = method.utf8.count + 1 + url.fragmentStart - url.pathStart + 13
        for field in fields {
            let name = field.name
            size += name.count + field.value.count + 4
            if name.count == 4, !hasHost, HeaderName.equals(UnsafeRawBufferPointer(rebasing: fieldBytes[name]), "host")
            {
                hasHost = true
            }
        }
        if !hasHost { size += url.hostEnd - url.authorityStart + 8 }
        // "Content-Length: " + 19 digits + CRLF, or "Transfer-Encoding: chunked\r\n"; then the blank line.
        return (size + 40, hasHost)
    }

    /// The head is sized first and copied in one pass with `memcpy` (this runs for every request, and a realistic
    /// head is ~2 KB: written piece by piece through `ByteBuffer`'s writers it cost ~25k instructions).
    private static func write(
        method: String, _ fieldBytes: UnsafeRawBufferPointer, _ fields: UnsafeBufferPointer<HeaderFields.Line>,
        url: HTTP1URL, urlBytes: UnsafeBufferPointer<UInt8>, framing: HTTP1BodyFraming,
        size: (bytes: Int, hasHost: Bool), into buffer: inout ByteBuffer
    ) {
        buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: size.bytes) { space in
            var out = HeadWriter(space.baseAddress!)
            out.copy(method)
            out.put(UInt8(ascii: " "))
            if url.targetNeedsSlash { out.put(UInt8(ascii: "/")) }
            out.copy(UnsafeBufferPointer(rebasing: urlBytes[url.pathStart..<url.fragmentStart]))
            out.copy(" HTTP/1.1\r\n")
            if !size.hasHost {
                out.copy("Host: ")
                out.copy(UnsafeBufferPointer(rebasing: urlBytes[url.authorityStart..<url.hostEnd]))
                out.copy("\r\n")
            }
            for field in fields {
                let name = UnsafeRawBufferPointer(rebasing: fieldBytes[field.name])
                switch name.count {
                case 14 where HeaderName.equals(name, "content-length"): continue
                case 17 where HeaderName.equals(name, "transfer-encoding"): continue
                default: break
                }
                out.copy(name)
                out.put(UInt8(ascii: ":"))
                if !field.value.isEmpty {
                    out.put(UInt8(ascii: " "))
                    out.copy(UnsafeRawBufferPointer(rebasing: fieldBytes[field.value]))
                }
                out.put(UInt8(ascii: "\r"))
                out.put(UInt8(ascii: "\n"))
            }
            switch framing {
            case .none: break
            case .length(let length):
                out.copy("Content-Length: ")
                out.decimal(length)
                out.copy("\r\n")
            case .chunked:
                out.copy("Transfer-Encoding: chunked\r\n")
            }
            out.put(UInt8(ascii: "\r"))
            out.put(UInt8(ascii: "\n"))
            return out.count
        }
    }

    /// Copies into memory sized beforehand. A value on the stack rather than local functions capturing a cursor
    /// (captured variables are boxed and checked for exclusivity at run time).
    private struct HeadWriter {
        let base: UnsafeMutableRawPointer
        var count = 0

        init(_ base: UnsafeMutableRawPointer) { self.base = base }

        mutating func put(_ byte: UInt8) {
            base.storeBytes(of: byte, toByteOffset: count, as: UInt8.self)
            count += 1
        }

        /// Reads the string's UTF-8 in place: `withUTF8` on a copy cost a retain and a release per field.
        @inline(__always)
        mutating func copy(_ text: String) {
            let copied: Void? = text.utf8.withContiguousStorageIfAvailable { copy($0) }
            guard copied == nil else { return }
            var text = text
            text.withUTF8 { copy($0) }
        }

        @inline(__always)
        mutating func copy(_ bytes: UnsafeRawBufferPointer) {
            guard let source = bytes.baseAddress, !bytes.isEmpty else { return }
            (base + count).copyMemory(from: source, byteCount: bytes.count)
            count += bytes.count
        }

        mutating func copy(_ text: StaticString) {
            copy(UnsafeBufferPointer(start: text.utf8Start, count: text.utf8CodeUnitCount))
        }

        @inline(__always)
        mutating func copy(_ bytes: UnsafeBufferPointer<UInt8>) { copy(UnsafeRawBufferPointer(bytes)) }

        mutating func decimal(_ value: Int) {
            var digits = 1
            var rest = value / 10
            while rest > 0 {
                digits += 1
                rest /= 10
            }
            var n = value
            for i in stride(from: digits - 1, through: 0, by: -1) {
                base.storeBytes(of: UInt8(ascii: "0") + UInt8(n % 10), toByteOffset: count + i, as: UInt8.self)
                n /= 10
            }
            count += digits
        }
    }
}
