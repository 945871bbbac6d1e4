#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// Reads one HTTP/1.x response from the raw bytes of an upstream connection (docs/reference/behaviour.md#forwarding):
/// the head through `UpstreamHeadParser` (the one parser of response heads: interim `1xx` heads are skipped there,
/// the fields rewritten for the client, the framing judged), then the body as its head frames it — `chunked`
/// (decoded), `Content-Length` (bytes past it are not read as this response), until the connection closes, or none
/// (`HEAD`, `1xx`, `204`, `304`). Says at the end whether the connection may carry another request. Pure: the
/// transport reads the socket and hands the bytes over; body bytes come back as ranges of the bytes handed over, so
/// nothing is copied here.
///
/// Anything two parsers could read differently ends the response as `.invalid`: a head whose framing
/// `UpstreamHeadParser` distrusts, a status line that is not `HTTP/1.x NNN`, a malformed chunk size, a head or
/// trailer section over `maxHeadBytes`.
public struct HTTP1ResponseReader: Sendable {
    /// A head (status line and fields, interim heads included) or a trailer section larger than this is refused:
    /// libcurl's own limit for a header block (`CURL_MAX_HTTP_HEADER`).
    public static let maxHeadBytes = 100 << 10
    /// A chunk-size line (size and extensions) longer than this is refused.
    static let maxChunkLine = 4 << 10
    /// Hex digits of a chunk size at most (15 keeps the size within `Int`).
    static let maxChunkDigits = 15

    /// What the next bytes made of the response.
    public enum Event: Sendable, Equatable {
        /// Every byte handed over was taken; hand over more.
        case needMore
        /// The final head (never an interim one), rewritten for the client.
        case head(UpstreamResponseHead)
        /// Body bytes: this range of the bytes handed over (de-chunked).
        case body(Range<Int>)
        /// The response is complete. `reusable`: the connection may carry another request (HTTP/1.1 keep-alive,
        /// the body framed by length or chunks).
        case end(reusable: Bool)
        /// The response cannot be read as sent: why. Nothing follows.
        case invalid(String)
        /// The connection ended before the response did (`inputEnded`): why. Nothing follows.
        case truncated(String)
    }

    private enum Body: Sendable, Equatable {
        /// `remaining` bytes of a `Content-Length` body.
        case fixed(remaining: Int)
        case untilClose
        /// A chunk-size line: the size so far, its digits, whether extensions follow, the line's length so far.
        case chunkSize(size: Int, digits: Int, inExtension: Bool, lineBytes: Int)
        /// The chunk-size line's CR was seen: its LF comes next.
        case chunkSizeLF(size: Int)
        case chunkData(remaining: Int)
        /// The CRLF after a chunk's data (`sawCR`: its CR was seen).
        case chunkDataEnd(sawCR: Bool)
        /// Trailer lines after the last chunk: the current line's length, the section's so far.
        case trailer(lineBytes: Int, totalBytes: Int)
    }

    private enum State: Sendable, Equatable {
        case head
        case body(Body)
        /// Complete; `.end` not reported yet.
        case complete(reusable: Bool)
        /// `.end`, `.invalid` or `.truncated` was reported: nothing more is read.
        case finished
    }

    private var requestIsHEAD: Bool
    private var state = State.head
    private var parser = UpstreamHeadParser()
    /// The start of a head line that did not end in the bytes handed over so far.
    private var partialLine: [UInt8] = []
    private var headBytes = 0
    private var expectingStatusLine = true
    /// What the current head says about the connection and its body (the parser takes these fields out of the
    /// client's, and notes them for this reader in `parser.notes`).
    private var http11 = false
    /// The connection closes after this response although its body is framed (`Connection: close`, HTTP/1.0).
    private var keepAliveLost = false
    /// Whether any byte of the response arrived.
    public private(set) var started = false
    /// The response's body is framed by its `Content-Length` (a response that has a body): bytes after its end are
    /// a longer body than the head announced.
    public private(set) var bodyFramedByLength = false

    /// `requestIsHEAD`: the request was `HEAD`, so the response has no body whatever its head says.
    public init(requestIsHEAD: Bool) {
        self.requestIsHEAD = requestIsHEAD
    }

    /// Ready for the next response on the same connection, as a new reader is, but keeping its buffers' capacity:
    /// a new reader in their place allocated the field buffer again and freed the old one, and assigning it over
    /// the old reader copied and destroyed every field (~800 instructions a response;
    /// docs/performance.md#smaller-per-request-costs). Every stored property is set here as `init` sets it
    /// (`HTTP1ResponseReaderTests` compares the two).
    public mutating func restart(requestIsHEAD: Bool) {
        self.requestIsHEAD = requestIsHEAD
        state = .head
        parser.restart()
        partialLine.removeAll(keepingCapacity: partialLine.capacity <= UpstreamHeadParser.keptCapacity)
        headBytes = 0
        expectingStatusLine = true
        http11 = false
        keepAliveLost = false
        started = false
        bodyFramedByLength = false
    }

    /// Whether the final head was read.
    public var headRead: Bool {
        if case .head = state { return false }
        return true
    }

    /// Reads from `input` at `offset` (moved past what was taken) and says what it found. Call again with the same
    /// input until it answers `.needMore`, `.end`, `.invalid` or `.truncated`.
    public mutating func next(_ input: UnsafeRawBufferPointer, at offset: inout Int) -> Event {
        if offset < input.count { started = true }
        switch state {
        case .head:
            return readHead(input, at: &offset)
        case .body(let body):
            return readBody(body, input, at: &offset)
        case .complete(let reusable):
            state = .finished
            return .end(reusable: reusable)
        case .finished:
            return .needMore
        }
    }

    /// The connection ended (the upstream closed it): the end of a body read until close, or a response cut short.
    public mutating func inputEnded() -> Event {
        switch state {
        case .head:
            state = .finished
            let started = self.started
            return .truncated(
                started
                    ? "upstream closed the connection in the response head"
                    : "upstream closed the connection without a response")
        case .body(.untilClose):
            state = .finished
            return .end(reusable: false)
        case .body:
            state = .finished
            return .truncated("upstream closed the connection before the response body ended")
        case .complete(let reusable):
            state = .finished
            return .end(reusable: reusable)
        case .finished:
            return .needMore
        }
    }

    // MARK: head

    private mutating func readHead(_ input: UnsafeRawBufferPointer, at offset: inout Int) -> Event {
        while offset < input.count {
            let rest = UnsafeRawBufferPointer(rebasing: input[offset...])
            // memchr: the head is searched for line ends on every response.
            guard let base = rest.baseAddress, let found = memchr(base, 0x0A, rest.count) else {
                headBytes += rest.count
                guard headBytes <= Self.maxHeadBytes else { return fail("response head larger than 100 KiB") }
                partialLine.append(contentsOf: rest)
                offset = input.count
                return .needMore
            }
            let lineEnd = UnsafeRawPointer(found) - base + 1
            headBytes += lineEnd
            guard headBytes <= Self.maxHeadBytes else { return fail("response head larger than 100 KiB") }
            offset += lineEnd
            let result: Event?
            if partialLine.isEmpty {
                result = headLine(UnsafeRawBufferPointer(rebasing: rest[0..<lineEnd]))
            } else {
                partialLine.append(contentsOf: UnsafeRawBufferPointer(rebasing: rest[0..<lineEnd]))
                let line = partialLine
                partialLine.removeAll(keepingCapacity: true)
                result = line.withUnsafeBytes { headLine($0) }
            }
            if let result { return result }
        }
        return .needMore
    }

    /// One whole line (with its LF): nil to go on, else what to report.
    private mutating func headLine(_ line: UnsafeRawBufferPointer) -> Event? {
        if expectingStatusLine {
            guard Self.isStatusLine(line) else { return fail("not an HTTP/1.x status line") }
            expectingStatusLine = false
            http11 = line[7] == UInt8(ascii: "1")
            parser.notes = UpstreamHeadParser.ConnectionNotes()
        }
        if let head = parser.consume(line) { return headEnded(head) }
        // A blank line that gave no head ended an interim one: a status line comes next.
        if Self.isBlank(line) { expectingStatusLine = true }
        return nil
    }

    private mutating func headEnded(_ head: UpstreamResponseHead) -> Event {
        if let problem = head.framingProblem { return fail("untrustworthy response framing: \(problem)") }
        let notes = parser.notes
        let keepAlive = !notes.close && (http11 || notes.keepAlive)
        if requestIsHEAD || head.status < 200 || head.status == 204 || head.status == 304 {
            // A 101 to a request that asked for no upgrade switches to nothing Backstop speaks.
            state = .complete(reusable: keepAlive && head.status != 101)
        } else if notes.transferEncoding {
            // Only needs to be present: the parser refuses any coding but a lone `chunked`.
            state = .body(.chunkSize(size: 0, digits: 0, inExtension: false, lineBytes: 0))
        } else if let length = head.contentLength {
            bodyFramedByLength = true
            state = length == 0 ? .complete(reusable: keepAlive) : .body(.fixed(remaining: length))
        } else {
            state = .body(.untilClose)
        }
        if !keepAlive, case .body(let body) = state, body != .untilClose {
            // Read to its framed end all the same; the connection is not kept.
            keepAliveLost = true
        }
        return .head(head)
    }

    // MARK: body

    private mutating func readBody(_ body: Body, _ input: UnsafeRawBufferPointer, at offset: inout Int) -> Event {
        var body = body
        while offset < input.count {
            switch body {
            case .fixed(let remaining):
                let n = min(remaining, input.count - offset)
                let range = offset..<(offset + n)
                offset += n
                state = n == remaining ? .complete(reusable: !keepAliveLost) : .body(.fixed(remaining: remaining - n))
                return .body(range)
            case .untilClose:
                let range = offset..<input.count
                offset = input.count
                return .body(range)
            case .chunkData(let remaining):
                let n = min(remaining, input.count - offset)
                let range = offset..<(offset + n)
                offset += n
                state = .body(n == remaining ? .chunkDataEnd(sawCR: false) : .chunkData(remaining: remaining - n))
                return .body(range)
            case .chunkSize(var size, var digits, var inExtension, var lineBytes):
                let byte = input[offset]
                offset += 1
                lineBytes += 1
                guard lineBytes <= Self.maxChunkLine else { return fail("chunk-size line too long") }
                if byte == 0x0A || byte == 0x0D {
                    guard digits > 0 else { return fail("malformed chunk size") }
                    body = byte == 0x0D ? .chunkSizeLF(size: size) : afterSizeLine(size)
                } else if inExtension {
                    // chunk-ext: skipped; a control character other than HTAB cannot be part of it.
                    guard byte >= 0x20 || byte == 0x09 else { return fail("malformed chunk extension") }
                    body = .chunkSize(size: size, digits: digits, inExtension: true, lineBytes: lineBytes)
                } else if let value = Self.hexValue(byte) {
                    digits += 1
                    guard digits <= Self.maxChunkDigits else { return fail("chunk size too large") }
                    size = size << 4 | value
                    body = .chunkSize(size: size, digits: digits, inExtension: false, lineBytes: lineBytes)
                } else if byte == UInt8(ascii: ";") || byte == 0x20 || byte == 0x09, digits > 0 {
                    inExtension = true
                    body = .chunkSize(size: size, digits: digits, inExtension: true, lineBytes: lineBytes)
                } else {
                    return fail("malformed chunk size")
                }
            case .chunkSizeLF(let size):
                guard input[offset] == 0x0A else { return fail("malformed chunk size") }
                offset += 1
                body = afterSizeLine(size)
            case .chunkDataEnd(let sawCR):
                let byte = input[offset]
                offset += 1
                if byte == 0x0D, !sawCR {
                    body = .chunkDataEnd(sawCR: true)
                } else if byte == 0x0A {
                    body = .chunkSize(size: 0, digits: 0, inExtension: false, lineBytes: 0)
                } else {
                    return fail("chunk data not followed by CRLF")
                }
            case .trailer(var lineBytes, var totalBytes):
                let byte = input[offset]
                offset += 1
                totalBytes += 1
                guard totalBytes <= Self.maxHeadBytes else { return fail("trailer section larger than 100 KiB") }
                if byte == 0x0A {
                    if lineBytes == 0 {
                        state = .complete(reusable: !keepAliveLost)
                        return next(input, at: &offset)
                    }
                    lineBytes = 0
                } else if byte != 0x0D || lineBytes > 0 {
                    // A CR counts towards the line only when something came before it (so "\r\n" is blank).
                    lineBytes += 1
                }
                body = .trailer(lineBytes: lineBytes, totalBytes: totalBytes)
            }
        }
        state = .body(body)
        return .needMore
    }

    private func afterSizeLine(_ size: Int) -> Body {
        size == 0 ? .trailer(lineBytes: 0, totalBytes: 0) : .chunkData(remaining: size)
    }

    private mutating func fail(_ why: String) -> Event {
        state = .finished
        return .invalid(why)
    }

    // MARK: byte rules

    /// `HTTP/1.x NNN` followed by a space or the line's end.
    static func isStatusLine(_ line: UnsafeRawBufferPointer) -> Bool {
        // "HTTP/1." compared byte by byte: `starts(with:)` went through the generic sequence path (~300 instructions).
        guard line.count >= 12, line[0] == UInt8(ascii: "H"), line[1] == UInt8(ascii: "T"),
            line[2] == UInt8(ascii: "T"),
            line[3] == UInt8(ascii: "P"), line[4] == UInt8(ascii: "/"), line[5] == UInt8(ascii: "1"),
            line[6] == UInt8(ascii: "."), line[7] == UInt8(ascii: "0") || line[7] == UInt8(ascii: "1"),
            line[8] == 0x20
        else { return false }
        // Three digits, the first 1–9: a status below 100 is neither interim nor final (nginx refuses it too).
        guard line[9] != UInt8(ascii: "0") else { return false }
        for i in 9..<12 where !(line[i] >= 0x30 && line[i] <= 0x39) { return false }
        return line.count == 12 || line[12] == 0x20 || line[12] == 0x0D || line[12] == 0x0A
    }

    static func isBlank(_ line: UnsafeRawBufferPointer) -> Bool {
        line.allSatisfy { $0 == 0x0D || $0 == 0x0A }
    }

    static func hexValue(_ byte: UInt8) -> Int? {
        switch byte {
        case 0x30...0x39: Int(byte - 0x30)
        case 0x41...0x46: Int(byte - 0x41 + 10)
        case 0x61...0x66: Int(byte - 0x61 + 10)
        default: nil
        }
    }
}
