import BackstopCore
import NIOCore
import NIOHTTP1

/// Writes HTTP/1.x response heads and chunk framing as bytes. The proxy handler has no NIO response encoder:
/// upstream fields arrive as bytes (`UpstreamResponseHead.fields`) and are copied once into the client's head,
/// instead of a round trip through `HTTPHeaders`, the encoder and its header validator on every response.
enum ResponseHeadWriter {
    /// What the response says about the client connection.
    enum ConnectionField {
        case none, close, keepAlive

        /// The field's line, empty for `.none`.
        var line: StaticString {
            switch self {
            case .none: ""
            case .close: "Connection: close\r\n"
            case .keepAlive: "Connection: keep-alive\r\n"
            }
        }
    }

    /// `HTTP/1.x NNN Reason\r\n`. The client's own minor version is answered (an HTTP/1.0 client must not be
    /// told 1.1 framing), whatever the upstream spoke.
    static func writeStatusLine(_ buffer: inout ByteBuffer, clientIsHTTP10: Bool, status: Int) {
        buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: maxStatusLine) { memory in
            var out = HeadBytes(memory)
            appendStatusLine(&out, clientIsHTTP10: clientIsHTTP10, status: status)
            return out.count
        }
    }

    /// At most how long a status line is: `HTTP/1.x NNN ` (13), NIO's longest reason phrase (31), CRLF (2), with room
    /// to spare (the tests write every code from 100 to 999).
    static let maxStatusLine = 64

    /// The status line, into room made for it. An upstream's status outside 100...999 is clamped, never written as is.
    private static func appendStatusLine(_ out: inout HeadBytes, clientIsHTTP10: Bool, status: Int) {
        out.append(clientIsHTTP10 ? "HTTP/1.0 " : "HTTP/1.1 ")
        let code = min(max(status, 100), 999)
        if let line = commonStatusLine(code) {
            out.append(line)
            return
        }
        out.append(UInt8(0x30 + code / 100))
        out.append(UInt8(0x30 + code / 10 % 10))
        out.append(UInt8(0x30 + code % 10))
        out.append(UInt8(0x20))
        out.append(utf8Of: HTTPResponseStatus(statusCode: code).reasonPhrase)
        out.append("\r\n")
    }

    /// The rest of the status line for the most frequent codes, with NIO's reason phrases (the test suite holds them
    /// to `HTTPResponseStatus`): building the phrase through `HTTPResponseStatus` costs more than the rest of the
    /// head.
    static func commonStatusLine(_ code: Int) -> StaticString? {
        switch code {
        case 200: "200 OK\r\n"
        case 201: "201 Created\r\n"
        case 204: "204 No Content\r\n"
        case 206: "206 Partial Content\r\n"
        case 301: "301 Moved Permanently\r\n"
        case 302: "302 Found\r\n"
        case 304: "304 Not Modified\r\n"
        case 400: "400 Bad Request\r\n"
        case 401: "401 Unauthorized\r\n"
        case 403: "403 Forbidden\r\n"
        case 404: "404 Not Found\r\n"
        case 429: "429 Too Many Requests\r\n"
        case 500: "500 Internal Server Error\r\n"
        case 502: "502 Bad Gateway\r\n"
        case 503: "503 Service Unavailable\r\n"
        case 504: "504 Gateway Timeout\r\n"
        default: nil
        }
    }

    /// Room for what `upstreamHead` writes besides the upstream's fields, `Via` values, version and error name, each
    /// piece at its longest: the status line 64, `Via` and the attempts 58, the error's line 20, `Content-Length` 38,
    /// `Connection` 24, the blank line 2 (each decimal counted as 20 bytes): 206, and room for a typical version and
    /// error name, which the capacity of a head's buffer is taken from.
    static let upstreamHeadRoom = 240

    /// The head of a relayed upstream response. Written with one capacity check and plain copies
    /// (`HeadBytes`): it runs for every response, and each `ByteBuffer` write of its ten or so pieces checks
    /// uniqueness and capacity again (~100 instructions each, docs/performance.md#smaller-per-request-costs).
    static func upstreamHead(
        _ head: UpstreamResponseHead, into buffer: inout ByteBuffer, clientIsHTTP10: Bool, attempts: Int,
        error: ProxyErrorReason?, framing: ResponseFraming, connection: ConnectionField
    ) {
        let fields = head.fields
        let via = head.via
        let version = head.version
        let size =
            fields.count + (via?.utf8.count ?? 0) + version.utf8.count + (error?.rawValue.utf8.count ?? 0)
            + upstreamHeadRoom
        buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: size) { memory in
            var out = HeadBytes(memory)
            appendStatusLine(&out, clientIsHTTP10: clientIsHTTP10, status: head.status)
            out.append(fields)
            out.append("Via: ")
            if let via {
                out.append(utf8Of: via)
                out.append(", ")
            }
            out.append(utf8Of: version)
            out.append(" backstop\r\nX-Backstop-Attempts: ")
            out.appendDecimal(attempts)
            out.append("\r\n")
            if let error {
                out.append("X-Backstop-Error: ")
                out.append(utf8Of: error.rawValue)
                out.append("\r\n")
            }
            switch framing {
            case .contentLength(let length):
                out.append("Content-Length: ")
                out.appendDecimal(length)
                out.append("\r\n")
            case .chunked:
                out.append("Transfer-Encoding: chunked\r\n")
            case .bodyless:
                // A HEAD's or a 304's length describes the representation; a 204 or 1xx must not carry one (RFC 9110
                // §8.6), whatever the upstream sent.
                if let length = head.contentLength, head.status != 204, head.status >= 200 {
                    out.append("Content-Length: ")
                    out.appendDecimal(length)
                    out.append("\r\n")
                }
            case .closeDelimited:
                break
            }
            out.append(connection.line)
            out.append("\r\n")
            return out.count
        }
    }

    /// A response Backstop makes itself (docs/reference/errors.md): one-line `text/plain` body. `omitBody` is for a
    /// `HEAD` request: the same head (Content-Length included, RFC 9110 §9.3.2) and no body bytes, which the client
    /// would otherwise read as the start of its next response.
    /// `attempts`: how many upstream attempts were made before Backstop gave up (`X-Backstop-Attempts`), nil when
    /// none was.
    static func localError(
        _ reason: ProxyErrorReason, into buffer: inout ByteBuffer, clientIsHTTP10: Bool, connection: ConnectionField,
        omitBody: Bool = false, attempts: Int? = nil, message: String? = nil, retryAfter: Int? = nil
    ) {
        let message = message ?? reason.message
        writeStatusLine(&buffer, clientIsHTTP10: clientIsHTTP10, status: reason.status)
        buffer.writeStaticString("Content-Type: text/plain; charset=utf-8\r\nContent-Length: ")
        writeDecimal(&buffer, message.utf8.count + 1)
        buffer.writeStaticString("\r\nX-Backstop-Error: ")
        buffer.writeString(reason.rawValue)
        buffer.writeStaticString("\r\n")
        if reason == .proxyAuthRequired {
            // RFC 9110 §15.5.8: a 407 carries the challenge the client answers with `Proxy-Authorization`.
            buffer.writeString(ClientAccessPolicy.challenge.name)
            buffer.writeStaticString(": ")
            buffer.writeString(ClientAccessPolicy.challenge.value)
            buffer.writeStaticString("\r\n")
        }
        if let retryAfter {
            buffer.writeStaticString("Retry-After: ")
            writeDecimal(&buffer, retryAfter)
            buffer.writeStaticString("\r\n")
        }
        if let attempts {
            buffer.writeStaticString("X-Backstop-Attempts: ")
            writeDecimal(&buffer, attempts)
            buffer.writeStaticString("\r\n")
        }
        buffer.writeStaticString(connection.line)
        buffer.writeStaticString("\r\n")
        if omitBody { return }
        buffer.writeString(message)
        buffer.writeStaticString("\n")
    }

    /// `202 Accepted` for a stored queued request (docs/reference/behaviour.md#queued-delivery): its delivery id,
    /// no body.
    static func accepted(
        delivery: String, into buffer: inout ByteBuffer, clientIsHTTP10: Bool, connection: ConnectionField
    ) {
        writeStatusLine(&buffer, clientIsHTTP10: clientIsHTTP10, status: 202)
        buffer.writeStaticString("Content-Length: 0\r\nX-Backstop-Delivery: ")
        buffer.writeString(delivery)
        buffer.writeStaticString("\r\n")
        buffer.writeStaticString(connection.line)
        buffer.writeStaticString("\r\n")
    }

    /// The line before a chunk's data (`\r\n` ending the previous chunk, if any, then the size in hex).
    static func chunkPrefix(_ buffer: inout ByteBuffer, size: Int, first: Bool) {
        if !first { buffer.writeStaticString("\r\n") }
        buffer.writeString(String(size, radix: 16))
        buffer.writeStaticString("\r\n")
    }

    /// The end of a chunked body: the last chunk's CRLF, the zero-size chunk and the empty trailer section.
    static func chunkedEnd(_ buffer: inout ByteBuffer, afterChunks: Bool) {
        buffer.writeStaticString(afterChunks ? "\r\n0\r\n\r\n" : "0\r\n\r\n")
    }

    /// Digits written with one copy: no `String` per number, and one buffer write rather than one per digit.
    static func writeDecimal(_ buffer: inout ByteBuffer, _ value: Int) {
        buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: HeadBytes.maxDecimal) { memory in
            var out = HeadBytes(memory)
            out.appendDecimal(value)
            return out.count
        }
    }
}

/// Bytes appended to memory the caller has made room for (`ByteBuffer.writeWithUnsafeMutableBytes`): a head's
/// pieces copied with no capacity or uniqueness check each. Every append traps rather than write past the memory,
/// so a wrong size estimate is a crash, never an overrun.
struct HeadBytes {
    /// Room enough for any `Int` in decimal, its sign included.
    static let maxDecimal = 20

    private let memory: UnsafeMutableRawBufferPointer
    private(set) var count = 0

    init(_ memory: UnsafeMutableRawBufferPointer) { self.memory = memory }

    @inline(__always)
    mutating func append(_ bytes: UnsafeRawBufferPointer) {
        precondition(bytes.count <= memory.count - count, "a head outgrew the room made for it")
        guard let source = bytes.baseAddress, let target = memory.baseAddress else { return }
        (target + count).copyMemory(from: source, byteCount: bytes.count)
        count += bytes.count
    }

    @inline(__always)
    mutating func append(_ text: StaticString) {
        append(UnsafeRawBufferPointer(start: text.utf8Start, count: text.utf8CodeUnitCount))
    }

    mutating func append(_ bytes: [UInt8]) {
        bytes.withUnsafeBytes { append($0) }
    }

    /// A string's UTF-8 (labelled: an unlabelled `String` overload would take every literal from the `StaticString`
    /// one, as the type checker prefers a literal's default type).
    mutating func append(utf8Of text: String) {
        // In place (a `String` from Swift code is contiguous UTF-8); byte by byte only for a bridged one.
        let copied: Void? = text.utf8.withContiguousStorageIfAvailable { append(UnsafeRawBufferPointer($0)) }
        if copied == nil { for byte in text.utf8 { append(byte) } }
    }

    @inline(__always)
    mutating func append(_ byte: UInt8) {
        precondition(count < memory.count, "a head outgrew the room made for it")
        memory[count] = byte
        count += 1
    }

    mutating func appendDecimal(_ value: Int) {
        precondition(memory.count - count >= Self.maxDecimal, "a head outgrew the room made for it")
        guard let target = memory.baseAddress else { return }
        if value < 0 {
            target.storeBytes(of: UInt8(ascii: "-"), toByteOffset: count, as: UInt8.self)
            count += 1
        }
        // The magnitude as unsigned, so `Int.min` has one too; its digits are counted, then filled from the last.
        var rest = value.magnitude
        var digits = 1
        var probe = rest
        while probe >= 10 {
            probe /= 10
            digits += 1
        }
        var at = count + digits
        while at > count {
            at -= 1
            target.storeBytes(of: 0x30 + UInt8(rest % 10), toByteOffset: at, as: UInt8.self)
            rest /= 10
        }
        count += digits
    }
}
