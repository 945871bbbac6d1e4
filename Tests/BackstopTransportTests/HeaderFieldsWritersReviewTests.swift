import BackstopCore
import BackstopTestSupport
import CCurl
import NIOCore
import Testing

@testable import BackstopTransport

/// An adversarial review of the two writers that copy `HeaderFields` without looking at their bytes again
/// (docs/performance.md#header-fields-as-bytes): what they write from a hostile but valid client head, rewritten
/// with a credential, must read back as exactly those fields, one line each.
@Suite("Header field writers: adversarial review")
struct HeaderFieldsWritersReviewTests {
    /// A client head with every kind of value a field may hold: empty, whitespace inside and after, obs-text and
    /// invalid UTF-8, colons, commas, quotes, a long token; framing and hop-by-hop fields in odd case.
    static let clientHead: [UInt8] =
        Array(
            ("POST /p HTTP/1.1\r\nhOsT: client.example\r\nX-Empty:\r\nX-Ws:\t a \t b \t\r\nX-Colon: a:b::c\r\n"
                + "cOnNeCtIoN: x-gone\r\nX-Gone: 1\r\nCookie: a=\"b,c\"; d=e\r\ncOnTeNt-LeNgTh: 3\r\nX-Obs: ").utf8)
        + [0x80, 0xFF, 0xC3, 0xA9, 0xC3] + Array("\r\nX-Long: \(String(repeating: "t", count: 5000))\r\n\r\nabc".utf8)

    static func clientFields() throws -> HeaderFields {
        guard case .head(let head) = RequestHeads.read(clientHead).event else { throw ReviewError.notAHead }
        return head.fields
    }

    enum ReviewError: Error { case notAHead }

    static func raw(_ fields: HeaderFields) -> [[UInt8]] {
        fields.withFieldBytes { bytes, lines in
            lines.map { Array(bytes[$0.name]) + [UInt8(ascii: ":")] + Array(bytes[$0.value]) }
        }
    }

    static func upstream() throws -> HeaderFields {
        HeaderRewriter.upstreamRequestHeaders(
            try clientFields(), upstreamHost: "up:8080",
            injecting: HeaderRewriter.InjectedHeader(name: "Authorization", value: "Bearer a\tb", replacesClient: true))
    }

    /// The raw head reads back, through the proxy's own strict reader, as the same fields byte for byte (the body's
    /// framing added), with no line more.
    @Test func theRawHeadReadsBackAsTheSameFields() throws {
        let fields = try Self.upstream()
        let request = TransportRequest(
            url: "http://up:8080/p", method: "POST", headers: fields,
            body: .buffered(ByteBufferAllocator().buffer(string: "abc")))
        var buffer = ByteBufferAllocator().buffer(capacity: 0)
        HTTP1RequestHead.write(
            request, url: try #require(HTTP1URL(request.url)), framing: HTTP1RequestHead.framing(of: request),
            into: &buffer)
        let head = Array(buffer.readableBytesView)
        let read = RequestHeads.read(head)
        guard case .head(let written) = read.event else {
            Issue.record("the written head does not read back: \(read.event)")
            return
        }
        #expect(read.consumed == head.count)
        #expect(Self.raw(written.fields) == Self.raw(fields) + [Array("Content-Length:3".utf8)])
        #expect(written.fields.count == fields.count + 1)
        #expect(head.split(separator: 0x0A).count == fields.count + 3)
        #expect(!written.fields.contains(name: "x-gone") && !written.fields.contains(name: "connection"))
    }

    /// curl's list has a line per field, each the field's bytes (`Name;` for an empty value), none holding a byte
    /// that would cut or split it.
    @Test func curlsListHoldsTheSameFieldsLineByLine() throws {
        let fields = try Self.upstream()
        let list = CurlHeaderList(fields)
        var lines: [[UInt8]] = []
        var node: UnsafeMutablePointer<curl_slist>? = list.first
        while let current = node {
            let line = UnsafeRawPointer(current.pointee.data!).assumingMemoryBound(to: UInt8.self)
            var count = 0
            while line[count] != 0 { count += 1 }
            lines.append(Array(UnsafeBufferPointer(start: line, count: count)))
            node = current.pointee.next
        }
        let expected = fields.withFieldBytes { bytes, fieldLines in
            fieldLines.map { line -> [UInt8] in
                line.value.isEmpty
                    ? Array(bytes[line.name]) + Array(";".utf8)
                    : Array(bytes[line.name]) + Array(": ".utf8) + Array(bytes[line.value])
            }
        }
        #expect(lines == expected + [Array("Expect:".utf8), Array("Accept:".utf8)])
        #expect(lines.allSatisfy { !$0.contains(0x0D) && !$0.contains(0x0A) })
    }

    /// A framing field that reaches the raw writer in any case (appended after the rewrite) is not written: the
    /// body's framing is the only one.
    @Test func framingFieldsInAnyCaseAreNotWritten() {
        let request = TransportRequest(
            url: "http://h/", method: "POST",
            headers: [(name: "cOnTeNt-LeNgTh", value: "99"), (name: "TRANSFER-encoding", value: "chunked")],
            body: .buffered(ByteBufferAllocator().buffer(string: "hi")))
        var buffer = ByteBufferAllocator().buffer(capacity: 0)
        HTTP1RequestHead.write(
            request, url: HTTP1URL(request.url)!, framing: HTTP1RequestHead.framing(of: request), into: &buffer)
        #expect(String(buffer: buffer) == "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\n")
    }
}
