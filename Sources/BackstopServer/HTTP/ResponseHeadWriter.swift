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
    }

    /// `HTTP/1.x NNN Reason\r\n`. The client's own minor version is answered (an HTTP/1.0 client must not be
    /// told 1.1 framing), whatever the upstream spoke.
    static func writeStatusLine(_ buffer: inout ByteBuffer, clientIsHTTP10: Bool, status: Int) {
        buffer.writeStaticString(clientIsHTTP10 ? "HTTP/1.0 " : "HTTP/1.1 ")
        let code = min(max(status, 100), 999)
        if let line = commonStatusLine(code) {
            buffer.writeStaticString(line)
            return
        }
        buffer.writeInteger(UInt8(0x30 + code / 100))
        buffer.writeInteger(UInt8(0x30 + code / 10 % 10))
        buffer.writeInteger(UInt8(0x30 + code % 10))
        buffer.writeInteger(UInt8(0x20))
        buffer.writeString(HTTPResponseStatus(statusCode: code).reasonPhrase)
        buffer.writeStaticString("\r\n")
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

    /// The head of a relayed upstream response.
    static func upstreamHead(
        _ head: UpstreamResponseHead, into buffer: inout ByteBuffer, clientIsHTTP10: Bool, attempts: Int,
        error: ProxyErrorReason?, framing: ResponseFraming, connection: ConnectionField
    ) {
        writeStatusLine(&buffer, clientIsHTTP10: clientIsHTTP10, status: head.status)
        buffer.writeBytes(head.fields)
        buffer.writeStaticString("Via: ")
        if let via = head.via {
            buffer.writeString(via)
            buffer.writeStaticString(", ")
        }
        buffer.writeString(head.version)
        buffer.writeStaticString(" backstop\r\nX-Backstop-Attempts: ")
        writeDecimal(&buffer, attempts)
        buffer.writeStaticString("\r\n")
        if let error {
            buffer.writeStaticString("X-Backstop-Error: ")
            buffer.writeString(error.rawValue)
            buffer.writeStaticString("\r\n")
        }
        switch framing {
        case .contentLength(let length):
            buffer.writeStaticString("Content-Length: ")
            writeDecimal(&buffer, length)
            buffer.writeStaticString("\r\n")
        case .chunked:
            buffer.writeStaticString("Transfer-Encoding: chunked\r\n")
        case .bodyless:
            if let length = head.contentLength {
                buffer.writeStaticString("Content-Length: ")
                writeDecimal(&buffer, length)
                buffer.writeStaticString("\r\n")
            }
        case .closeDelimited:
            break
        }
        writeConnection(&buffer, connection)
        buffer.writeStaticString("\r\n")
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
        writeConnection(&buffer, connection)
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
        writeConnection(&buffer, connection)
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

    private static func writeConnection(_ buffer: inout ByteBuffer, _ connection: ConnectionField) {
        switch connection {
        case .none: break
        case .close: buffer.writeStaticString("Connection: close\r\n")
        case .keepAlive: buffer.writeStaticString("Connection: keep-alive\r\n")
        }
    }

    /// Digits formatted on the stack and written with one copy: no `String` per number (two per response head),
    /// and one buffer write rather than one per digit.
    static func writeDecimal(_ buffer: inout ByteBuffer, _ value: Int) {
        guard value >= 0 else {
            buffer.writeString(String(value))
            return
        }
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 20) { digits in
            var start = digits.count
            var rest = value
            repeat {
                start -= 1
                digits[start] = 0x30 + UInt8(rest % 10)
                rest /= 10
            } while rest > 0
            buffer.writeBytes(UnsafeRawBufferPointer(rebasing: UnsafeMutableRawBufferPointer(digits)[start...]))
        }
    }
}
