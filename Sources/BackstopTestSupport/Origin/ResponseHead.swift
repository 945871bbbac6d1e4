import NIOCore
import NIOHTTP1

/// Serialises a response head by hand: the origin must be able to send framings (close-delimited, conflicting
/// lengths) that `HTTPResponseEncoder` would "fix".
enum ResponseHead {
    static func encode(status: Int, headers: [(String, String)], allocator: ByteBufferAllocator) -> ByteBuffer {
        var buffer = allocator.buffer(capacity: 128 + headers.count * 32)
        let reason = HTTPResponseStatus(statusCode: status).reasonPhrase
        buffer.writeString("HTTP/1.1 \(status) \(reason)\r\n")
        for (name, value) in headers {
            buffer.writeString("\(name): \(value)\r\n")
        }
        buffer.writeStaticString("\r\n")
        return buffer
    }

    /// 1xx, 204 and 304 responses never carry a body (RFC 9110 §6.4.1), so they get no length framing either.
    static func allowsBody(status: Int) -> Bool {
        !(100..<200).contains(status) && status != 204 && status != 304
    }
}
