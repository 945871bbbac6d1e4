import NIOCore
import NIOHTTP1
import Testing

@testable import BackstopServer

/// The byte-level head writer against NIO's own vocabulary: the status lines it shortcuts and the numbers it writes
/// digit by digit.
@Suite("Response head writer")
struct ResponseHeadWriterTests {
    @Test("every status line, shortcut or not, is the client's version, the code and NIO's reason phrase")
    func statusLines() {
        var shortcuts = 0
        for code in 100...999 {
            if ResponseHeadWriter.commonStatusLine(code) != nil { shortcuts += 1 }
            for http10 in [false, true] {
                var buffer = ByteBuffer()
                ResponseHeadWriter.writeStatusLine(&buffer, clientIsHTTP10: http10, status: code)
                let phrase = HTTPResponseStatus(statusCode: code).reasonPhrase
                #expect(
                    buffer.readString(length: buffer.readableBytes) == "HTTP/1.\(http10 ? 0 : 1) \(code) \(phrase)\r\n")
            }
        }
        #expect(shortcuts == 16)
    }

    @Test("status codes outside 100...999 are clamped, as before the shortcut")
    func clampedStatus() {
        var buffer = ByteBuffer()
        ResponseHeadWriter.writeStatusLine(&buffer, clientIsHTTP10: false, status: 42)
        #expect(buffer.readString(length: buffer.readableBytes) == "HTTP/1.1 100 Continue\r\n")
    }

    @Test(
        "decimals are written as Swift prints them",
        arguments: [0, 7, 9, 10, 99, 100, 101, 65_536, 1_000_000, Int.max, -1, Int.min])
    func decimals(value: Int) {
        var buffer = ByteBuffer(string: "x")
        ResponseHeadWriter.writeDecimal(&buffer, value)
        #expect(buffer.readString(length: buffer.readableBytes) == "x\(value)")
    }
}
