import BackstopCore
import NIOCore

/// An upstream URL as the raw HTTP/1.1 path needs it (docs/performance.md#libcurl-as-the-connection): where to
/// connect (`origin`, what connections are pooled by) and the request target, sent byte for byte. Pure.
struct HTTP1URL: Equatable {
    /// `https`: TLS to the upstream.
    var secure: Bool
    /// `scheme://authority`, as the URL spells it.
    var origin: Substring
    var authority: Substring
    /// The path and query as the URL has them (`/` when it has no path), without a fragment.
    var target: Substring

    /// Nil for what the raw path leaves to curl: another scheme, no authority, or user information in it (curl
    /// would turn that into an `Authorization` field).
    init?(_ url: String) {
        guard let schemeEnd = url.utf8.firstIndex(of: UInt8(ascii: ":")) else { return nil }
        let scheme = url[..<schemeEnd]
        if scheme.caseInsensitiveEqualsASCII("https") {
            secure = true
        } else if scheme.caseInsensitiveEqualsASCII("http") {
            secure = false
        } else {
            return nil
        }
        let afterScheme = url[schemeEnd...]
        guard afterScheme.utf8.starts(with: "://".utf8) else { return nil }
        let authorityStart = url.utf8.index(schemeEnd, offsetBy: 3)
        var end = authorityStart
        while end < url.utf8.endIndex {
            let byte = url.utf8[end]
            if byte == UInt8(ascii: "/") || byte == UInt8(ascii: "?") || byte == UInt8(ascii: "#") { break }
            if byte == UInt8(ascii: "@") { return nil }
            end = url.utf8.index(after: end)
        }
        guard end > authorityStart else { return nil }
        authority = url[authorityStart..<end]
        origin = url[..<end]
        let fragment = url[end...].utf8.firstIndex(of: UInt8(ascii: "#")) ?? url.endIndex
        let rest = url[end..<fragment]
        target = rest.isEmpty ? "/" : rest
        if target.utf8.first == UInt8(ascii: "?") { target = "/" + rest }
    }

    /// The `Host` value curl would send for this URL: the authority, without the scheme's default port.
    var hostValue: Substring {
        let defaultPort = secure ? ":443" : ":80"
        guard authority.utf8.count > defaultPort.utf8.count, authority.hasSuffix(defaultPort) else { return authority }
        return authority.dropLast(defaultPort.utf8.count)
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

    /// Appends the head to `buffer`. A field with CR, LF or NUL in its name or value is left out (it would split
    /// the line), and so are `Content-Length` and `Transfer-Encoding` fields: the framing written is the body's.
    static func write(
        _ request: TransportRequest, url: HTTP1URL, framing: HTTP1BodyFraming, into buffer: inout ByteBuffer
    ) {
        buffer.writeString(request.method)
        buffer.writeInteger(UInt8(ascii: " "))
        buffer.writeSubstring(url.target)
        buffer.writeStaticString(" HTTP/1.1\r\n")
        var hasHost = false
        for header in request.headers where header.name.utf8.count == 4 && header.name.caseInsensitiveEquals("host") {
            hasHost = true
            break
        }
        if !hasHost {
            buffer.writeStaticString("Host: ")
            buffer.writeSubstring(url.hostValue)
            buffer.writeStaticString("\r\n")
        }
        for header in request.headers {
            switch header.name.utf8.count {
            case 14 where header.name.caseInsensitiveEquals("content-length"): continue
            case 17 where header.name.caseInsensitiveEquals("transfer-encoding"): continue
            default: break
            }
            let mark = buffer.writerIndex
            let name = buffer.writeString(header.name)
            buffer.writeInteger(UInt8(ascii: ":"))
            var value = 0
            if !header.value.isEmpty {
                buffer.writeInteger(UInt8(ascii: " "))
                value = buffer.writeString(header.value)
            }
            buffer.writeStaticString("\r\n")
            let clean = buffer.withUnsafeReadableBytes { bytes in
                let start = mark - buffer.readerIndex
                return !Self.splits(UnsafeRawBufferPointer(rebasing: bytes[start..<(start + name)]))
                    && !Self.splits(UnsafeRawBufferPointer(rebasing: bytes[(bytes.count - 2 - value)..<(bytes.count - 2)]))
            }
            if !clean { buffer.moveWriterIndex(to: mark) }
        }
        switch framing {
        case .none: break
        case .length(let length):
            buffer.writeStaticString("Content-Length: ")
            buffer.writeString(String(length))
            buffer.writeStaticString("\r\n")
        case .chunked:
            buffer.writeStaticString("Transfer-Encoding: chunked\r\n")
        }
        buffer.writeStaticString("\r\n")
    }

    /// CR, LF or NUL: a byte that would split a field line or cut it short.
    static func splits(_ bytes: UnsafeRawBufferPointer) -> Bool {
        bytes.contains { $0 == 0x0D || $0 == 0x0A || $0 == 0 }
    }
}

extension Substring {
    fileprivate func caseInsensitiveEqualsASCII(_ lowercase: String) -> Bool {
        utf8.count == lowercase.utf8.count
            && zip(utf8, lowercase.utf8).allSatisfy { ($0 >= 0x41 && $0 <= 0x5A ? $0 + 0x20 : $0) == $1 }
    }
}
