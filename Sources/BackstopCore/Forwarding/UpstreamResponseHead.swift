/// The head of an upstream response, already rewritten for the client (docs/reference/behaviour.md#forwarding), plus what the
/// exchange decides on: status, framing, and the retry hints.
///
/// `fields` holds the header lines the client gets, `Name: value\r\n` each, in arrival order: hop-by-hop fields
/// (RFC 9110 §7.6.1 and every name listed in `Connection`), framing (`Content-Length`, `Transfer-Encoding`),
/// `Via` and Backstop's own `X-Backstop-*` are taken out, and so is any line that is not a valid field (a name
/// that is not a token, a value with a control character other than HTAB): nothing the upstream sends can inject
/// a line into the client's response. Kept as bytes because this runs for every response: the client head is
/// written by copying them once.
public struct UpstreamResponseHead: Sendable, Equatable {
    /// Every field lives in one copy-on-write box: a head passes from the transport thread through events and the
    /// machines' actions to the writer, and moving or copying it is then one reference, not nine fields' worth of
    /// retains, and no action needs a box of its own to stay small (docs/performance.md).
    private var storage: Storage

    public var status: Int {
        get { storage.status }
        set { unique().status = newValue }
    }
    /// The protocol version the upstream spoke, as `Via` writes it: `1.1`, `1.0`, `2`.
    public var version: String {
        get { storage.version }
        set { unique().version = newValue }
    }
    public var fields: [UInt8] {
        get { storage.fields }
        set { unique().fields = newValue }
    }
    /// The upstream's `Content-Length`, when it sent a valid one.
    public var contentLength: Int? {
        get { storage.contentLength }
        set { unique().contentLength = newValue }
    }
    /// The upstream's own `Via` values, comma-joined (Backstop appends itself).
    public var via: String? {
        get { storage.via }
        set { unique().via = newValue }
    }
    /// `Retry-After` and `X-RateLimit-Reset` as sent (they also stay in `fields`).
    public var retryAfter: String? {
        get { storage.retryAfter }
        set { unique().retryAfter = newValue }
    }
    public var rateLimitReset: String? {
        get { storage.rateLimitReset }
        set { unique().rateLimitReset = newValue }
    }
    /// Why the head's body framing cannot be trusted (`Content-Length` with `Transfer-Encoding`, differing or
    /// malformed lengths, a transfer coding other than `chunked`), or nil when it is sound. Such a head is never
    /// relayed: a proxy and its client could disagree about where the body ends (response splitting).
    public var framingProblem: String? {
        get { storage.framingProblem }
        set { unique().framingProblem = newValue }
    }
    /// Where the values of `Location` and `Content-Location` lines sit in `fields` (for `RedirectRewriter`).
    public var redirectValueRanges: [Range<Int>] {
        get { storage.redirectValueRanges }
        set { unique().redirectValueRanges = newValue }
    }

    public init(
        status: Int, version: String = "1.1", fields: [UInt8] = [], contentLength: Int? = nil, via: String? = nil,
        retryAfter: String? = nil, rateLimitReset: String? = nil, framingProblem: String? = nil,
        redirectValueRanges: [Range<Int>] = []
    ) {
        storage = Storage(
            status: status, version: version, fields: fields, contentLength: contentLength, via: via,
            retryAfter: retryAfter, rateLimitReset: rateLimitReset, framingProblem: framingProblem,
            redirectValueRanges: redirectValueRanges)
    }

    /// The box, copied first when another head shares it.
    private mutating func unique() -> Storage {
        if !isKnownUniquelyReferenced(&storage) { storage = storage.copy() }
        return storage
    }

    public static func == (lhs: UpstreamResponseHead, rhs: UpstreamResponseHead) -> Bool {
        lhs.storage === rhs.storage || lhs.storage.hasSameFields(as: rhs.storage)
    }

    /// `@unchecked Sendable`: its fields change only through `unique()`, that is while the head changing it holds
    /// the only reference (copy on write), so no other head, on this thread or another, can see a change; a
    /// shared box is only ever read.
    private final class Storage: @unchecked Sendable {
        var status: Int
        var version: String
        var fields: [UInt8]
        var contentLength: Int?
        var via: String?
        var retryAfter: String?
        var rateLimitReset: String?
        var framingProblem: String?
        var redirectValueRanges: [Range<Int>]

        init(
            status: Int, version: String, fields: [UInt8], contentLength: Int?, via: String?, retryAfter: String?,
            rateLimitReset: String?, framingProblem: String?, redirectValueRanges: [Range<Int>]
        ) {
            self.status = status
            self.version = version
            self.fields = fields
            self.contentLength = contentLength
            self.via = via
            self.retryAfter = retryAfter
            self.rateLimitReset = rateLimitReset
            self.framingProblem = framingProblem
            self.redirectValueRanges = redirectValueRanges
        }

        func copy() -> Storage {
            Storage(
                status: status, version: version, fields: fields, contentLength: contentLength, via: via,
                retryAfter: retryAfter, rateLimitReset: rateLimitReset, framingProblem: framingProblem,
                redirectValueRanges: redirectValueRanges)
        }

        func hasSameFields(as other: Storage) -> Bool {
            status == other.status && version == other.version && fields == other.fields
                && contentLength == other.contentLength && via == other.via && retryAfter == other.retryAfter
                && rateLimitReset == other.rateLimitReset && framingProblem == other.framingProblem
                && redirectValueRanges == other.redirectValueRanges
        }
    }

    /// The fields as name/value pairs (for tests and diagnostics; the data path copies `fields` as bytes).
    public var fieldPairs: [(name: String, value: String)] {
        var pairs: [(name: String, value: String)] = []
        var start = 0
        while start < fields.count {
            var end = start
            while end + 1 < fields.count, !(fields[end] == 0x0D && fields[end + 1] == 0x0A) { end += 1 }
            let line = fields[start..<end]
            if let colon = line.firstIndex(of: 0x3A) {
                let name = String(decoding: line[..<colon], as: UTF8.self)
                var valueStart = colon + 1
                if valueStart < end, fields[valueStart] == 0x20 { valueStart += 1 }
                pairs.append((name: name, value: String(decoding: fields[valueStart..<end], as: UTF8.self)))
            }
            start = end + 2
        }
        return pairs
    }

    /// The first value of a client-bound field, case-insensitively.
    public func field(_ name: String) -> String? {
        fieldPairs.first { $0.name.caseInsensitiveEquals(name) }?.value
    }

    /// Rewrites the `Location` and `Content-Location` values `rewriter` maps to the client's view (a rare path:
    /// only heads that carry such fields pay for it).
    public mutating func rewriteRedirects(_ rewriter: RedirectRewriter) {
        guard !redirectValueRanges.isEmpty else { return }
        var rebuilt: [UInt8] = []
        rebuilt.reserveCapacity(fields.count + 64)
        var copied = 0
        for range in redirectValueRanges {
            let value = String(decoding: fields[range], as: UTF8.self)
            guard let replacement = rewriter.rewrite(value) else { continue }
            rebuilt.append(contentsOf: fields[copied..<range.lowerBound])
            rebuilt.append(contentsOf: replacement.utf8)
            copied = range.upperBound
        }
        guard copied > 0 else { return }
        rebuilt.append(contentsOf: fields[copied...])
        fields = rebuilt
        redirectValueRanges = []
    }
}

/// Builds an `UpstreamResponseHead` from header lines as libcurl hands them over, one call per line (status line,
/// fields, obs-fold continuations, the blank line that ends a head). Interim `1xx` heads (other than `101`) are
/// skipped; trailer lines after the final head are ignored. Pure and allocation-light: the lines are parsed as
/// bytes and copied once into `fields`.
public struct UpstreamHeadParser: Sendable {
    private var status = 0
    private var version = ""
    private var fields: [UInt8] = []
    private var contentLength: Int?
    private var via: String?
    private var retryAfter: String?
    private var rateLimitReset: String?
    /// Framing evidence, judged when the head ends (kept as a few scalars: this runs for every response).
    private var framing = FramingTally()
    private var redirectValueRanges: [Range<Int>] = []
    /// Names listed in `Connection` (lowercased), to be taken out of `fields` when the head ends.
    private var connectionListed: Set<String> = []
    /// Where an obs-fold continuation line goes: the field it continues.
    private enum LastLine { case none, field, location, via, retryAfter, rateLimitReset, framing, dropped }
    private var lastLine = LastLine.none
    /// The final head was produced: further lines are trailers.
    public private(set) var finished = false
    /// A line was read: what it gathered, if anything, is cleared by the next status line. Before the first line
    /// everything is as `init` left it, and a status line has nothing to clear (nearly every response has one head).
    private var lineRead = false
    /// What the `Connection` and `Transfer-Encoding` lines said, read from each line as sent (its value valid or
    /// not), for `HTTP1ResponseReader`: it decides on them whether the connection is kept and whether the body is
    /// chunked. The parser never clears them; the reader does, at each status line it reads (not at one inside a head,
    /// which the parser takes for a new head). Noted here because the parser classifies every name anyway: the reader
    /// looking at each line again for these two cost ~600 instructions a response (docs/performance.md#parsing-heads).
    struct ConnectionNotes: Sendable, Equatable {
        /// `Connection` lists `close`.
        var close = false
        /// `Connection` lists `keep-alive`.
        var keepAlive = false
        /// A `Transfer-Encoding` line (whatever its codings: the framing verdict refuses all but one `chunked`).
        var transferEncoding = false
    }
    var notes = ConnectionNotes()

    public init() { fields.reserveCapacity(512) }

    /// The most buffer capacity `restart` keeps: what a large head grew is not held for every later response.
    static let keptCapacity = 4096

    /// As `init` leaves a parser, keeping the field buffer's capacity (when no head it made still shares the buffer,
    /// else the buffer is made again, as `init` makes it). Every stored property is set here as `init` sets it.
    mutating func restart() {
        status = 0
        version = ""
        if fields.capacity <= Self.keptCapacity {
            fields.removeAll(keepingCapacity: true)
        } else {
            fields = []
            fields.reserveCapacity(512)
        }
        contentLength = nil
        via = nil
        retryAfter = nil
        rateLimitReset = nil
        framing = FramingTally()
        if !redirectValueRanges.isEmpty { redirectValueRanges = [] }
        if !connectionListed.isEmpty { connectionListed = [] }
        lastLine = .none
        finished = false
        lineRead = false
        notes = ConnectionNotes()
    }

    /// Feeds one line (with or without its CRLF); returns the head when this line completed a final one.
    public mutating func consume(_ line: UnsafeRawBufferPointer) -> UpstreamResponseHead? {
        guard !finished else { return nil }
        defer { lineRead = true }
        var end = line.count
        while end > 0, line[end - 1] == 0x0A || line[end - 1] == 0x0D { end -= 1 }
        if end == 0 { return headEnded() }
        if end > 5, line[0] == 0x48, line[1] == 0x54, line[2] == 0x54, line[3] == 0x50, line[4] == 0x2F {  // "HTTP/"
            statusLine(line, end: end)
            return nil
        }
        if line[0] == 0x20 || line[0] == 0x09 {
            continuation(line, end: end)
            return nil
        }
        fieldLine(line, end: end)
        return nil
    }

    /// "HTTP/1.1 200 OK" or "HTTP/2 200": starts a new head (an interim one's fields are forgotten).
    private mutating func statusLine(_ line: UnsafeRawBufferPointer, end: Int) {
        var space = 5
        while space < end, line[space] != 0x20 { space += 1 }
        version = Self.version(UnsafeRawBufferPointer(rebasing: line[5..<space]))
        var code = 0
        var digits = 0
        var i = space + 1
        while i < end, digits < 3, line[i] >= 0x30, line[i] <= 0x39 {
            code = code * 10 + Int(line[i] - 0x30)
            i += 1
            digits += 1
        }
        status = digits == 3 ? code : 0
        guard lineRead else { return }
        fields.removeAll(keepingCapacity: true)
        contentLength = nil
        via = nil
        retryAfter = nil
        rateLimitReset = nil
        framing = FramingTally()
        redirectValueRanges = []
        connectionListed = []
        lastLine = .none
    }

    /// `Content-Length : 5`: RFC 9112 §5.1 forbids the space, and parsers differ on it. An ordinary field written so
    /// is dropped; a framing field makes the framing untrustworthy (nginx refuses such a response too).
    private mutating func spaceBeforeColon(_ line: UnsafeRawBufferPointer, nameEnd: Int, end: Int) {
        var colon = nameEnd
        while colon < end, line[colon] == 0x20 || line[colon] == 0x09 { colon &+= 1 }
        guard colon < end, line[colon] == 0x3A else { return }
        let kind = HeaderName.classify(UnsafeRawBufferPointer(rebasing: line[0..<nameEnd]))
        if kind == .contentLength || (kind == .hopByHop && nameEnd == 17) { framing.spaceBeforeColon = true }
    }

    /// The version as `Via` writes it: the three an upstream speaks are literals, anything else is decoded (making
    /// a string of `1.1` cost ~150 instructions a response).
    private static func version(_ bytes: UnsafeRawBufferPointer) -> String {
        if bytes.count == 3, bytes[0] == UInt8(ascii: "1"), bytes[1] == UInt8(ascii: ".") {
            if bytes[2] == UInt8(ascii: "1") { return "1.1" }
            if bytes[2] == UInt8(ascii: "0") { return "1.0" }
        }
        if bytes.count == 1, bytes[0] == UInt8(ascii: "2") { return "2" }
        return String(decoding: bytes, as: UTF8.self)
    }

    private mutating func headEnded() -> UpstreamResponseHead? {
        if status < 100 {
            // No status, or one below 100 (`HTTP/1.1 099`): neither an interim head nor a final one. Ended here, as
            // a head nobody can frame, rather than waited past.
            finished = true
            return UpstreamResponseHead(status: 0, version: version, framingProblem: "no valid status code")
        }
        // 1xx interim heads (100 Continue, 103 Early Hints) are not forwarded; 101 is final.
        guard status >= 200 || status == 101 else {
            status = 0
            fields.removeAll(keepingCapacity: true)
            framing = FramingTally()
            lastLine = .none
            return nil
        }
        finished = true
        if !connectionListed.isEmpty { removeConnectionListed() }
        return UpstreamResponseHead(
            status: status, version: version, fields: fields, contentLength: contentLength, via: via,
            retryAfter: retryAfter, rateLimitReset: rateLimitReset, framingProblem: framingProblem(),
            redirectValueRanges: connectionListed.isEmpty ? redirectValueRanges : [])
    }

    /// RFC 9112 §6.3 read as a proxy must: anything two parsers could frame differently is refused. Identical
    /// repeated lengths are accepted (RFC 9110 §8.6); the only transfer coding accepted is one `chunked`, as
    /// nginx does (curl decodes nothing else, so another coding would reach the client undeclared).
    private func framingProblem() -> String? {
        // RFC 9112 §6.1: an HTTP/1.0 message with Transfer-Encoding has faulty framing, whatever else it says.
        if framing.codings > 0, version == "1.0" { return "Transfer-Encoding in an HTTP/1.0 response" }
        return framing.problem
    }

    private mutating func fieldLine(_ line: UnsafeRawBufferPointer, end: Int) {
        // The name is checked while the colon is looked for (one pass over it): a byte that is not a token byte
        // before any colon makes the line invalid, whether a colon follows or not.
        var colon = 0
        while colon < end, line[colon] != 0x3A {
            guard HTTPSyntax.isTokenByte(line[colon]) else {
                if line[colon] == 0x20 || line[colon] == 0x09 { spaceBeforeColon(line, nameEnd: colon, end: end) }
                lastLine = .dropped
                return
            }
            colon &+= 1
        }
        guard colon > 0, colon < end else {
            lastLine = .dropped
            return
        }
        let (start, stop) = Self.trimmed(line, colon + 1, end)
        let name = UnsafeRawBufferPointer(rebasing: line[0..<colon])
        let kind = HeaderName.classify(name)
        // Of the hop-by-hop names, `transfer-encoding` is the only one of 17 bytes, and `connection` the one of 10
        // that is not `keep-alive`: the name is not compared again.
        let isTransferEncoding = kind == .hopByHop && colon == 17
        let isConnection = kind == .hopByHop && colon == 10 && line[0] | 0x20 == UInt8(ascii: "c")
        let valid = Self.isFieldValue(line, start, stop)
        let value = UnsafeRawBufferPointer(rebasing: line[start..<stop])
        if isConnection {
            connectionLine(value, valid: valid, sent: UnsafeRawBufferPointer(rebasing: line[(colon + 1)..<end]))
        } else if isTransferEncoding {
            notes.transferEncoding = true
        }
        guard valid else {
            // A framing field that cannot be read as sent is framing nobody can agree on.
            if kind == .contentLength || isTransferEncoding { framing.malformedLength = true }
            lastLine = .dropped
            return
        }
        switch kind {
        case .hopByHop:
            if isTransferEncoding {
                framing.addCodings(value)
                lastLine = .framing
                return
            }
            lastLine = .dropped
        case .contentLength:
            // Every value is kept for the framing check when the head ends (`5, 82` is two values).
            framing.addLengths(value)
            if contentLength == nil { contentLength = framing.firstLength }
            lastLine = .framing
        case .via:
            let text = String(decoding: value, as: UTF8.self)
            // Appended in place: a new string per field made many `Via` fields quadratic.
            if via == nil { via = text } else { via!.append(", " + text) }
            lastLine = .via
        case .backstopOwn:
            lastLine = .dropped
        case .retryAfter:
            if retryAfter == nil { retryAfter = String(decoding: value, as: UTF8.self) }
            appendField(line, colon: colon, start, stop)
        case .rateLimitReset:
            if rateLimitReset == nil { rateLimitReset = String(decoding: value, as: UTF8.self) }
            appendField(line, colon: colon, start, stop)
        case .location:
            let valueAt = fields.count + name.count + 2
            appendField(line, colon: colon, start, stop)
            redirectValueRanges.append(valueAt..<(valueAt + value.count))
            lastLine = .location
        case .host, .expect, .other:
            appendField(line, colon: colon, start, stop)
        }
    }

    /// A `Connection` line (`value` trimmed, `sent` the line after its colon as sent): its `close` and `keep-alive`
    /// noted from `sent`, and the names it lists kept for removal when the value is `valid`.
    private mutating func connectionLine(_ value: UnsafeRawBufferPointer, valid: Bool, sent: UnsafeRawBufferPointer) {
        // The two values nearly every upstream sends, each one comparison: one token (as the list read from `sent`
        // would be), and neither names a field to remove (`keep-alive` is hop-by-hop, `close` names none). Splitting
        // and classifying cost ~600 instructions a response.
        if valid, HeaderName.equals(value, "keep-alive") {
            notes.keepAlive = true
            return
        }
        if valid, HeaderName.equals(value, "close") {
            notes.close = true
            return
        }
        FramingTally.forEachElement(of: sent) { token in
            if HeaderName.equals(token, "close") { notes.close = true }
            if HeaderName.equals(token, "keep-alive") { notes.keepAlive = true }
        }
        if valid { HeaderName.appendTokens(of: value, to: &connectionListed) }
    }

    /// `name: value` and its CRLF (the name `line[0..<colon]`, the value `line[start..<stop]`). A line sent in that
    /// form already, which is how nearly every upstream writes its fields, is copied whole in one block copy; any
    /// other in two and four bytes (six appends cost ~265 instructions a field, one ~100; appending byte by byte,
    /// or a raw buffer as a sequence, ~250 more; this runs for every field of every response).
    private mutating func appendField(_ line: UnsafeRawBufferPointer, colon: Int, _ start: Int, _ stop: Int) {
        lastLine = .field
        if start == colon + 2, line[colon + 1] == 0x20, line.count - stop >= 2, line[stop] == 0x0D,
            line[stop + 1] == 0x0A
        {
            Self.append(UnsafeRawBufferPointer(rebasing: line[0..<(stop + 2)]), to: &fields)
            return
        }
        Self.append(UnsafeRawBufferPointer(rebasing: line[0..<colon]), to: &fields)
        fields.append(0x3A)
        fields.append(0x20)
        Self.append(UnsafeRawBufferPointer(rebasing: line[start..<stop]), to: &fields)
        fields.append(0x0D)
        fields.append(0x0A)
    }

    @inline(__always)
    private static func append(_ bytes: UnsafeRawBufferPointer, to array: inout [UInt8]) {
        guard let base = bytes.baseAddress else { return }
        array.append(
            contentsOf: UnsafeBufferPointer(start: base.assumingMemoryBound(to: UInt8.self), count: bytes.count))
    }

    /// Obsolete line folding (RFC 9112 §5.2): the continuation joins its field with a single space.
    private mutating func continuation(_ line: UnsafeRawBufferPointer, end: Int) {
        let (start, stop) = Self.trimmed(line, 0, end)
        guard Self.isFieldValue(line, start, stop) else {
            lastLine = .dropped
            return
        }
        let value = UnsafeRawBufferPointer(rebasing: line[start..<stop])
        switch lastLine {
        case .location:
            // A folded redirect value is passed on joined, but not rewritten (its recorded range no longer fits).
            redirectValueRanges.removeLast()
            lastLine = .field
            fields.removeLast(2)
            fields.append(0x20)
            fields.append(contentsOf: value)
            fields.append(0x0D)
            fields.append(0x0A)
        case .field:
            fields.removeLast(2)
            fields.append(0x20)
            fields.append(contentsOf: value)
            fields.append(0x0D)
            fields.append(0x0A)
        // Each continuation appended in place (a new string per line would be quadratic in the lines).
        case .via: Self.appendContinuation(value, to: &via)
        case .retryAfter: Self.appendContinuation(value, to: &retryAfter)
        case .rateLimitReset: Self.appendContinuation(value, to: &rateLimitReset)
        case .framing: framing.malformedLength = true  // a folded framing field: parsers would disagree on it
        case .none, .dropped: break
        }
    }

    /// An obs-fold continuation line joined to its field's value with a space.
    private static func appendContinuation(_ value: some Collection<UInt8>, to text: inout String?) {
        if text == nil { text = "" }
        text!.append(" ")
        text!.append(String(decoding: value, as: UTF8.self))
    }

    /// Takes the fields named in `Connection` out of `fields` (rare: most upstreams list only `close` or
    /// `keep-alive`, which name no field left in it).
    private mutating func removeConnectionListed() {
        var kept: [UInt8] = []
        kept.reserveCapacity(fields.count)
        var start = 0
        while start < fields.count {
            var end = start
            while end + 1 < fields.count, !(fields[end] == 0x0D && fields[end + 1] == 0x0A) { end += 1 }
            let colon = fields[start..<end].firstIndex(of: 0x3A) ?? end
            let name = String(decoding: fields[start..<colon], as: UTF8.self).asciiLowercased()
            if !connectionListed.contains(name) { kept.append(contentsOf: fields[start..<min(end + 2, fields.count)]) }
            start = end + 2
        }
        fields = kept
    }

    // MARK: byte rules

    /// Eight bytes at a time (`HTTPSyntax.fieldValueEnd`): this runs over every value of every response.
    static func isFieldValue(_ line: UnsafeRawBufferPointer, _ from: Int, _ to: Int) -> Bool {
        HTTPSyntax.fieldValueEnd(in: UnsafeRawBufferPointer(rebasing: line[from..<to]), from: 0) == to - from
    }

    /// The range `from..<to` without leading and trailing spaces and tabs.
    @inline(__always)
    static func trimmed(_ line: UnsafeRawBufferPointer, _ from: Int, _ to: Int) -> (Int, Int) {
        var start = from
        var stop = to
        while start < stop, line[start] == 0x20 || line[start] == 0x09 { start += 1 }
        while stop > start, line[stop - 1] == 0x20 || line[stop - 1] == 0x09 { stop -= 1 }
        return (start, stop)
    }
}

/// What one response head said about its framing: its `Content-Length` values and `Transfer-Encoding` codings,
/// reduced as they arrive to what the verdict needs.
struct FramingTally {
    var firstLength: Int?
    var sawLength = false
    var differingLengths = false
    var malformedLength = false
    /// A `Content-Length` or `Transfer-Encoding` line with a space before its colon.
    var spaceBeforeColon = false
    /// `Transfer-Encoding` codings seen, and whether they were exactly one `chunked`.
    var codings = 0
    var onlyChunked = true

    /// The comma-separated values of one `Content-Length` field, each 1–18 digits.
    mutating func addLengths(_ value: UnsafeRawBufferPointer) {
        // One length and nothing else, as nearly every response sends it: the element the split would give is the
        // whole value (no comma, nothing to trim), read without splitting (~100 instructions a response).
        if let length = HTTPSyntax.decimal(value) {
            addLength(length)
            return
        }
        Self.forEachElement(of: value) { element in
            guard let length = HTTPSyntax.decimal(element) else {
                malformedLength = true
                return
            }
            addLength(length)
        }
    }

    private mutating func addLength(_ length: Int) {
        if let first = firstLength, first != length { differingLengths = true }
        if firstLength == nil { firstLength = length }
        sawLength = true
    }

    /// The comma-separated codings of one `Transfer-Encoding` field (an empty one counts, so `chunked,` is not
    /// mistaken for `chunked`).
    mutating func addCodings(_ value: UnsafeRawBufferPointer) {
        Self.forEachElement(of: value) { element in
            codings += 1
            if !HeaderName.equals(element, "chunked") { onlyChunked = false }
        }
    }

    var problem: String? {
        if spaceBeforeColon { return "a space before the colon of a framing field" }
        if (sawLength || malformedLength) && codings > 0 { return "both Content-Length and Transfer-Encoding" }
        if malformedLength { return "malformed Content-Length" }
        if differingLengths { return "differing Content-Length values" }
        if codings > 0 && (codings != 1 || !onlyChunked) { return "unsupported Transfer-Encoding" }
        return nil
    }

    /// Calls `body` with each comma-separated element of `value`, trimmed of spaces and tabs.
    static func forEachElement(of value: UnsafeRawBufferPointer, _ body: (UnsafeRawBufferPointer) -> Void) {
        var start = 0
        while start <= value.count {
            var end = start
            while end < value.count, value[end] != UInt8(ascii: ",") { end += 1 }
            let (from, to) = UpstreamHeadParser.trimmed(value, start, end)
            body(UnsafeRawBufferPointer(rebasing: value[from..<to]))
            start = end + 1
        }
    }
}
