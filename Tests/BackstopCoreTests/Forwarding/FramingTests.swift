import BackstopCore
import Testing

private func fields(_ pairs: [(String, String)]) -> [(name: String, value: String)] {
    pairs.map { (name: $0.0, value: $0.1) }
}

@Suite("Request framing (smuggling checks)")
struct RequestFramingTests {
    @Test(arguments: [
        ([], nil as Int?, false),
        ([("Content-Length", "0")], 0, false),
        ([("content-length", "42")], 42, false),
        ([("Content-Length", " 7 ")], 7, false),
        ([("Content-Length", "5"), ("Content-Length", "5")], 5, false),
        ([("Content-Length", "5, 5")], 5, false),
        ([("Transfer-Encoding", "chunked")], nil, true),
        ([("transfer-encoding", " Chunked ")], nil, true),
        ([("X-Other", "1")], nil, false),
    ])
    func accepted(headers: [(String, String)], length: Int?, chunked: Bool) throws {
        let framing = try #require(RequestFraming(fields(headers)))
        #expect(framing.contentLength == length)
        #expect(framing.chunked == chunked)
        #expect(framing.hasBody == (chunked || (length ?? 0) > 0))
    }

    @Test(arguments: [
        [("Content-Length", "5"), ("Transfer-Encoding", "chunked")],
        [("Transfer-Encoding", "chunked"), ("Content-Length", "5")],
        [("Content-Length", "5"), ("Content-Length", "6")],
        [("Content-Length", "5, 6")],
        [("Content-Length", "")],
        [("Content-Length", "+5")],
        [("Content-Length", "-5")],
        [("Content-Length", "0x5")],
        [("Content-Length", "5 5")],
        [("Content-Length", "1234567890123456789")],
        [("Transfer-Encoding", "chunked, identity")],
        [("Transfer-Encoding", "identity")],
        [("Transfer-Encoding", "gzip, chunked")],
        [("Transfer-Encoding", "chunked"), ("Transfer-Encoding", "chunked")],
        [("Transfer-Encoding", "xchunked")],
        [("Transfer-Encoding", "")],
    ])
    func refused(headers: [(String, String)]) {
        #expect(RequestFraming(fields(headers)) == nil)
    }
}

@Suite("Response framing")
struct ResponseFramingTests {
    @Test func bodylessResponses() {
        #expect(
            ResponseFraming.decide(requestIsHEAD: true, status: 200, contentLength: 10, clientIsHTTP10: false)
                == .bodyless)
        for status in [101, 103, 204, 304] {
            #expect(
                ResponseFraming.decide(requestIsHEAD: false, status: status, contentLength: nil, clientIsHTTP10: false)
                    == .bodyless)
        }
    }

    @Test func lengthThenChunkedThenClose() {
        #expect(
            ResponseFraming.decide(requestIsHEAD: false, status: 200, contentLength: 0, clientIsHTTP10: true)
                == .contentLength(0))
        #expect(
            ResponseFraming.decide(requestIsHEAD: false, status: 404, contentLength: 9, clientIsHTTP10: false)
                == .contentLength(9))
        #expect(
            ResponseFraming.decide(requestIsHEAD: false, status: 200, contentLength: nil, clientIsHTTP10: false)
                == .chunked)
        let close = ResponseFraming.decide(requestIsHEAD: false, status: 200, contentLength: nil, clientIsHTTP10: true)
        #expect(close == .closeDelimited)
        #expect(close.endsConnection)
        #expect(!ResponseFraming.chunked.endsConnection)
    }
}

@Suite("Upstream head parser")
struct UpstreamHeadParserTests {
    /// Feeds `lines` (each with its CRLF, as curl hands them over) and returns the heads produced.
    private func parse(_ lines: [String]) -> [UpstreamResponseHead] {
        var parser = UpstreamHeadParser()
        var heads: [UpstreamResponseHead] = []
        for line in lines {
            let bytes = Array(line.utf8)
            if let head = bytes.withUnsafeBytes({ parser.consume($0) }) { heads.append(head) }
        }
        return heads
    }

    private func fieldText(_ head: UpstreamResponseHead) -> String { String(decoding: head.fields, as: UTF8.self) }

    @Test func aPlainHead() throws {
        let heads = parse([
            "HTTP/1.1 200 OK\r\n", "Content-Type: text/plain\r\n", "Content-Length: 5\r\n",
            "X-A:  spaced \t\r\n", "\r\n",
        ])
        let head = try #require(heads.first)
        #expect(heads.count == 1)
        #expect(head.status == 200)
        #expect(head.version == "1.1")
        #expect(head.contentLength == 5)
        #expect(fieldText(head) == "Content-Type: text/plain\r\nX-A: spaced\r\n")
        #expect(head.field("x-a") == "spaced")
    }

    @Test func hopByHopFramingViaAndOwnFieldsAreTakenOut() throws {
        let head = try #require(
            parse([
                "HTTP/2 503\r\n", "Connection: keep-alive, X-Private\r\n", "Keep-Alive: timeout=5\r\n",
                "Transfer-Encoding: chunked\r\n", "X-Private: secret\r\n", "Proxy-Authenticate: Basic\r\n",
                "Upgrade: h2c\r\n", "TE: trailers\r\n", "Trailer: X\r\n", "Via: 1.1 edge\r\n", "via: 2 cdn\r\n",
                "X-Backstop-Attempts: 9\r\n", "X-Backstop-Error: forged\r\n", "Retry-After: 7\r\n",
                "X-RateLimit-Reset: 30\r\n", "Server: o\r\n", "\r\n",
            ]).first)
        #expect(head.status == 503)
        #expect(head.version == "2")
        #expect(head.via == "1.1 edge, 2 cdn")
        #expect(head.retryAfter == "7")
        #expect(head.rateLimitReset == "30")
        #expect(fieldText(head) == "Retry-After: 7\r\nX-RateLimit-Reset: 30\r\nServer: o\r\n")
    }

    @Test func interimHeadsAreSkippedAndTrailersIgnored() throws {
        let heads = parse([
            "HTTP/1.1 100 Continue\r\n", "\r\n", "HTTP/1.1 103 Early Hints\r\n", "Link: </a>\r\n", "\r\n",
            "HTTP/1.1 201 Created\r\n", "Location: /x\r\n", "\r\n", "X-Trailer: late\r\n", "\r\n",
        ])
        #expect(heads.count == 1)
        #expect(heads.first?.status == 201)
        #expect(heads.first.map(fieldText) == "Location: /x\r\n")
    }

    @Test func switchingProtocolsIsFinal() {
        #expect(parse(["HTTP/1.1 101 Switching Protocols\r\n", "\r\n"]).first?.status == 101)
    }

    @Test func obsFoldJoinsWithASpace() throws {
        let head = try #require(
            parse([
                "HTTP/1.1 200 OK\r\n", "X-Long: a\r\n", "  b\r\n", "\tc\r\n", "Via: 1.1 a\r\n",
                " (comment)\r\n", "\r\n",
            ]).first)
        #expect(fieldText(head) == "X-Long: a b c\r\n")
        #expect(head.via == "1.1 a (comment)")
    }

    @Test(arguments: [
        "X-Bad: a\u{0}b\r\n", "X-Bad: a\rb\r\n", "X-Bad: a\u{7F}\r\n", "Bad Name: v\r\n", "(x): v\r\n", ": novalue\r\n",
        "no colon at all\r\n",
    ])
    func invalidLinesAreDropped(line: String) throws {
        let head = try #require(parse(["HTTP/1.1 200 OK\r\n", line, "X-Good: ok\r\n", "\r\n"]).first)
        #expect(fieldText(head) == "X-Good: ok\r\n")
    }

    @Test func aContinuationOfADroppedLineIsDroppedToo() throws {
        let head = try #require(parse(["HTTP/1.1 200 OK\r\n", "Connection: close\r\n", " more\r\n", "\r\n"]).first)
        #expect(head.fields.isEmpty)
    }

    @Test(arguments: ["abc", "-1", "1e3", "", "99999999999999999999"])
    func invalidContentLengthIsNoLength(value: String) throws {
        let head = try #require(parse(["HTTP/1.1 200 OK\r\n", "Content-Length: \(value)\r\n", "\r\n"]).first)
        #expect(head.contentLength == nil)
    }

    @Test(
        "framing two parsers could read differently is flagged, never silently resolved",
        arguments: [
            (["Content-Length: 5", "Transfer-Encoding: chunked"], "both Content-Length and Transfer-Encoding"),
            (["Transfer-Encoding: chunked", "Content-Length: 5"], "both Content-Length and Transfer-Encoding"),
            (["Content-Length: 5", "Content-Length: 82"], "differing Content-Length values"),
            (["Content-Length: 5, 82"], "differing Content-Length values"),
            (["Content-Length: 5,"], "malformed Content-Length"),
            (["Content-Length: -5"], "malformed Content-Length"),
            (["Content-Length: abc"], "malformed Content-Length"),
            (["Content-Length: "], "malformed Content-Length"),
            (["Content-Length: 99999999999999999999"], "malformed Content-Length"),
            (["Content-Length: 5\u{1}"], "malformed Content-Length"),
            (["Content-Length: 5", " 82"], "malformed Content-Length"),
            (["Transfer-Encoding: gzip, chunked"], "unsupported Transfer-Encoding"),
            (["Transfer-Encoding: chunked", "Transfer-Encoding: chunked"], "unsupported Transfer-Encoding"),
            (["Transfer-Encoding: chunked,"], "unsupported Transfer-Encoding"),
            (["Transfer-Encoding: identity"], "unsupported Transfer-Encoding"),
        ])
    func untrustworthyFraming(lines: [String], problem: String) throws {
        let head = try #require(parse(["HTTP/1.1 200 OK\r\n"] + lines.map { $0 + "\r\n" } + ["\r\n"]).first)
        #expect(head.framingProblem == problem)
    }

    @Test(
        "sound framing is not flagged",
        arguments: [
            [], ["Content-Length: 5"], ["Content-Length: 5, 5"], ["Content-Length: 5", "content-length: 5"],
            ["Transfer-Encoding: chunked"], ["Transfer-Encoding:  Chunked "],
        ])
    func soundFraming(lines: [String]) throws {
        let head = try #require(parse(["HTTP/1.1 200 OK\r\n"] + lines.map { $0 + "\r\n" } + ["\r\n"]).first)
        #expect(head.framingProblem == nil)
    }

    @Test func anInterimHeadsFramingDoesNotCarryOver() throws {
        let head = try #require(
            parse([
                "HTTP/1.1 100 Continue\r\n", "Content-Length: 9\r\n", "\r\n", "HTTP/1.1 200 OK\r\n",
                "Transfer-Encoding: chunked\r\n", "\r\n",
            ]).first)
        #expect(head.framingProblem == nil)
    }

    @Test(
        "no status code, or one below 100, ends the head as one nobody can frame (not an interim head to wait past)",
        arguments: [
            ["HTTP/1.1 2x0 Odd\r\n", "\r\n"], ["HTTP/1.1 20\r\n", "\r\n"], ["HTTP/1.1 099 Odd\r\n", "\r\n"],
            ["HTTP/1.1 000\r\n", "\r\n"], ["X-A: b\r\n", "\r\n"],
        ])
    func noValidStatus(lines: [String]) throws {
        let heads = parse(lines)
        #expect(heads.count == 1)
        #expect(heads.first?.framingProblem == "no valid status code")
        #expect(heads.first?.status == 0)
    }

    @Test(
        "a framing field with a space before its colon, or Transfer-Encoding in HTTP/1.0, is untrustworthy framing",
        arguments: [
            ("HTTP/1.1 200 OK", ["Content-Length : 5"], "a space before the colon of a framing field"),
            ("HTTP/1.1 200 OK", ["content-length\t: 5"], "a space before the colon of a framing field"),
            ("HTTP/1.1 200 OK", ["Transfer-Encoding : chunked"], "a space before the colon of a framing field"),
            ("HTTP/1.0 200 OK", ["Transfer-Encoding: chunked"], "Transfer-Encoding in an HTTP/1.0 response"),
            ("HTTP/1.1 200 OK", ["X-Other : 5", "Content-Length: 2"], nil),
            ("HTTP/1.1 200 OK", ["Content-Length x: 5"], nil),
            ("HTTP/1.0 200 OK", ["Content-Length: 5"], nil),
        ] as [(String, [String], String?)])
    func spacesAndVersions(status: String, lines: [String], problem: String?) throws {
        let head = try #require(parse([status + "\r\n"] + lines.map { $0 + "\r\n" } + ["\r\n"]).first)
        #expect(head.framingProblem == problem)
        #expect(!String(decoding: head.fields, as: UTF8.self).contains("X-Other"))
    }
}
