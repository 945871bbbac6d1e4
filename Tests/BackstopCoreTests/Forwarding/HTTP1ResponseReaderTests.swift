import Testing

@testable import BackstopCore

/// `HTTP1ResponseReader`: what a response's bytes become, compared as whole transcripts, and the same transcript
/// whatever the reads the bytes arrive in.
@Suite("HTTP/1.1 response reader")
struct HTTP1ResponseReaderTests {
    /// What the reader reported, body bytes joined.
    enum Step: Equatable, CustomStringConvertible {
        case head(Int, [String])
        case body(String)
        case end(reusable: Bool)
        case invalid(String)
        case truncated(String)

        var description: String {
            switch self {
            case .head(let status, let fields): "head(\(status), \(fields))"
            case .body(let text): "body(\(text.debugDescription))"
            case .end(let reusable): "end(reusable: \(reusable))"
            case .invalid(let why): "invalid(\(why))"
            case .truncated(let why): "truncated(\(why))"
            }
        }
    }

    /// Feeds `text` in reads cut at `cuts`, then (when `close`) the end of the connection.
    static func read(_ text: String, cuts: [Int] = [], head: Bool = false, close: Bool = false) -> [Step] {
        read(Array(text.utf8), cuts: cuts, head: head, close: close)
    }

    static func read(_ bytes: [UInt8], cuts: [Int] = [], head: Bool = false, close: Bool = false) -> [Step] {
        var reader = HTTP1ResponseReader(requestIsHEAD: head)
        var steps: [Step] = []
        func note(_ step: Step) {
            if case .body(let more) = step, case .body(let earlier)? = steps.last {
                steps[steps.count - 1] = .body(earlier + more)
            } else {
                steps.append(step)
            }
        }
        var bounds = [0] + cuts.filter { $0 > 0 && $0 < bytes.count } + [bytes.count]
        bounds = Array(Set(bounds)).sorted()
        reading: for (start, end) in zip(bounds, bounds.dropFirst()) {
            let chunk = Array(bytes[start..<end])
            var offset = 0
            while true {
                let event = chunk.withUnsafeBytes { reader.next($0, at: &offset) }
                switch event {
                case .needMore: continue reading
                case .head(let h): note(.head(h.status, h.fieldPairs.map { "\($0.name): \($0.value)" }))
                case .body(let range): note(.body(String(decoding: chunk[range], as: UTF8.self)))
                case .end(let reusable):
                    note(.end(reusable: reusable && offset == chunk.count && end == bytes.count))
                    return steps
                case .invalid(let why):
                    note(.invalid(why))
                    return steps
                case .truncated(let why):
                    note(.truncated(why))
                    return steps
                }
            }
        }
        if close {
            switch reader.inputEnded() {
            case .end(let reusable): note(.end(reusable: reusable))
            case .truncated(let why): note(.truncated(why))
            default: break
            }
        }
        return steps
    }

    /// The transcript of `text` read whole, checked to be the same for every way of cutting it in two and in
    /// single bytes.
    static func transcript(_ text: String, head: Bool = false, close: Bool = false) -> [Step] {
        let whole = read(text, head: head, close: close)
        let count = text.utf8.count
        for cut in 1..<max(count, 1) {
            let split = read(text, cuts: [cut], head: head, close: close)
            #expect(split == whole, "cut at \(cut)")
        }
        #expect(read(text, cuts: Array(1..<max(count, 1)), head: head, close: close) == whole, "byte by byte")
        return whole
    }

    @Test func contentLengthBodyEndsAtItsLengthAndKeepsTheConnection() {
        #expect(
            Self.transcript("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\n\r\nhello")
                == [.head(200, ["X-A: 1"]), .body("hello"), .end(reusable: true)])
        #expect(
            Self.transcript("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                == [.head(200, []), .end(reusable: true)])
    }

    /// Only a field named `Connection` (any case) says whether the connection is kept: a colon where that name's
    /// would be, after another name or inside one, says nothing.
    @Test(arguments: [
        ("Connection: close", false), ("CONNECTION:close", false), ("connection: Keep-Alive, close", false),
        ("Connection: keep-alive", true), ("Connectionx: close", true), ("Connectio: close", true),
        ("abc:efghij: close", true), ("X-Connection: close", true), ("Transfer-Encodin: close", true),
    ])
    func theConnectionFieldDecidesReuse(field: String, reusable: Bool) {
        #expect(
            Self.transcript("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\(field)\r\n\r\nhi").last
                == .end(reusable: reusable))
    }

    @Test func bytesPastTheLengthAreNotThisResponseAndCostTheConnection() {
        // The reader stops at the length; what follows is the transport's to judge (here: not reusable).
        #expect(
            Self.read("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhiEXTRA")
                == [.head(200, []), .body("hi"), .end(reusable: false)])
    }

    @Test func chunkedBodiesAreDecodedWithExtensionsAndTrailers() {
        let text =
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;name=value\r\nhello\r\nA \r\n0123456789\r\n"
            + "0\r\nX-Trailer: t\r\n\r\n"
        #expect(Self.transcript(text) == [.head(200, []), .body("hello0123456789"), .end(reusable: true)])
        #expect(
            Self.transcript("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
                == [.head(200, []), .end(reusable: true)])
        // Bare LF line ends, as curl accepts them.
        #expect(
            Self.transcript("HTTP/1.1 200 OK\nTransfer-Encoding: chunked\n\n2\nhi\n0\n\n")
                == [.head(200, []), .body("hi"), .end(reusable: true)])
    }

    @Test func malformedChunksAreInvalid() {
        let head = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        #expect(Self.transcript(head + "zz\r\n") == [.head(200, []), .invalid("malformed chunk size")])
        #expect(Self.transcript(head + "\r\n") == [.head(200, []), .invalid("malformed chunk size")])
        #expect(Self.transcript(head + "-1\r\n") == [.head(200, []), .invalid("malformed chunk size")])
        #expect(
            Self.transcript(head + "2\r\nhiX") == [
                .head(200, []), .body("hi"), .invalid("chunk data not followed by CRLF"),
            ])
        #expect(
            Self.transcript(head + String(repeating: "f", count: 16) + "\r\n")
                == [.head(200, []), .invalid("chunk size too large")])
        #expect(
            Self.read(head + "1;" + String(repeating: "x", count: 5000))
                == [.head(200, []), .invalid("chunk-size line too long")])
        #expect(Self.transcript(head + "1;a\u{1}\r\n") == [.head(200, []), .invalid("malformed chunk extension")])
    }

    @Test func closeDelimitedBodiesEndWithTheConnection() {
        #expect(
            Self.transcript("HTTP/1.1 200 OK\r\n\r\nuntil close", close: true)
                == [.head(200, []), .body("until close"), .end(reusable: false)])
        #expect(
            Self.transcript("HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok")
                == [.head(200, []), .body("ok"), .end(reusable: false)])
        #expect(
            Self.transcript("HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok")
                == [.head(200, []), .body("ok"), .end(reusable: true)])
        #expect(
            Self.transcript("HTTP/1.1 200 OK\r\nConnection: x, Close\r\nContent-Length: 2\r\n\r\nok")
                == [.head(200, []), .body("ok"), .end(reusable: false)])
    }

    @Test func bodilessResponsesEndAtTheirHead() {
        for status in [204, 304] {
            #expect(
                Self.transcript("HTTP/1.1 \(status) X\r\nContent-Length: 10\r\n\r\n")
                    == [.head(status, []), .end(reusable: true)])
        }
        #expect(
            Self.transcript("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", head: true)
                == [.head(200, []), .end(reusable: true)])
        #expect(
            Self.transcript("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", head: true)
                == [.head(200, []), .end(reusable: true)])
        #expect(Self.transcript("HTTP/1.1 101 Switching\r\n\r\n") == [.head(101, []), .end(reusable: false)])
    }

    @Test func interimHeadsAreSkipped() {
        let text =
            "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\nConnection: close\r\n\r\n"
            + "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx"
        #expect(Self.transcript(text) == [.head(200, []), .body("x"), .end(reusable: true)])
    }

    @Test func untrustworthyHeadsAndOtherProtocolsAreInvalid() {
        #expect(
            Self.transcript("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n")
                == [.invalid("untrustworthy response framing: both Content-Length and Transfer-Encoding")])
        #expect(
            Self.transcript("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n")
                == [.invalid("untrustworthy response framing: differing Content-Length values")])
        #expect(
            Self.transcript("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n")
                == [.invalid("untrustworthy response framing: unsupported Transfer-Encoding")])
        #expect(Self.transcript("SSH-2.0-OpenSSH_9\r\n") == [.invalid("not an HTTP/1.x status line")])
        #expect(Self.transcript("HTTP/2 200\r\n\r\n") == [.invalid("not an HTTP/1.x status line")])
        #expect(Self.transcript("HTTP/1.1 20 OK\r\n\r\n") == [.invalid("not an HTTP/1.x status line")])
        #expect(Self.transcript("HTTP/1.1 099 Odd\r\n\r\n") == [.invalid("not an HTTP/1.x status line")])
        #expect(Self.transcript("HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n") == [.head(200, []), .end(reusable: true)])
        let huge = "HTTP/1.1 200 OK\r\n" + String(repeating: "X-Filler: 0123456789\r\n", count: 5000)
        #expect(Self.read(huge) == [.invalid("response head larger than 100 KiB")])
        #expect(Self.read(huge, cuts: [7, 30_000]) == [.invalid("response head larger than 100 KiB")])
    }

    @Test func aConnectionEndingEarlyTruncatesTheResponse() {
        #expect(Self.read("", close: true) == [.truncated("upstream closed the connection without a response")])
        #expect(
            Self.transcript("HTTP/1.1 200 OK\r\nContent", close: true)
                == [.truncated("upstream closed the connection in the response head")])
        #expect(
            Self.transcript("HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort", close: true)
                == [
                    .head(200, []), .body("short"),
                    .truncated("upstream closed the connection before the response body ended"),
                ])
        #expect(
            Self.transcript("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel", close: true)
                == [
                    .head(200, []), .body("hel"),
                    .truncated("upstream closed the connection before the response body ended"),
                ])
    }

    @Test func fieldsAreRewrittenAsForTheCurlPath() {
        let steps = Self.transcript(
            "HTTP/1.1 200 OK\r\nConnection: X-Drop\r\nX-Drop: 1\r\nVia: 1.1 other\r\nKeep-Alive: t=5\r\nX-Keep: 2\r\n"
                + "Content-Length: 0\r\n\r\n")
        #expect(steps == [.head(200, ["X-Keep: 2"]), .end(reusable: true)])
    }

    /// Every stored property of the reader and its parser, nested, as `dump` writes them (a buffer's capacity is not
    /// among them).
    static func reflection(_ reader: HTTP1ResponseReader) -> String {
        var text = ""
        dump(reader, to: &text)
        return text
    }

    /// `restart` leaves a reader as `init` makes one, after any part of any response (a head cut short, a folded or
    /// `Connection`-listed field, a chunked body stopped halfway, a 1xx interim head), and the restarted reader reads
    /// the next response as a new one would.
    @Test func restartLeavesTheReaderAsNew() {
        let responses = [
            "HTTP/1.1 200 OK\r\nConnection: X-Drop, keep-alive\r\nX-Drop: 1\r\nVia: 1.1 other\r\nRetry-After: 5\r\n"
                + "RateLimit-Reset: 3\r\nLocation: /x\r\nX-Fold: a\r\n b\r\nContent-Length: 3\r\n\r\nabc",
            "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                + "3\r\nabc\r\n0\r\nX-Trailer: 1\r\n\r\n",
            "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n",
        ]
        let next = "HTTP/1.1 200 OK\r\nX-Next: 1\r\nContent-Length: 2\r\n\r\nok"
        for head in [false, true] {
            var fresh = HTTP1ResponseReader(requestIsHEAD: head)
            let asNew = Self.reflection(fresh)
            var freshOffset = 0
            let freshEvents = Array(next.utf8).withUnsafeBytes { bytes in
                (0..<4).map { _ in fresh.next(bytes, at: &freshOffset) }
            }
            for response in responses {
                let bytes = Array(response.utf8)
                for cut in [1, 9, 20, bytes.count / 2, bytes.count - 1, bytes.count] {
                    var reader = HTTP1ResponseReader(requestIsHEAD: !head)
                    var offset = 0
                    bytes[0..<cut].withUnsafeBytes { part in
                        for _ in 0..<8 { _ = reader.next(part, at: &offset) }
                    }
                    reader.restart(requestIsHEAD: head)
                    #expect(Self.reflection(reader) == asNew, "after \(cut) bytes of \(response.debugDescription)")
                    var nextOffset = 0
                    let events = Array(next.utf8).withUnsafeBytes { bytes in
                        (0..<4).map { _ in reader.next(bytes, at: &nextOffset) }
                    }
                    #expect(events == freshEvents)
                }
            }
        }
    }
}
