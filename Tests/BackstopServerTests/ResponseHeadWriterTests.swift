import BackstopCore
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

    /// The head `upstreamHead` must write, built the slow way from strings.
    private static func expectedHead(
        status: Int, version: String, fields: String, via: String?, contentLength: Int?, http10: Bool, attempts: Int,
        error: ProxyErrorReason?, framing: ResponseFraming, connection: ResponseHeadWriter.ConnectionField
    ) -> String {
        let code = min(max(status, 100), 999)
        var head = "HTTP/1.\(http10 ? 0 : 1) \(code) \(HTTPResponseStatus(statusCode: code).reasonPhrase)\r\n" + fields
        head += "Via: \(via.map { "\($0), " } ?? "")\(version) backstop\r\nX-Backstop-Attempts: \(attempts)\r\n"
        if let error { head += "X-Backstop-Error: \(error.rawValue)\r\n" }
        switch framing {
        case .contentLength(let length): head += "Content-Length: \(length)\r\n"
        case .chunked: head += "Transfer-Encoding: chunked\r\n"
        // A HEAD's or 304's length is the representation's; a 204 or 1xx never carries one.
        case .bodyless:
            if let contentLength, status >= 200, status != 204 { head += "Content-Length: \(contentLength)\r\n" }
        case .closeDelimited: break
        }
        switch connection {
        case .none: break
        case .close: head += "Connection: close\r\n"
        case .keepAlive: head += "Connection: keep-alive\r\n"
        }
        return head + "\r\n"
    }

    @Test("a 204 or 1xx never carries the upstream's Content-Length; a 304 keeps it", arguments: [204, 101, 304])
    func bodylessLength(status: Int) {
        var buffer = ByteBuffer()
        ResponseHeadWriter.upstreamHead(
            UpstreamResponseHead(status: status, contentLength: 5), into: &buffer, clientIsHTTP10: false, attempts: 1,
            error: nil, framing: .bodyless, connection: .none)
        let head = buffer.readString(length: buffer.readableBytes) ?? ""
        #expect(head.contains("\r\nContent-Length: 5\r\n") == (status == 304), "\(head)")
    }

    @Test(
        "a relayed head is the status line, the upstream's fields and Backstop's own, at every size and framing",
        arguments: [200, 204, 304, 302, 404, 418, 503, 599, 42, 101])
    func upstreamHeads(status: Int) {
        let fieldSets = ["", "Server: origin\r\n", "X-Big: \(String(repeating: "v", count: 5_000))\r\nA: b\r\n"]
        let framings: [ResponseFraming] = [
            .contentLength(0), .contentLength(Int.max), .chunked, .bodyless, .closeDelimited,
        ]
        let connections: [ResponseHeadWriter.ConnectionField] = [.none, .close, .keepAlive]
        var written = 0
        for fields in fieldSets {
            for via in [nil, "1.0 a", String(repeating: "1.1 hop, ", count: 200) + "2 last"] {
                for (version, error) in [
                    ("1.1", nil), ("2", ProxyErrorReason.upstreamUnreachable),
                    (String(repeating: "9", count: 300), ProxyErrorReason.badUpstreamResponse),
                ] as [(String, ProxyErrorReason?)] {
                    for framing in framings {
                        for connection in connections {
                            let head = UpstreamResponseHead(
                                status: status, version: version, fields: Array(fields.utf8), contentLength: 17,
                                via: via)
                            // An empty buffer, and one with little room after bytes already in it: the writer
                            // makes the room it needs either way.
                            for start in [ByteBuffer(), ByteBuffer(string: "x")] {
                                var buffer = start
                                ResponseHeadWriter.upstreamHead(
                                    head, into: &buffer, clientIsHTTP10: status == 404, attempts: 3, error: error,
                                    framing: framing, connection: connection)
                                let expected = Self.expectedHead(
                                    status: status, version: version, fields: fields, via: via, contentLength: 17,
                                    http10: status == 404, attempts: 3, error: error, framing: framing,
                                    connection: connection)
                                #expect(
                                    buffer.readString(length: buffer.readableBytes)
                                        == String(decoding: start.readableBytesView, as: UTF8.self) + expected)
                                written += 1
                            }
                        }
                    }
                }
            }
        }
        #expect(written == 3 * 3 * 3 * 5 * 3 * 2)
    }
}
