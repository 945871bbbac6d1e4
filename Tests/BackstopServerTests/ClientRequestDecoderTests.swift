import BackstopCore
import NIOCore
import NIOEmbedded
import NIOHTTP1
import Testing

@testable import BackstopServer

/// The client request decoder against NIO's `HTTPRequestDecoder` (llhttp), the decoder it replaced, on hostile
/// heads and bodies: both are fed the same bytes in `EmbeddedChannel`s and must emit the same parts, or refuse the
/// same bytes. Where Backstop's decoder is deliberately stricter (docs/reference/behaviour.md#request-syntax), the
/// case says so: it refuses, after emitting no more than llhttp did.
@Suite("Client request decoder")
struct ClientRequestDecoderTests {
    /// What a decoder made of some bytes: its parts (body bytes joined per request), whether it refused them, and
    /// what it handed on when it left the pipeline.
    struct Trace: Equatable, CustomStringConvertible {
        enum Part: Equatable {
            case head(method: String, uri: String, version: String, fields: [String])
            case body([UInt8])
            case end(trailers: [String]?)
        }
        var parts: [Part] = []
        /// Refused: `.headerOverflow` (answered 431) or any other error (400), which are not told apart.
        var refused: HTTPParserError?
        var leftOver: [UInt8] = []

        var description: String {
            let parts = parts.map { part -> String in
                switch part {
                case .head(let method, let uri, let version, let fields):
                    "head(\(method) \(uri) \(version) \(fields))"
                case .body(let bytes): "body(\(String(decoding: bytes, as: UTF8.self).debugDescription))"
                case .end(let trailers): "end(\(trailers.map { "\($0)" } ?? "nil"))"
                }
            }
            return "\(parts)" + (refused.map { " refused(\($0))" } ?? "")
                + (leftOver.isEmpty ? "" : " leftOver(\(leftOver.count))")
        }

        /// `self` is what `reference` emitted up to some point within its last request (a body may stop short of
        /// the reference's): the requests before it are the same.
        func isPrefix(of reference: Trace) -> Bool {
            guard parts.count <= reference.parts.count else { return false }
            let lastHead = reference.parts.lastIndex { if case .head = $0 { true } else { false } } ?? 0
            guard parts.count >= lastHead else { return false }
            for (index, part) in parts.enumerated() where part != reference.parts[index] {
                guard index == parts.count - 1, case .body(let mine) = part,
                    case .body(let theirs) = reference.parts[index], theirs.starts(with: mine)
                else { return false }
            }
            return true
        }
    }

    /// The next part either decoder handed on: Backstop's (`ClientRequestPart`) as NIO's part type, so that both
    /// decoders' traces are made alike.
    static func readPart(_ channel: EmbeddedChannel) -> HTTPServerRequestPart? {
        guard let any = try? channel.readInbound(as: Any.self) else { return nil }
        if let part = any as? HTTPServerRequestPart { return part }
        switch any as? ClientRequestPart {
        case .head(let head)?:
            return .head(
                HTTPRequestHead(
                    version: head.version, method: head.method, uri: head.uri,
                    headers: HTTPHeaders(head.headers.map { ($0.name, $0.value) })))
        case .body(let buffer)?: return .body(buffer)
        case .end(let trailers)?: return .end(trailers)
        case nil: return nil
        }
    }

    /// Feeds `bytes` to a decoder (whole, or one byte per read), then takes the decoder out of the pipeline.
    /// `trimmingValues` leaves out the spaces and tabs that end a field value, which llhttp keeps and Backstop's
    /// reader does not (RFC 9110 §5.5).
    static func trace(
        _ handler: some ChannelInboundHandler & RemovableChannelHandler, _ bytes: [UInt8], byteByByte: Bool = false,
        trimmingValues: Bool = false
    ) -> Trace {
        func field(_ name: String, _ value: String) -> String {
            guard trimmingValues else { return "\(name): \(value)" }
            var value = Substring(value)
            while value.last == " " || value.last == "\t" { value.removeLast() }
            return "\(name): \(value)"
        }
        let channel = EmbeddedChannel()
        try! channel.pipeline.syncOperations.addHandler(handler)
        var trace = Trace()
        let writes = byteByByte ? bytes.map { [$0] } : [bytes]
        var bodyOpen = false
        func collect() {
            while let part = Self.readPart(channel) {
                switch part {
                case .head(let head):
                    trace.parts.append(
                        .head(
                            method: head.method.rawValue, uri: head.uri, version: "\(head.version)",
                            fields: head.headers.map { field($0.name, $0.value) }))
                    bodyOpen = false
                case .body(var buffer):
                    let bytes = buffer.readBytes(length: buffer.readableBytes)!
                    if bodyOpen, case .body(let sofar) = trace.parts.last {
                        trace.parts[trace.parts.count - 1] = .body(sofar + bytes)
                    } else {
                        trace.parts.append(.body(bytes))
                    }
                    bodyOpen = true
                case .end(let trailers):
                    trace.parts.append(.end(trailers: trailers.map { $0.map { field($0.name, $0.value) } }))
                    bodyOpen = false
                }
            }
        }
        for write in writes {
            do {
                try channel.writeInbound(ByteBuffer(bytes: write))
            } catch let error as HTTPParserError {
                trace.refused = error == .headerOverflow ? .headerOverflow : .invalidConstant
                break
            } catch {
                Issue.record("unexpected error \(error)")
                break
            }
            collect()
        }
        collect()
        // Taken out after a message (a CONNECT's or an upgrade's, whose next bytes are handed on), as the proxy does.
        if trace.refused == nil, case .end = trace.parts.last {
            channel.pipeline.syncOperations.removeHandler(handler, promise: nil)
            channel.embeddedEventLoop.run()
            while var buffer = try? channel.readInbound(as: ByteBuffer.self) {
                trace.leftOver += buffer.readBytes(length: buffer.readableBytes)!
            }
        }
        _ = try? channel.finish()
        return trace
    }

    static func llhttp(_ bytes: [UInt8]) -> Trace {
        trace(
            ByteToMessageHandler(HTTPRequestDecoder(leftOverBytesStrategy: .forwardBytes)), bytes, trimmingValues: true)
    }

    static func backstop(_ bytes: [UInt8], byteByByte: Bool = false) -> Trace {
        trace(ClientRequestDecoder(maxHeadBytes: 80 << 10, forwardsLeftOverBytes: true), bytes, byteByByte: byteByByte)
    }

    enum Expectation {
        /// The same parts, the same refusal (or none), the same bytes handed on. When both refuse, Backstop's
        /// decoder may refuse earlier in the same request (before its head, where llhttp emits the head of a
        /// request whose framing it then refuses).
        case same
        /// Backstop's decoder refuses what llhttp accepts (docs/reference/behaviour.md#request-syntax).
        case stricter
    }

    struct Case: CustomTestStringConvertible, Sendable {
        let name: String
        let bytes: [UInt8]
        let expect: Expectation
        init(_ name: String, _ text: String, _ expect: Expectation = .same) {
            self.name = name
            self.bytes = Array(text.utf8)
            self.expect = expect
        }
        init(_ name: String, bytes: [UInt8], _ expect: Expectation = .same) {
            self.name = name
            self.bytes = bytes
            self.expect = expect
        }
        var testDescription: String { name }
    }

    static let realisticHead =
        "GET /api/v2/accounts/1234/orders?status=open&limit=50 HTTP/1.1\r\nHost: api.internal.example\r\n"
        + "User-Agent: ExampleApp/5.12.3 (iPhone; iOS 17.4; Scale/3.00)\r\nAccept: application/json\r\n"
        + "Accept-Language: en-GB,en;q=0.9\r\nAccept-Encoding: gzip, deflate, br\r\n"
        + "X-Request-ID: 6f1c2a9e-4d7b-4c1e-9a55-0b2f7c3d8e11\r\n"
        + "traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\n"
        + "Cookie: session=abcdef0123456789; theme=dark\r\nCache-Control: no-cache\r\nConnection: keep-alive\r\n"
        + "X-Client-Version: 5.12.3\r\nX-Device-ID: 9F1B6C2E-77A0-4D7E-B1C4-3E2A1F0D9B88\r\n\r\n"

    static let cases: [Case] = [
        Case("simple GET", "GET / HTTP/1.1\r\nHost: a\r\n\r\n"),
        Case("realistic head", realisticHead),
        Case("HTTP/1.0", "GET / HTTP/1.0\r\n\r\n"),
        Case("every known method", "PROPFIND / HTTP/1.1\r\n\r\nM-SEARCH * HTTP/1.1\r\n\r\nQUERY /q HTTP/1.1\r\n\r\n"),
        Case("POST with Content-Length", "POST /p HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello"),
        Case("Content-Length 0", "POST /p HTTP/1.1\r\nContent-Length: 0\r\n\r\n"),
        Case("body cut short", "POST /p HTTP/1.1\r\nContent-Length: 10\r\n\r\nhello"),
        Case("chunked", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"),
        Case(
            "chunked, upper-case hex",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nA\r\n0123456789\r\n0\r\n\r\n"),
        Case(
            "chunk extensions",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5;a=b;c\r\nhello\r\n0;d=\"x y\"\r\n\r\n"),
        Case(
            "chunk extension with spaces",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5 ; a=b\r\nhello\r\n0\r\n\r\n"),
        Case(
            "trailers", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\nX-Sum: 1\r\nX-T: 2\r\n\r\n"
        ),
        Case(
            "Transfer-Encoding as a trailer",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\nTransfer-Encoding: gzip\r\n\r\n"),
        Case(
            "Content-Length as a trailer, then a request",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\nX-Sum: 1\r\ncontent-length: 5\r\n\r\nGET / HTTP/1.1\r\n\r\n"
        ),
        Case(
            "a request after HTTP/1.0 without keep-alive",
            "GET /a HTTP/1.0\r\n\r\nGET /b HTTP/1.1\r\n\r\n"),
        Case(
            "a request after Connection: close", "GET /a HTTP/1.1\r\nConnection: close\r\n\r\nGET /b HTTP/1.1\r\n\r\n"),
        Case(
            "empty lines after Connection: close", "GET /a HTTP/1.1\r\nConnection: close\r\n\r\n\r\n\r\n"),
        Case(
            "a request after HTTP/1.0 with keep-alive",
            "GET /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /b HTTP/1.0\r\n\r\n"),
        Case("authority-form target with OPTIONS", "OPTIONS example.com:8 HTTP/1.1\r\nHost: a\r\n\r\n"),
        Case("authority-form target with GET", "GET app.test:80 HTTP/1.1\r\nHost: a\r\n\r\n"),
        Case("asterisk target", "OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n"),
        Case("scheme without //", "GET http:x HTTP/1.1\r\nHost: a\r\n\r\n"),
        Case("fragment right after the authority", "GET http://example.com:8080#/a?b HTTP/1.1\r\nHost: a\r\n\r\n"),
        Case("fragment after an absolute path", "GET http://example.com/a#b HTTP/1.1\r\nHost: a\r\n\r\n"),
        Case("fragment after an absolute query", "GET http://example.com?q#b HTTP/1.1\r\nHost: a\r\n\r\n"),
        Case("fragment after an origin-form path", "GET /a#b HTTP/1.1\r\nHost: a\r\n\r\n"),
        Case("missing final chunk", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"),
        Case(
            "chunk data not followed by CRLF",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n"),
        Case("huge chunk size", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffffff\r\n"),
        Case(
            "chunk size 2^60", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1000000000000000\r\nab", .stricter),
        Case(
            "chunk size with leading zeros",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n000000000000000000005\r\nhello\r\n0\r\n\r\n"),
        Case(
            "hex-prefixed chunk size", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n"),
        Case("negative chunk size", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\nhello\r\n0\r\n\r\n"),
        Case("empty chunk size", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n\r\nhello\r\n0\r\n\r\n"),
        Case(
            "chunk size line ending in LF", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n"
        ),
        Case("last chunk ending in LF", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\n\r\n"),
        Case("CL and TE", "POST / HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
        Case("TE and CL", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n"),
        Case("TE chunked, chunked", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n"),
        Case("TE gzip, chunked", "POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n"),
        Case("TE chunked, gzip", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n0\r\n\r\n"),
        Case("TE identity", "POST / HTTP/1.1\r\nTransfer-Encoding: identity\r\n\r\n"),
        Case("TE casing", "POST / HTTP/1.1\r\nTransfer-Encoding: ChUnKeD\r\n\r\n0\r\n\r\n"),
        Case("TE surrounding whitespace", "POST / HTTP/1.1\r\nTransfer-Encoding: \t chunked \t\r\n\r\n0\r\n\r\n"),
        Case(
            "TE in two fields",
            "POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
        Case(
            "TE chunked then gzip field",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: gzip\r\n\r\n"),
        Case("TE chunked with parameter", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked;q=1\r\n\r\n0\r\n\r\n"),
        Case("TE xchunked", "POST / HTTP/1.1\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n"),
        Case("TE with a space before the colon", "POST / HTTP/1.1\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n"),
        Case("TE folded", "POST / HTTP/1.1\r\nTransfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n"),
        Case("duplicate Content-Length", "POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello"),
        Case("differing Content-Length", "POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!"),
        Case("Content-Length list", "POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\nhello"),
        Case("negative Content-Length", "POST / HTTP/1.1\r\nContent-Length: -5\r\n\r\nhello"),
        Case("plus-signed Content-Length", "POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\nhello"),
        Case("hex Content-Length", "POST / HTTP/1.1\r\nContent-Length: 0x5\r\n\r\nhello"),
        Case("empty Content-Length", "POST / HTTP/1.1\r\nContent-Length:\r\n\r\n"),
        Case("huge Content-Length", "POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n"),
        Case("Content-Length with spaces inside", "POST / HTTP/1.1\r\nContent-Length: 1 0\r\n\r\nhelloworld"),
        Case("Content-Length with trailing space", "POST / HTTP/1.1\r\nContent-Length: 5 \r\n\r\nhello"),
        Case("obs-fold", "GET / HTTP/1.1\r\nX-A: one\r\n two\r\n\r\n"),
        Case("bare CR in a value", "GET / HTTP/1.1\r\nX-A: one\rtwo\r\n\r\n"),
        Case("NUL in a value", "GET / HTTP/1.1\r\nX-A: one\u{0}two\r\n\r\n"),
        Case("DEL in a value", "GET / HTTP/1.1\r\nX-A: one\u{7F}two\r\n\r\n"),
        Case("obs-text in a value", bytes: Array("GET / HTTP/1.1\r\nX-A: caf".utf8) + [0xE9] + Array("\r\n\r\n".utf8)),
        Case("NUL in a name", "GET / HTTP/1.1\r\nX\u{0}A: one\r\n\r\n"),
        Case("space in a name", "GET / HTTP/1.1\r\nX A: one\r\n\r\n"),
        Case("space before the colon", "GET / HTTP/1.1\r\nHost : a\r\n\r\n"),
        Case("no colon", "GET / HTTP/1.1\r\nHost\r\n\r\n"),
        Case("empty name", "GET / HTTP/1.1\r\n: a\r\n\r\n"),
        Case("empty value", "GET / HTTP/1.1\r\nX-A:\r\nX-B: \r\n\r\n"),
        Case("value with inner and trailing whitespace", "GET / HTTP/1.1\r\nX-A:  a \t b \t \r\n\r\n"),
        Case("LF-only lines", "GET / HTTP/1.1\nHost: a\n\n"),
        Case("LF-only field line", "GET / HTTP/1.1\r\nHost: a\nX: b\r\n\r\n"),
        Case("LF-only end of head", "GET / HTTP/1.1\r\nHost: a\r\n\n"),
        Case("CR-only end of head", "GET / HTTP/1.1\r\nHost: a\r\n\r\r\n"),
        Case("absolute form", "GET http://example.com:8080/a/b?c=d&e HTTP/1.1\r\nHost: example.com\r\n\r\n"),
        Case("asterisk form", "OPTIONS * HTTP/1.1\r\n\r\n"),
        Case("target with a fragment", "GET /a#frag HTTP/1.1\r\n\r\n"),
        Case("target with non-ASCII", bytes: Array("GET /caf".utf8) + [0xC3, 0xA9] + Array(" HTTP/1.1\r\n\r\n".utf8)),
        Case("target with a control character", "GET /a\u{1}b HTTP/1.1\r\n\r\n"),
        Case("double space in the request line", "GET  / HTTP/1.1\r\n\r\n", .stricter),
        Case("tab in the request line", "GET\t/ HTTP/1.1\r\n\r\n"),
        Case("no target", "GET HTTP/1.1\r\n\r\n"),
        Case("lower-case method", "get / HTTP/1.1\r\n\r\n"),
        Case("unknown method", "FOO / HTTP/1.1\r\n\r\n"),
        Case("lower-case version", "GET / http/1.1\r\n\r\n"),
        Case("HTTP/0.9 request line", "GET /\r\n\r\n"),
        Case("HTTP/2.0 request line", "GET / HTTP/2.0\r\n\r\n"),
        Case("HTTP/2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
        Case("HTTP/1.2", "GET / HTTP/1.2\r\n\r\n"),
        Case("HTTP/1.10", "GET / HTTP/1.10\r\n\r\n"),
        Case("space after the version", "GET / HTTP/1.1 \r\n\r\n"),
        // Found by the request-decoder fuzz target: the request line's CR was not checked for its LF.
        Case(
            "CR alone after the version", bytes: Array("GET / HTTP/1.1\rost:".utf8) + [0x97] + Array("a\r\n\r\n".utf8)),
        Case(
            "CONNECT authority form",
            "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n\u{16}\u{3}\u{1}hello"),
        Case("CONNECT with a Content-Length", "CONNECT example.com:443 HTTP/1.1\r\nContent-Length: 5\r\n\r\nhelloGET"),
        Case("CONNECT with chunked", "CONNECT example.com:443 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
        Case("CONNECT IPv6", "CONNECT [::1]:443 HTTP/1.1\r\n\r\n"),
        Case(
            "upgrade",
            "GET /ws HTTP/1.1\r\nConnection: keep-alive, Upgrade\r\nUpgrade: websocket\r\n\r\n\u{81}\u{80}frame"),
        Case(
            "upgrade with a body",
            "POST /ws HTTP/1.1\r\nConnection: upgrade\r\nUpgrade: x\r\nContent-Length: 2\r\n\r\nhiGET / HTTP/1.1\r\n\r\n"
        ),
        Case(
            "upgrade, empty Upgrade value",
            "GET /ws HTTP/1.1\r\nUpgrade: \r\nConnection: upgrade\r\n\r\nGET / HTTP/1.1\r\n\r\n"),
        Case(
            "upgrade, Upgrade value of spaces",
            "GET /ws HTTP/1.1\r\nUpgrade:   \r\nConnection: upgrade\r\n\r\nGET / HTTP/1.1\r\n\r\n"),
        Case("upgrade without Connection", "GET /ws HTTP/1.1\r\nUpgrade: websocket\r\n\r\nGET / HTTP/1.1\r\n\r\n"),
        Case("upgrade, HTTP/1.0", "GET /ws HTTP/1.0\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\nxyz"),
        Case("pipelined GETs", "GET /1 HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HTTP/1.1\r\nHost: a\r\n\r\n"),
        Case("pipelined POST and GET", "POST /1 HTTP/1.1\r\nContent-Length: 3\r\n\r\nabcGET /2 HTTP/1.1\r\n\r\n"),
        Case(
            "pipelined chunked and GET",
            "POST /1 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\nGET /2 HTTP/1.1\r\n\r\n"),
        Case("pipelined, the second malformed", "GET /1 HTTP/1.1\r\n\r\nGET /2 HTTP/1.1\r\nX Y: z\r\n\r\n"),
        Case(
            "CL.TE smuggling",
            "POST / HTTP/1.1\r\nContent-Length: 13\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nSMUGGLED"),
        Case(
            "TE.CL smuggling",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n8\r\nSMUGGLED\r\n0\r\n\r\n"),
        Case("empty lines before the request", "\r\n\r\nGET / HTTP/1.1\r\n\r\n"),
        Case("empty lines between requests", "GET /1 HTTP/1.1\r\n\r\n\r\nGET /2 HTTP/1.1\r\n\r\n"),
        Case("head cut short", "GET / HTTP/1.1\r\nHost: a\r\n"),
        Case("head over the limit", "GET / HTTP/1.1\r\nX: " + String(repeating: "a", count: 90 << 10) + "\r\n\r\n"),
    ]

    @Test("Backstop's decoder agrees with llhttp, or is stricter where documented", arguments: cases)
    func differential(_ testCase: Case) {
        let reference = Self.llhttp(testCase.bytes)
        let ours = Self.backstop(testCase.bytes)
        switch testCase.expect {
        case .same:
            if reference.refused != nil, ours.refused == reference.refused {
                #expect(ours.isPrefix(of: reference), "llhttp: \(reference)\nours:   \(ours)")
            } else {
                #expect(ours == reference, "llhttp: \(reference)\nours:   \(ours)")
            }
        case .stricter:
            #expect(reference.refused == nil, "llhttp refuses too: \(reference)")
            #expect(ours.refused != nil && ours.isPrefix(of: reference), "llhttp: \(reference)\nours:   \(ours)")
        }
        // Bytes arriving one at a time make the same parts as all at once.
        #expect(Self.backstop(testCase.bytes, byteByByte: true) == ours)
    }

    @Test("A value's surrounding spaces and tabs are not part of it; inner ones are")
    func valuesTrimmed() {
        let ours = Self.backstop(
            Array("GET / HTTP/1.1\r\nX-A:  a \t b \t \r\nX-B: \t\r\nX-C:c\r\n\r\n".utf8), byteByByte: true)
        #expect(
            ours.parts.first
                == .head(method: "GET", uri: "/", version: "HTTP/1.1", fields: ["X-A: a \t b", "X-B: ", "X-C: c"]))
        // llhttp kept the trailing ones.
        let reference = Self.trace(
            ByteToMessageHandler(HTTPRequestDecoder(leftOverBytesStrategy: .forwardBytes)),
            Array("GET / HTTP/1.1\r\nX-A: a \r\n\r\n".utf8))
        #expect(reference.parts.first == .head(method: "GET", uri: "/", version: "HTTP/1.1", fields: ["X-A: a "]))
    }

    @Test("A head over the limit is refused as too large (431), a smaller one is not")
    func headLimit() {
        let head = "GET / HTTP/1.1\r\nX: " + String(repeating: "a", count: 1000) + "\r\n\r\n"
        let small = Self.trace(
            ClientRequestDecoder(maxHeadBytes: head.utf8.count, forwardsLeftOverBytes: true), Array(head.utf8))
        #expect(small.refused == nil && small.parts.count == 2)
        let large = Self.trace(
            ClientRequestDecoder(maxHeadBytes: head.utf8.count - 1, forwardsLeftOverBytes: true), Array(head.utf8))
        #expect(large.refused == .headerOverflow)
        // Without the end of the head in sight, the limit applies to what arrived.
        let open = Self.trace(
            ClientRequestDecoder(maxHeadBytes: 100, forwardsLeftOverBytes: true), Array(head.utf8.prefix(200)))
        #expect(open.refused == .headerOverflow)
    }

    @Test(
        "A request line without its version is refused when it ends, not after the empty line that never comes",
        arguments: ["GET /\r\n", "GET /index.html\r\n", "GET / HTTP/1\r\n", "GET / HTTPS/1.1\r\n", "GET\r\n"])
    func versionlessLineRefusedAtOnce(line: String) {
        var reader = HTTP1RequestReader(maxHeadBytes: 1024)
        let event = Array(line.utf8).withUnsafeBytes { input in
            var offset = 0
            return reader.next(input, at: &offset)
        }
        #expect(event == .invalid(.version))
        // A request line with its version still waits for the rest of the head.
        var waiting = HTTP1RequestReader(maxHeadBytes: 1024)
        let partial = Array("GET / HTTP/1.1\r\nHost: a\r\n".utf8).withUnsafeBytes { input in
            var offset = 0
            return waiting.next(input, at: &offset)
        }
        #expect(partial == .needMore)
    }

    @Test("The reader's events for a pipelined pair, whole")
    func readerEvents() {
        var reader = HTTP1RequestReader(maxHeadBytes: 1024)
        let bytes = Array(
            "POST /a HTTP/1.1\r\nContent-Length: 2\r\n\r\nhiGET /b HTTP/1.0\r\nConnection: upgrade\r\nUpgrade: x\r\n\r\nrest"
                .utf8)
        var events: [HTTP1RequestReader.Event] = []
        bytes.withUnsafeBytes { input in
            var offset = 0
            while true {
                let event = reader.next(input, at: &offset)
                if event == .needMore { break }
                events.append(event)
            }
            #expect(offset == bytes.count - 4)
        }
        #expect(
            events == [
                .head(
                    HTTP1RequestHead(
                        method: .post, target: "/a", minorVersion: 1, fields: [("Content-Length", "2")], upgrade: false)
                ),
                .body(39..<41), .end(trailers: nil),
                .head(
                    HTTP1RequestHead(
                        method: .get, target: "/b", minorVersion: 0,
                        fields: [("Connection", "upgrade"), ("Upgrade", "x")], upgrade: true)),
                .end(trailers: nil),
            ])
        #expect(reader.stopped)
    }
}
