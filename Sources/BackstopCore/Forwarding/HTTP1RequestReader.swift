#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// A request method Backstop's client decoder accepts: the HTTP methods llhttp (the parser it replaced) knows.
/// Methods are case-sensitive (RFC 9110 §9.1); any other is refused as a malformed request line.
public enum HTTP1Method: UInt8, Sendable, CaseIterable {
    case delete, get, head, post, put, connect, options, trace, copy, lock, mkcol, move, propfind, proppatch, search
    case unlock, bind, rebind, unbind, acl, report, mkactivity, checkout, merge, msearch, notify, subscribe
    case unsubscribe, patch, purge, mkcalendar, link, unlink, source, query

    /// The method as sent.
    public var name: StaticString {
        switch self {
        case .delete: "DELETE"
        case .get: "GET"
        case .head: "HEAD"
        case .post: "POST"
        case .put: "PUT"
        case .connect: "CONNECT"
        case .options: "OPTIONS"
        case .trace: "TRACE"
        case .copy: "COPY"
        case .lock: "LOCK"
        case .mkcol: "MKCOL"
        case .move: "MOVE"
        case .propfind: "PROPFIND"
        case .proppatch: "PROPPATCH"
        case .search: "SEARCH"
        case .unlock: "UNLOCK"
        case .bind: "BIND"
        case .rebind: "REBIND"
        case .unbind: "UNBIND"
        case .acl: "ACL"
        case .report: "REPORT"
        case .mkactivity: "MKACTIVITY"
        case .checkout: "CHECKOUT"
        case .merge: "MERGE"
        case .msearch: "M-SEARCH"
        case .notify: "NOTIFY"
        case .subscribe: "SUBSCRIBE"
        case .unsubscribe: "UNSUBSCRIBE"
        case .patch: "PATCH"
        case .purge: "PURGE"
        case .mkcalendar: "MKCALENDAR"
        case .link: "LINK"
        case .unlink: "UNLINK"
        case .source: "SOURCE"
        case .query: "QUERY"
        }
    }

    /// The method these bytes name exactly, or nil.
    static func named(_ bytes: UnsafeRawBufferPointer) -> HTTP1Method? {
        // GET and POST, nearly every request, before the table.
        if bytes.count == 3, bytes[0] == UInt8(ascii: "G"), bytes[1] == UInt8(ascii: "E"), bytes[2] == UInt8(ascii: "T")
        {
            return .get
        }
        for method in allCases where method.name.utf8CodeUnitCount == bytes.count {
            if memcmp(bytes.baseAddress!, method.name.utf8Start, bytes.count) == 0 { return method }
        }
        return nil
    }
}

/// A request head as the client decoder read it: the strings are copies of bytes already checked (a token method,
/// a target of visible ASCII, field names that are tokens, values without control characters).
public struct HTTP1RequestHead: Sendable, Equatable {
    public var method: HTTP1Method
    public var target: String
    /// 0 (HTTP/1.0) or 1 (HTTP/1.1): no other version is read.
    public var minorVersion: Int
    /// Name and value of each field line, in arrival order, as their bytes. The value is without the spaces and
    /// tabs before and after it (RFC 9110 §5.5; llhttp kept those after it).
    public var fields: HeaderFields
    /// A `CONNECT`, or a request with `Upgrade` and `upgrade` listed in `Connection`: what follows its message is
    /// not HTTP, and the reader stops there.
    public var upgrade: Bool

    public init(method: HTTP1Method, target: String, minorVersion: Int, fields: HeaderFields, upgrade: Bool) {
        self.method = method
        self.target = target
        self.minorVersion = minorVersion
        self.fields = fields
        self.upgrade = upgrade
    }

    public static func == (a: Self, b: Self) -> Bool {
        a.method == b.method && a.target == b.target && a.minorVersion == b.minorVersion && a.upgrade == b.upgrade
            && a.fields == b.fields
    }
}

/// Why the client decoder refused the bytes (docs/reference/behaviour.md#request-syntax). Each is answered `400`
/// and the connection closed, `headTooLarge` `431`.
public enum HTTP1RequestError: Error, Sendable, Equatable {
    /// The head (or trailer section) is larger than the limit.
    case headTooLarge
    /// An unknown method, or a request line not `METHOD SP target SP HTTP/1.x CRLF`.
    case method, target, version
    /// A field line that is not `token ":" OWS value OWS CRLF` (obs-fold, a space before the colon, a control
    /// character in the value).
    case field
    /// A line ending in LF alone, or a CR not followed by LF.
    case lineEnding
    /// `Content-Length` with `Transfer-Encoding`, two or malformed `Content-Length`s, a transfer coding list that
    /// does not end in `chunked`.
    case framing
    /// A malformed chunk-size line, a size over 2^60, chunk data not followed by CRLF.
    case chunk
    /// Bytes after a request that does not keep the connection (`Connection: close`, HTTP/1.0 without
    /// `keep-alive`), as llhttp refused them.
    case afterClose
}

/// Reads the requests a client sends on one connection (docs/reference/behaviour.md#request-syntax), strictly by
/// RFC 9112: heads, then bodies as their heads frame them (`Content-Length`, `chunked` de-chunked, none), request
/// after request. After the message of a `CONNECT` or an upgrade request it stops: the bytes after it belong to a
/// tunnel or to another protocol. Pure: the caller hands the bytes over; body bytes come back as ranges of them.
///
/// A head is parsed in one pass once all of it has arrived: until then `next` answers `.needMore` without taking
/// its bytes, and must be handed them again with more (it resumes its search for the head's end where it stopped,
/// so a head that trickles in is not re-read from its start).
public struct HTTP1RequestReader: Sendable {
    /// A chunk-size line (size and extensions) longer than this is refused.
    static let maxChunkLine = 4 << 10
    /// Significant hex digits of a chunk size at most (15 keeps the size within `Int`).
    static let maxChunkDigits = 15

    /// What the next bytes made of the requests.
    public enum Event: Sendable, Equatable {
        /// Every byte that can be taken now was taken; call again with more.
        case needMore
        case head(HTTP1RequestHead)
        /// Body bytes (de-chunked): this range of the bytes handed over.
        case body(Range<Int>)
        /// The request is complete; its trailer fields, when a chunked body had any.
        case end(trailers: [(String, String)]?)
        /// The bytes cannot be read as a request. Nothing follows.
        case invalid(HTTP1RequestError)

        public static func == (a: Self, b: Self) -> Bool {
            switch (a, b) {
            case (.needMore, .needMore): true
            case (.head(let x), .head(let y)): x == y
            case (.body(let x), .body(let y)): x == y
            case (.end(let x), .end(let y)):
                x == nil && y == nil
                    || (x != nil && y != nil && x!.elementsEqual(y!) { $0.0 == $1.0 && $0.1 == $1.1 })
            case (.invalid(let x), .invalid(let y)): x == y
            default: false
            }
        }
    }

    private enum ChunkLine: Sendable {
        case size, extensionName, extensionNameMore, extensionValue, token, quoted, quotedPair, afterQuoted, lf
    }

    private enum State: Sendable {
        /// Awaiting or reading a head: where the search for its end stopped (`Scan`).
        case head(Scan)
        case fixed(remaining: Int)
        case chunkLine(ChunkLine)
        case chunkData(remaining: Int)
        /// The CRLF after a chunk's data (`sawCR`: its CR was seen).
        case chunkDataEnd(sawCR: Bool)
        case trailers(Scan)
        /// The body ended: `.end` comes next.
        case complete(trailers: [(String, String)]?)
        /// After an upgrade's message, or a refusal: nothing more is read.
        case stopped
        /// After a request that does not keep the connection: empty lines are skipped, anything else refused.
        case closed
    }

    private let maxHeadBytes: Int
    private var state = State.head(Scan())
    /// The request being read asked for an upgrade (the reader stops after it).
    private var upgrading = false
    /// The request being read keeps the connection open after it (RFC 9112 §9.3): HTTP/1.1 unless `Connection`
    /// lists `close`, HTTP/1.0 only when it lists `keep-alive`.
    public private(set) var keepAlive = true
    private var chunkSize = 0
    private var chunkDigits = 0
    private var chunkLineBytes = 0

    /// `maxHeadBytes`: the largest head, and the largest trailer section, accepted.
    public init(maxHeadBytes: Int) {
        self.maxHeadBytes = maxHeadBytes
    }

    /// Whether the reader is inside a request (its head started, or its body is not complete): a connection that
    /// ends now ends a request short.
    public var inRequest: Bool {
        switch state {
        case .head(let scan): scan.scanned > 0
        case .stopped, .closed: false
        default: true
        }
    }

    /// Whether the reader stopped for good (after an upgrade's message, or a refusal): the bytes after are not its.
    public var stopped: Bool {
        if case .stopped = state { return true }
        return false
    }

    /// Reads from `input` at `offset` (moved past what was taken) and says what it found. Call again until it
    /// answers `.needMore` or `.invalid`.
    public mutating func next(_ input: UnsafeRawBufferPointer, at offset: inout Int) -> Event {
        switch state {
        case .head(let scan):
            return readHead(input, at: &offset, scan: scan)
        case .complete(let trailers):
            state = upgrading ? .stopped : keepAlive ? .head(Scan()) : .closed
            return .end(trailers: trailers)
        case .stopped:
            return .needMore
        case .closed:
            while offset < input.count, input[offset] == 0x0D || input[offset] == 0x0A { offset += 1 }
            return offset < input.count ? fail(.afterClose) : .needMore
        case .trailers(let scan):
            return readTrailers(input, at: &offset, scan: scan)
        case .fixed(let remaining):
            guard offset < input.count else { return .needMore }
            let n = min(remaining, input.count - offset)
            let range = offset..<(offset + n)
            offset += n
            state = n == remaining ? .complete(trailers: nil) : .fixed(remaining: remaining - n)
            return .body(range)
        case .chunkData(let remaining):
            guard offset < input.count else { return .needMore }
            let n = min(remaining, input.count - offset)
            let range = offset..<(offset + n)
            offset += n
            state = n == remaining ? .chunkDataEnd(sawCR: false) : .chunkData(remaining: remaining - n)
            return .body(range)
        case .chunkLine(let line):
            return readChunkLine(line, input, at: &offset)
        case .chunkDataEnd(let sawCR):
            guard offset < input.count else { return .needMore }
            let byte = input[offset]
            offset += 1
            if !sawCR, byte == 0x0D {
                state = .chunkDataEnd(sawCR: true)
                return next(input, at: &offset)
            }
            guard sawCR, byte == 0x0A else { return fail(.chunk) }
            startChunkLine()
            return next(input, at: &offset)
        }
    }

    // MARK: head

    /// How far the search for the end of a section of lines (a head, a trailer section) went, relative to the
    /// section's start: the bytes searched, and where the line they end in starts.
    struct Scan: Sendable {
        var scanned = 0
        var lineStart = 0
    }

    /// Where a section of lines ending in an empty line ends.
    private enum SectionEnd {
        case at(Int)
        case notYet(Scan)
        case invalid(HTTP1RequestError)
    }

    /// Searches `section` for its empty line, resuming where `scan` stopped: every line must end in CRLF.
    /// `head`: the section starts with a request line (not a trailer section).
    private func sectionEnd(_ section: UnsafeRawBufferPointer, scan: Scan, head: Bool) -> SectionEnd {
        var lineStart = scan.lineStart
        var from = scan.scanned
        while from < section.count {
            guard let found = memchr(section.baseAddress! + from, 0x0A, section.count - from) else { break }
            let lf = UnsafeRawPointer(found) - section.baseAddress!
            guard lf > lineStart, section[lf - 1] == 0x0D else {
                // An LF alone ends no line here (a blank line of a bare LF included).
                return .invalid(.lineEnding)
            }
            if lf - 1 == lineStart { return lf + 1 > maxHeadBytes ? .invalid(.headTooLarge) : .at(lf + 1) }
            // A line that starts with a CR is the empty line or no line at all: `\r\r\n` does not end a head.
            if section[lineStart] == 0x0D { return .invalid(.lineEnding) }
            // A request line without ` HTTP/x.y` (HTTP/0.9's `GET /`) is refused as soon as it ends: no empty line
            // will follow it, so waiting for one would only wait out header_timeout.
            if head, lineStart == 0, !Self.endsWithVersion(section, lineEnd: lf - 1) { return .invalid(.version) }
            lineStart = lf + 1
            from = lineStart
        }
        return section.count > maxHeadBytes
            ? .invalid(.headTooLarge) : .notYet(Scan(scanned: section.count, lineStart: lineStart))
    }

    /// Whether the line ending at `lineEnd` (its CR) ends in a space and a version this reader takes.
    private static func endsWithVersion(_ section: UnsafeRawBufferPointer, lineEnd: Int) -> Bool {
        lineEnd >= 9 && section[lineEnd - 9] == 0x20 && minorVersion(section, at: lineEnd - 8) != nil
    }

    /// The minor version of the `HTTP/1.0` or `HTTP/1.1` at `i` (8 bytes), else nil: the only versions read.
    private static func minorVersion(_ p: UnsafeRawBufferPointer, at i: Int) -> Int? {
        guard p.count - i >= 8, p[i] == UInt8(ascii: "H"), p[i + 1] == UInt8(ascii: "T"),
            p[i + 2] == UInt8(ascii: "T"), p[i + 3] == UInt8(ascii: "P"), p[i + 4] == UInt8(ascii: "/"),
            p[i + 5] == UInt8(ascii: "1"), p[i + 6] == UInt8(ascii: "."),
            p[i + 7] == UInt8(ascii: "0") || p[i + 7] == UInt8(ascii: "1")
        else { return nil }
        return Int(p[i + 7] - 0x30)
    }

    private mutating func readHead(_ input: UnsafeRawBufferPointer, at offset: inout Int, scan: Scan) -> Event {
        if scan.scanned == 0 {
            // Empty lines before a request line are skipped (RFC 9112 §2.2), as CRLF pairs only.
            while input.count - offset >= 2, input[offset] == 0x0D, input[offset + 1] == 0x0A { offset += 2 }
            if input.count - offset == 1, input[offset] == 0x0D { return .needMore }
        }
        guard offset < input.count else { return .needMore }
        let section = UnsafeRawBufferPointer(rebasing: input[offset...])
        switch sectionEnd(section, scan: scan, head: true) {
        case .notYet(let scan):
            state = .head(scan)
            return .needMore
        case .invalid(let error):
            return fail(error)
        case .at(let end):
            switch parseHead(UnsafeRawBufferPointer(rebasing: section[0..<end])) {
            case .success(let head):
                offset += end
                return .head(head)
            case .failure(let error):
                return fail(error)
            }
        }
    }

    /// The head, from its request line to its empty line (every line known to end in CRLF), and the body that
    /// follows it.
    private mutating func parseHead(_ p: UnsafeRawBufferPointer) -> Result<HTTP1RequestHead, HTTP1RequestError> {
        var i = 0
        while HTTPSyntax.isTokenByte(p[i]) { i += 1 }
        guard i > 0, p[i] == 0x20, let method = HTTP1Method.named(UnsafeRawBufferPointer(rebasing: p[0..<i])) else {
            return .failure(.method)
        }
        i += 1
        let targetStart = i
        while p[i] > 0x20, p[i] < 0x7F { i += 1 }
        guard i > targetStart, p[i] == 0x20 else { return .failure(.target) }
        guard
            method == .connect || Self.isOriginAbsoluteOrAsterisk(UnsafeRawBufferPointer(rebasing: p[targetStart..<i]))
        else { return .failure(.target) }
        let target = String(decoding: UnsafeRawBufferPointer(rebasing: p[targetStart..<i]), as: UTF8.self)
        i += 1
        guard p.count - i >= 10, let minorVersion = Self.minorVersion(p, at: i), p[i + 8] == 0x0D else {
            return .failure(.version)
        }
        guard p[i + 9] == 0x0A else { return .failure(.lineEnding) }
        i += 10

        // The field section is kept as one copy of its bytes; each field is ranges of it (no string per field).
        let sectionStart = i
        let sectionCount = p.count - 2 - sectionStart
        // Reserved, then appended: `Array(unsafeUninitializedCapacity:)` allocates through an unspecialized path
        // that looks up the array's generic metadata each time (~600 instructions a request,
        // docs/performance.md#the-request-cores-values).
        var section: [UInt8] = []
        if sectionCount > 0 {
            section.reserveCapacity(sectionCount)
            section.append(contentsOf: UnsafeRawBufferPointer(rebasing: p[sectionStart..<sectionStart + sectionCount]))
        }
        var lines: [HeaderFields.Line] = []
        lines.reserveCapacity(16)
        var contentLength: Int?
        var lengthFields = 0
        var codings = false
        var chunked = false
        var upgradeField = false
        var connectionUpgrade = false
        var connectionClose = false
        var connectionKeepAlive = false
        while p[i] != 0x0D {
            var fieldError = HTTP1RequestError.field
            guard let (nameEnd, valueStart, valueEnd, next) = Self.fieldLine(p, from: i, error: &fieldError) else {
                return .failure(fieldError)
            }
            let name = UnsafeRawBufferPointer(rebasing: p[i..<nameEnd])
            let value = UnsafeRawBufferPointer(rebasing: p[valueStart..<valueEnd])
            switch name.count {
            // An empty `Upgrade` names no protocol: not an upgrade (llhttp's rule, found by the request-decoder
            // fuzz target).
            case 7 where HeaderName.equals(name, "upgrade"): upgradeField = upgradeField || !value.isEmpty
            case 10 where HeaderName.equals(name, "connection"):
                FramingTally.forEachElement(of: value) {
                    if HeaderName.equals($0, "upgrade") { connectionUpgrade = true }
                    if HeaderName.equals($0, "close") { connectionClose = true }
                    if HeaderName.equals($0, "keep-alive") { connectionKeepAlive = true }
                }
            case 14 where HeaderName.equals(name, "content-length"):
                // One length only, digits only: `5, 5` and a repeated field are refused, as llhttp does.
                lengthFields += 1
                let (_, end) = UpstreamHeadParser.trimmed(value, 0, value.count)
                contentLength = HTTPSyntax.decimal(UnsafeRawBufferPointer(rebasing: value[0..<end]))
                guard lengthFields == 1, contentLength != nil else { return .failure(.framing) }
            case 17 where HeaderName.equals(name, "transfer-encoding"):
                // The codings of every field in order: tokens, `chunked` once and last (RFC 9112 §6.1), with nothing
                // after it, not even a space (llhttp's rule).
                codings = true
                var valid = true
                FramingTally.forEachElement(of: value) { coding in
                    if chunked || !HTTPSyntax.isToken(coding) { valid = false }
                    chunked = HeaderName.equals(coding, "chunked")
                }
                // The line's last byte before its CRLF: the value itself comes without its trailing OWS.
                if chunked, p[next &- 3] == 0x20 || p[next &- 3] == 0x09 { valid = false }
                guard valid else { return .failure(.framing) }
            default: break
            }
            lines.append(
                HeaderFields.Line(
                    nameStart: i - sectionStart, nameEnd: nameEnd - sectionStart, valueStart: valueStart - sectionStart,
                    valueEnd: valueEnd - sectionStart))
            i = next
        }
        guard i == p.count - 2 else { return .failure(.lineEnding) }
        let fields = HeaderFields(checkedSection: section, lines: lines)
        // RFC 9112 §6.1 and §6.3: a request whose length two parsers could read differently is refused.
        if codings && (contentLength != nil || !chunked) { return .failure(.framing) }
        upgrading = method == .connect || (upgradeField && connectionUpgrade)
        // llhttp's rule: HTTP/1.1 unless `close` is listed, HTTP/1.0 only when `keep-alive` is.
        keepAlive = minorVersion == 1 ? !connectionClose : connectionKeepAlive
        if method == .connect {
            state = .complete(trailers: nil)
        } else if chunked {
            startChunkLine()
        } else if let contentLength, contentLength > 0 {
            state = .fixed(remaining: contentLength)
        } else {
            state = .complete(trailers: nil)
        }
        return .success(
            HTTP1RequestHead(
                method: method, target: target, minorVersion: minorVersion, fields: fields, upgrade: upgrading))
    }

    /// A request target of a method other than CONNECT (RFC 9112 §3.2): origin-form (`/…`), `*`, or absolute-form
    /// (`scheme://…`, the scheme an RFC 3986 one, no `#` before the path or query); authority-form belongs to
    /// CONNECT. llhttp's URL grammar refused the rest before the head (found by the request-decoder fuzz target:
    /// `OPTIONS host:8` was answered 403 no-route).
    static func isOriginAbsoluteOrAsterisk(_ target: UnsafeRawBufferPointer) -> Bool {
        if target[0] == UInt8(ascii: "/") || (target.count == 1 && target[0] == UInt8(ascii: "*")) { return true }
        guard (target[0] | 0x20) >= UInt8(ascii: "a"), (target[0] | 0x20) <= UInt8(ascii: "z") else { return false }
        var i = 1
        while i < target.count {
            let b = target[i]
            if b == UInt8(ascii: ":") {
                guard target.count - i >= 3, target[i + 1] == UInt8(ascii: "/"), target[i + 2] == UInt8(ascii: "/")
                else { return false }
                // A fragment may follow a path or a query, not the authority itself: llhttp refused `http://h#x`
                // (found by the request-decoder fuzz target), where `RequestTarget` would drop `#x` and go on.
                var j = i + 3
                while j < target.count, target[j] != UInt8(ascii: "/"), target[j] != UInt8(ascii: "?") {
                    if target[j] == UInt8(ascii: "#") { return false }
                    j += 1
                }
                return true
            }
            let letter = (b | 0x20) >= UInt8(ascii: "a") && (b | 0x20) <= UInt8(ascii: "z")
            let digit = b >= UInt8(ascii: "0") && b <= UInt8(ascii: "9")
            guard letter || digit || b == UInt8(ascii: "+") || b == UInt8(ascii: "-") || b == UInt8(ascii: ".") else {
                return false
            }
            i += 1
        }
        return false
    }

    /// One field line starting at `i` (known to end in CRLF): where its name ends, where its value starts and ends
    /// (the spaces and tabs before and after it left out), where the next line starts; nil when it is not a valid
    /// field line.
    /// Inlined: as a call, its prologue and the tuple returned through memory cost ~45 instructions a field
    /// (docs/performance.md#parsing-heads).
    @inline(__always)
    private static func fieldLine(
        _ p: UnsafeRawBufferPointer, from start: Int, error: inout HTTP1RequestError
    ) -> (Int, Int, Int, Int)? {
        // `&+=`: the line's CR stops both loops long before an index could overflow, and an overflow check per
        // byte was a fifth of the loop over the name (docs/performance.md#parsing-heads).
        var i = start
        while HTTPSyntax.isTokenByte(p[i]) { i &+= 1 }
        guard i > start, p[i] == UInt8(ascii: ":") else { return nil }
        let nameEnd = i
        i += 1
        while p[i] == 0x20 || p[i] == 0x09 { i &+= 1 }
        let valueStart = i
        i = HTTPSyntax.fieldValueEnd(in: p, from: i)
        // Trailing OWS is not part of the value (RFC 9110 §5.5), as nginx and HAProxy read it: `X-Foo:  bar  `
        // goes upstream as `bar`, and a `traceparent` followed by a space is still read.
        var valueEnd = i
        while valueEnd > valueStart && (p[valueEnd &- 1] == 0x20 || p[valueEnd &- 1] == 0x09) { valueEnd &-= 1 }
        guard p[i] == 0x0D else { return nil }
        guard p[i + 1] == 0x0A else {
            error = .lineEnding
            return nil
        }
        return (nameEnd, valueStart, valueEnd, i + 2)
    }

    // MARK: chunked body

    private mutating func startChunkLine() {
        chunkSize = 0
        chunkDigits = 0
        chunkLineBytes = 0
        state = .chunkLine(.size)
    }

    /// `chunk-size [ chunk-ext ] CRLF` (RFC 9112 §7.1), extensions without whitespace:
    /// `*( ";" token [ "=" ( token / quoted-string ) ] )`.
    private mutating func readChunkLine(
        _ line: ChunkLine, _ input: UnsafeRawBufferPointer, at offset: inout Int
    )
        -> Event
    {
        var line = line
        while offset < input.count {
            let byte = input[offset]
            offset += 1
            chunkLineBytes += 1
            guard chunkLineBytes <= Self.maxChunkLine else { return fail(.chunk) }
            switch line {
            case .size:
                if let value = HTTP1ResponseReader.hexValue(byte) {
                    if chunkSize > 0 || value > 0 { chunkDigits += 1 }
                    guard chunkDigits <= Self.maxChunkDigits else { return fail(.chunk) }
                    chunkSize = chunkSize << 4 | value
                } else if chunkLineBytes > 1, byte == UInt8(ascii: ";") {
                    line = .extensionName
                } else if chunkLineBytes > 1, byte == 0x0D {
                    line = .lf
                } else {
                    return fail(.chunk)
                }
            case .extensionName, .extensionNameMore:
                if HTTPSyntax.isTokenByte(byte) {
                    line = .extensionNameMore
                } else if line == .extensionNameMore, byte == UInt8(ascii: "=") {
                    line = .extensionValue
                } else if line == .extensionNameMore, byte == UInt8(ascii: ";") {
                    line = .extensionName
                } else if line == .extensionNameMore, byte == 0x0D {
                    line = .lf
                } else {
                    return fail(.chunk)
                }
            case .extensionValue:
                if byte == UInt8(ascii: "\"") {
                    line = .quoted
                } else if HTTPSyntax.isTokenByte(byte) {
                    line = .token
                } else {
                    return fail(.chunk)
                }
            case .token, .afterQuoted:
                if line == .token, HTTPSyntax.isTokenByte(byte) {
                } else if byte == UInt8(ascii: ";") {
                    line = .extensionName
                } else if byte == 0x0D {
                    line = .lf
                } else {
                    return fail(.chunk)
                }
            case .quoted:
                // qdtext: HTAB, SP, visible characters but `"` and `\`, obs-text.
                if byte == UInt8(ascii: "\"") {
                    line = .afterQuoted
                } else if byte == UInt8(ascii: "\\") {
                    line = .quotedPair
                } else if !HTTPSyntax.isFieldValueByte(byte) {
                    return fail(.chunk)
                }
            case .quotedPair:
                guard HTTPSyntax.isFieldValueByte(byte) else { return fail(.chunk) }
                line = .quoted
            case .lf:
                guard byte == 0x0A else { return fail(.lineEnding) }
                if chunkSize == 0 {
                    state = .trailers(Scan())
                    return readTrailers(input, at: &offset, scan: Scan())
                }
                state = .chunkData(remaining: chunkSize)
                return next(input, at: &offset)
            }
        }
        state = .chunkLine(line)
        return .needMore
    }

    /// The trailer section after the last chunk: field lines, then an empty line. Read whole, like a head.
    private mutating func readTrailers(_ input: UnsafeRawBufferPointer, at offset: inout Int, scan: Scan) -> Event {
        guard offset < input.count else { return .needMore }
        let section = UnsafeRawBufferPointer(rebasing: input[offset...])
        if scan.scanned == 0, section[0] == 0x0D {
            // No trailer fields (nearly every chunked body): the CRLF that ends the body.
            guard section.count >= 2 else { return .needMore }
            guard section[1] == 0x0A else { return fail(.lineEnding) }
            offset += 2
            state = .complete(trailers: nil)
            return next(input, at: &offset)
        }
        switch sectionEnd(section, scan: scan, head: false) {
        case .notYet(let scan):
            state = .trailers(scan)
            return .needMore
        case .invalid(let error):
            return fail(error)
        case .at(let end):
            var fields: [(String, String)] = []
            var i = 0
            while section[i] != 0x0D {
                var fieldError = HTTP1RequestError.field
                guard let (nameEnd, valueStart, valueEnd, next) = Self.fieldLine(section, from: i, error: &fieldError)
                else { return fail(fieldError) }
                // A framing field after the body can only confuse whoever reads it (RFC 9110 §6.5.1): refused, as
                // llhttp refuses it (found by the request-decoder fuzz target).
                let name = UnsafeRawBufferPointer(rebasing: section[i..<nameEnd])
                if HeaderName.equals(name, "content-length") || HeaderName.equals(name, "transfer-encoding") {
                    return fail(.framing)
                }
                fields.append(
                    (
                        String(decoding: name, as: UTF8.self),
                        String(
                            decoding: UnsafeRawBufferPointer(rebasing: section[valueStart..<valueEnd]), as: UTF8.self)
                    ))
                i = next
            }
            guard i == end - 2 else { return fail(.lineEnding) }
            offset += end
            state = .complete(trailers: fields)
            return next(input, at: &offset)
        }
    }

    private mutating func fail(_ error: HTTP1RequestError) -> Event {
        state = .stopped
        return .invalid(error)
    }
}
