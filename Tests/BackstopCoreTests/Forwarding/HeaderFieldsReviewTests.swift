import BackstopTestSupport
import Testing

@testable import BackstopCore

/// An adversarial review of header fields as bytes (docs/performance.md#header-fields-as-bytes): what any input can
/// put in a `HeaderFields`, whether its line table can point outside its bytes or share them between fields, and
/// whether its equality, its text and its lookups hold. The writers copy a `HeaderFields` without looking at its
/// bytes again, so every case checks the whole invariant (`violations`).
@Suite("Header fields as bytes: adversarial review")
struct HeaderFieldsReviewTests {
    /// What the reader makes of `bytes` as the first request of a connection.
    static func event(_ bytes: [UInt8], maxHeadBytes: Int = 64 << 10) -> HTTP1RequestReader.Event {
        RequestHeads.read(bytes, maxHeadBytes: maxHeadBytes).event
    }

    /// The fields of a head the reader accepts; nil when it does not.
    static func fields(_ bytes: [UInt8]) -> HeaderFields? {
        guard case .head(let head) = event(bytes) else { return nil }
        return head.fields
    }

    static func fields(_ text: String) -> HeaderFields? { fields(Array(text.utf8)) }

    /// Each field as `name:value`, its bytes (names hold no colon, so the pair is unambiguous).
    static func raw(_ fields: HeaderFields) -> [[UInt8]] {
        fields.withFieldBytes { bytes, lines in
            lines.map { Array(bytes[$0.name]) + [UInt8(ascii: ":")] + Array(bytes[$0.value]) }
        }
    }

    static func raw(_ pairs: [(String, String)]) -> [[UInt8]] { pairs.map { Array("\($0.0):\($0.1)".utf8) } }

    /// What breaks the invariant the writers rely on, empty when nothing does: every range inside the bytes, names
    /// non-empty tokens, values field-value bytes only, no byte in two fields.
    static func violations(_ fields: HeaderFields) -> [String] {
        fields.withFieldBytes { bytes, lines in
            var problems: [String] = []
            var used: [Range<Int>] = []
            for (i, line) in lines.enumerated() {
                guard line.nameStart >= 0, line.nameStart < line.nameEnd, Int(line.nameEnd) <= bytes.count,
                    line.valueStart >= 0, line.valueStart <= line.valueEnd, Int(line.valueEnd) <= bytes.count
                else {
                    problems.append("field \(i): \(line) is not inside \(bytes.count) bytes")
                    continue
                }
                if !bytes[line.name].allSatisfy(HTTPSyntax.isTokenByte) { problems.append("field \(i): name") }
                if !bytes[line.value].allSatisfy(HTTPSyntax.isFieldValueByte) { problems.append("field \(i): value") }
                used.append(line.name)
                if !line.value.isEmpty { used.append(line.value) }
            }
            if lines.count != fields.count { problems.append("\(lines.count) lines, \(fields.count) fields") }
            used.sort { $0.lowerBound < $1.lowerBound }
            for (a, b) in zip(used, used.dropFirst()) where a.upperBound > b.lowerBound {
                problems.append("\(a) and \(b) overlap")
            }
            return problems
        }
    }

    // MARK: what the reader lets in

    /// Every byte that could end a line early, or start one, is refused wherever it stands in a field line; so is a
    /// line that is not `token ":" OWS value`.
    @Test(arguments: [
        "X: a\rb", "X: a\nb", "X: a\u{0}b", "X: a\u{1}b", "X: a\u{1F}b", "X: a\u{7F}b", "X: a\u{B}b", "X: a\u{C}b",
        "X\r: a", "X\n: a", "X\u{0}: a", "X\t: a", "X : a", "X", ": a", "\u{1}X: a", "X(: a", "X\u{7F}: a",
        "X: a\r\n b", "X: a\r\n\tb", "X: a\r\r\nY: b", "X: a\nY: b", "\u{C3}\u{A9}: a",
    ])
    func theReaderRefusesEveryFieldLineThatCouldBreakAHead(line: String) {
        let head = "GET / HTTP/1.1\r\nHost: h\r\n" + line + "\r\n\r\n"
        if case .head(let parsed) = Self.event(Array(head.utf8)) {
            Issue.record("read as \(Self.raw(parsed.fields).map { String(decoding: $0, as: UTF8.self) })")
        }
    }

    /// Values: the spaces and tabs around them are not theirs; empty and whitespace-only values are empty; tabs,
    /// obs-text and colons inside are kept as sent.
    @Test func valuesKeepTheirBytesBetweenTheSurroundingWhitespace() throws {
        let bytes =
            Array("GET / HTTP/1.1\r\nA:\r\nB: \t \r\nC:\t v \t\r\nD: a:b,,c\r\nE: ".utf8) + [0x80, 0xFF, 0xC3]
            + Array("\r\n\r\n".utf8)
        let fields = try #require(Self.fields(bytes))
        #expect(
            Self.raw(fields) == [
                Array("A:".utf8), Array("B:".utf8), Array("C:v".utf8), Array("D:a:b,,c".utf8),
                Array("E:".utf8) + [0x80, 0xFF, 0xC3],
            ])
        #expect(Self.violations(fields).isEmpty)
        #expect(fields.value(at: 1).isEmpty && fields.valueCount(at: 1) == 0)
    }

    /// A reference reading of a field section by the rules alone (RFC 9112 §5, §2.2): lines end in CRLF; a field
    /// line is a token, a colon, spaces and tabs, then field-value bytes. Nil when a line breaks them.
    static func reference(_ section: ArraySlice<UInt8>) -> [[UInt8]]? {
        var fields: [[UInt8]] = []
        var i = section.startIndex
        while i < section.endIndex {
            guard let end = section[i...].firstIndex(where: { $0 == 0x0D || $0 == 0x0A }), section[end] == 0x0D,
                end + 1 < section.endIndex, section[end + 1] == 0x0A
            else { return nil }
            let line = section[i..<end]
            guard let colon = line.firstIndex(of: UInt8(ascii: ":")), colon > line.startIndex,
                line[..<colon].allSatisfy(HTTPSyntax.isTokenByte)
            else { return nil }
            var valueStart = colon + 1
            while valueStart < end, line[valueStart] == 0x20 || line[valueStart] == 0x09 { valueStart += 1 }
            guard line[valueStart...].allSatisfy(HTTPSyntax.isFieldValueByte) else { return nil }
            // The spaces and tabs after the value are not its own either (RFC 9110 §5.5).
            var valueEnd = end
            while valueEnd > valueStart, line[valueEnd - 1] == 0x20 || line[valueEnd - 1] == 0x09 { valueEnd -= 1 }
            fields.append(Array(line[..<colon]) + [UInt8(ascii: ":")] + Array(line[valueStart..<valueEnd]))
            i = end + 2
        }
        return fields
    }

    /// Heads of random field lines, hostile bytes included, against the reference: the reader takes exactly the
    /// heads the reference takes, with exactly its fields; every `HeaderFields` it makes (and every one made from it
    /// by removing, copying and rewriting) keeps the invariant. Seeded: the same heads on every run.
    @Test func randomHeadsAgreeWithTheReferenceAndKeepTheInvariant() {
        var random = SplitMix64(seed: 0x31)
        let nameBytes = Array("aB-!~9".utf8)
        let badNameBytes: [UInt8] = [0x20, 0x09, 0x28, 0x80, 0x00, 0x0D, 0x0A, 0x7F, 0x3A, 0x22]
        let valueBytes: [UInt8] = Array("a ,:\t\"".utf8) + [0x80, 0xC3, 0xA9, 0xFF]
        let badValueBytes: [UInt8] = [0x00, 0x01, 0x0D, 0x0A, 0x1F, 0x7F]
        let separators = [":", ":", ": ", ":\t ", " :", ""]
        func pick(_ bytes: [UInt8]) -> UInt8 { bytes[Int(random.next() % UInt64(bytes.count))] }
        func chance(_ percent: UInt64) -> Bool { random.next() % 100 < percent }
        var accepted = 0
        var failures: [String] = []
        for _ in 0..<20_000 where failures.count < 5 {
            var section: [UInt8] = []
            for _ in 0..<Int(random.next() % 7) {
                for _ in 0...Int(random.next() % 5) { section.append(chance(3) ? pick(badNameBytes) : pick(nameBytes)) }
                section += Array(separators[Int(random.next() % UInt64(separators.count))].utf8)
                for _ in 0..<Int(random.next() % 12) {
                    section.append(chance(2) ? pick(badValueBytes) : pick(valueBytes))
                }
                section += [0x0D, 0x0A]
            }
            let requestLine = Array("GET / HTTP/1.1\r\n".utf8)
            let head = requestLine + section + [0x0D, 0x0A]
            // Where the reference ends the head: the first empty line (a value can hold CRLF CRLF).
            var end = requestLine.count - 2
            while !(head[end] == 0x0D && head[end + 1] == 0x0A && head[end + 2] == 0x0D && head[end + 3] == 0x0A) {
                end += 1
            }
            let expected = Self.reference(head[requestLine.count..<(end + 2)])
            switch (Self.event(head), expected) {
            case (.head(let parsed), .some(let expected)):
                accepted += 1
                if Self.raw(parsed.fields) != expected { failures.append("fields differ: \(head)") }
                failures += Self.derivedViolations(parsed.fields, &random).map { "\($0): \(head)" }
            case (.invalid, .none):
                break
            case (let event, _):
                failures.append(
                    "reader \(event), reference \(expected.map { "\($0.count) fields" } ?? "refuses"): \(head)")
            }
        }
        #expect(failures.isEmpty)
        // Both outcomes were tried often.
        #expect(accepted > 2_000 && accepted < 18_000)
    }

    /// The invariant on `fields` and on every value made from it: a copy with a field removed, fields copied in from
    /// it (from itself too), appended ones, and its upstream rewrite with a credential.
    static func derivedViolations(_ fields: HeaderFields, _ random: inout SplitMix64) -> [String] {
        var problems = violations(fields)
        let original = raw(fields)
        var copy = fields
        if !fields.isEmpty {
            let index = Int(random.next() % UInt64(fields.count))
            let name = fields.name(at: index)
            copy.remove(name: name.uppercased())
            let kept = fields.indices.filter { !fields.name(at: $0).caseInsensitiveEquals(name) }
            if raw(copy) != kept.map({ original[$0] }) { problems.append("remove(name: \(name))") }
            copy.append(fieldAt: index, of: fields)
            if !copy.isEmpty { copy.append(fieldAt: 0, of: copy) }
        }
        copy.append(name: "X-Added", value: "v")
        problems += violations(copy).map { "copy: \($0)" }
        if raw(fields) != original { problems.append("a change to a copy changed the original") }
        let credential = HeaderRewriter.InjectedHeader(name: "b!", value: "Bearer t", replacesClient: true)
        let upstream = HeaderRewriter.upstreamRequestHeaders(fields, upstreamHost: "up", injecting: credential)
        problems += violations(upstream).map { "rewritten: \($0)" }
        let expected =
            raw([("Host", "up")]) + fields.indices.filter { !fields.nameEquals(at: $0, "b!") }.map { original[$0] }
            + raw([("Via", "1.1 backstop"), ("b!", "Bearer t")])
        if raw(upstream) != expected { problems.append("rewritten fields") }
        if raw(fields) != original { problems.append("the rewrite changed the client's fields") }
        return problems
    }

    /// The word-at-a-time scan finds the first byte a value cannot hold at every position of words and tails, for
    /// every byte, after tabs (which it steps over) and obs-text (which borrows could misread).
    @Test func fieldValueEndAgreesWithTheByteRuleEverywhere() {
        var failures: [String] = []
        for count in [1, 7, 8, 9, 15, 16, 17, 24, 31] {
            for position in 0..<count {
                for byte in UInt8.min...UInt8.max {
                    for fill: UInt8 in [UInt8(ascii: "a"), 0x09, 0x80, 0xFF, 0x20] {
                        var bytes = [UInt8](repeating: fill, count: count)
                        bytes[position] = byte
                        let end = bytes.withUnsafeBytes { HTTPSyntax.fieldValueEnd(in: $0, from: 0) }
                        let expected = HTTPSyntax.isFieldValueByte(byte) ? count : position
                        if end != expected { failures.append("\(bytes): \(end), not \(expected)") }
                    }
                }
            }
        }
        var random = SplitMix64(seed: 7)
        let palette: [UInt8] = [0x00, 0x01, 0x09, 0x0A, 0x0D, 0x1F, 0x20, 0x21, 0x7E, 0x7F, 0x80, 0x81, 0xA0, 0xFF]
        for _ in 0..<50_000 where failures.count < 5 {
            let bytes = (0..<Int(random.next() % 40)).map { _ in
                random.next() % 4 == 0 ? palette[Int(random.next() % UInt64(palette.count))] : UInt8(ascii: "x")
            }
            let start = bytes.isEmpty ? 0 : Int(random.next() % UInt64(bytes.count))
            let end = bytes.withUnsafeBytes { HTTPSyntax.fieldValueEnd(in: $0, from: start) }
            let expected = bytes[start...].firstIndex { !HTTPSyntax.isFieldValueByte($0) } ?? bytes.count
            if end != expected { failures.append("\(bytes) from \(start): \(end), not \(expected)") }
        }
        #expect(failures.isEmpty)
    }

    // MARK: large heads

    /// A head of exactly the limit is read, its last field's ranges past 64 KiB where they belong; a byte more is
    /// refused, whole or trickling in.
    @Test func aHeadAtTheLimitKeepsEveryRangeAndOneByteMoreIsRefused() throws {
        let limit = 80 << 10
        let start = "GET / HTTP/1.1\r\nA: 1\r\nCookie: "
        let end = "\r\nZ-Last: tail \r\n\r\n"
        let filler = limit - start.utf8.count - end.utf8.count
        let head = Array((start + String(repeating: "c", count: filler) + end).utf8)
        #expect(head.count == limit)
        guard case .head(let parsed) = Self.event(head, maxHeadBytes: limit) else {
            Issue.record("a head of exactly the limit was refused")
            return
        }
        #expect(Self.violations(parsed.fields).isEmpty)
        #expect(parsed.fields.valueCount(at: 1) == filler)
        #expect(parsed.fields.name(at: 2) == "Z-Last" && parsed.fields.value(at: 2) == "tail")
        #expect(Self.event(head, maxHeadBytes: limit - 1) == .invalid(.headTooLarge))
        // In 4 KiB pieces, each handed over with what came before (as the decoder does).
        var reader = HTTP1RequestReader(maxHeadBytes: limit - 1)
        var last = HTTP1RequestReader.Event.needMore
        for size in stride(from: 4096, through: head.count + 4095, by: 4096) {
            var offset = 0
            last = Array(head.prefix(size)).withUnsafeBytes { reader.next($0, at: &offset) }
            if last != .needMore { break }
        }
        #expect(last == .invalid(.headTooLarge))
    }

    /// Offsets far past 16 and 24 bits: a 3 MiB head under a 4 MiB limit, and its upstream rewrite (which adds its
    /// `Via` values again after it).
    @Test func multiMegabyteHeadsKeepTheirRangesUpstreamToo() throws {
        let big = String(repeating: "v", count: 1 << 20)
        let text = "GET / HTTP/1.1\r\nVia: 1.0 \(big)\r\nX-A: \(big)\r\nvia: 1.1 \(big)\r\nZ: end\r\n\r\n"
        guard case .head(let parsed) = Self.event(Array(text.utf8), maxHeadBytes: 4 << 20) else {
            Issue.record("not read")
            return
        }
        #expect(Self.violations(parsed.fields).isEmpty)
        #expect(parsed.fields.value(at: 3) == "end")
        let upstream = HeaderRewriter.upstreamRequestHeaders(parsed.fields, upstreamHost: "up")
        #expect(Self.violations(upstream).isEmpty)
        #expect(upstream.map(\.name) == ["Host", "X-A", "Z", "Via"])
        #expect(upstream.first(name: "via") == "1.0 \(big), 1.1 \(big), 1.1 backstop")
    }

    /// A range is 32 bits: an offset past `Int32.max` stops the process rather than wrapping into a range the
    /// writers would copy from outside the bytes.
    @Test func anOffsetPastThirtyTwoBitsTrapsRatherThanWraps() async {
        await #expect(processExitsWith: .failure) {
            _ = HeaderFields.Line(nameStart: 1 << 31, nameEnd: (1 << 31) + 1, valueStart: 1 << 31, valueEnd: 1 << 31)
        }
    }

    // MARK: changes and copies

    /// A refused append leaves nothing behind: no line and no byte.
    @Test(arguments: [("X", "a\r\nEvil: 1"), ("Bad Name", "v"), ("", ""), ("X", "\u{0}")])
    func aRefusedAppendLeavesTheBytesAsTheyWere(name: String, value: String) throws {
        var fields = try #require(Self.fields("GET / HTTP/1.1\r\nA: 1\r\n\r\n"))
        let before = fields.withFieldBytes { bytes, _ in Array(bytes) }
        let appended = fields.append(name: name, value: value)
        #expect(!appended)
        #expect(fields.withFieldBytes { bytes, _ in Array(bytes) } == before)
        #expect(Self.raw(fields) == Self.raw([("A", "1")]))
    }

    /// A field copied from the fields themselves, after a removal left bytes nobody refers to, and copies that
    /// share their storage until one of them changes.
    @Test func copiesFromItselfAndSharedCopiesStayApart() throws {
        let client = try #require(Self.fields("GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n"))
        var fields = client
        fields.append(fieldAt: 1, of: fields)
        fields.remove(name: "a")
        fields.append(fieldAt: 0, of: fields)
        fields.append(name: "D", value: "4")
        fields.remove(name: "C")
        #expect(Self.raw(fields) == Self.raw([("B", "2"), ("B", "2"), ("B", "2"), ("D", "4")]))
        #expect(Self.violations(fields).isEmpty)
        #expect(Self.raw(client) == Self.raw([("A", "1"), ("B", "2"), ("C", "3")]))
        var second = fields
        second.remove(name: "B")
        second.append(fieldAt: 0, of: client)
        #expect(Self.raw(second) == Self.raw([("D", "4"), ("A", "1")]))
        #expect(Self.raw(fields) == Self.raw([("B", "2"), ("B", "2"), ("B", "2"), ("D", "4")]))
        #expect(Self.violations(second).isEmpty)
        second.remove(name: "D")
        second.remove(name: "A")
        #expect(second.isEmpty && second.lineBytes == 0 && Self.violations(second).isEmpty)
    }

    // MARK: equality, text, lookups

    /// Equal fields are equal bytes: values that decode to the same string (invalid UTF-8 becomes U+FFFD; `é` and
    /// `e` + U+0301 are canonically equivalent) but are written differently are different fields.
    @Test func equalityIsByteForByte() throws {
        let head = Array("GET / HTTP/1.1\r\nX: a".utf8)
        let ff = try #require(Self.fields(head + [0xFF] + Array("\r\n\r\n".utf8)))
        let fe = try #require(Self.fields(head + [0xFE] + Array("\r\n\r\n".utf8)))
        #expect(ff.value(at: 0) == fe.value(at: 0))
        #expect(ff != fe)
        let composed: HeaderFields = [(name: "X", value: "caf\u{E9}")]
        let decomposed: HeaderFields = [(name: "X", value: "cafe\u{301}")]
        #expect(composed != decomposed)
        // The same bytes are equal wherever they sit in the store.
        var read = try #require(Self.fields("GET / HTTP/1.1\r\nPad: xxxx\r\nX: caf\u{E9}\r\n\r\n"))
        read.remove(name: "pad")
        #expect(read == composed)
        #expect(HeaderFields() == [] && HeaderFields() != composed)
    }

    /// No text made of fields shows a value (values hold credentials): interpolation, `String(reflecting:)`,
    /// `dump` and a head's description are the same whatever the values are.
    @Test func noTextOfTheFieldsDependsOnTheirValues() throws {
        func texts(_ secret: String) throws -> [String] {
            var fields = try #require(Self.fields("GET / HTTP/1.1\r\nAuthorization: Bearer \(secret)\r\n\r\n"))
            fields.append(name: "X-Api-Key", value: secret)
            var dumped = ""
            dump(fields, to: &dumped)
            let head = HTTP1RequestHead(method: .get, target: "/", minorVersion: 1, fields: fields, upgrade: false)
            var dumpedHead = ""
            dump(head, to: &dumpedHead)
            return [
                "\(fields)", String(reflecting: fields), dumped, "\(head)", String(reflecting: head), dumpedHead,
                Mirror(reflecting: fields).children.map { "\($0.value)" }.joined(separator: ","),
            ]
        }
        let one = try texts("s3cr3t-one")
        let other = try texts("another-s3cr3t-value")
        for (a, b) in zip(one, other) { #expect(a == b) }
        #expect(one.allSatisfy { $0.contains("Authorization") })
    }

    /// Positions and names: a field by position is its name and value; by name, every value in order whatever the
    /// case of the name; a name that is a prefix, an extension or non-ASCII case of another is another name.
    @Test func subscriptsAndLookupsByName() throws {
        let fields = try #require(Self.fields("GET / HTTP/1.1\r\nSet: 1\r\nset:\r\nSET:  3 \r\nSe: 4\r\n\r\n"))
        #expect(fields[0].name == "Set" && fields[0].value == "1" && fields[2].name == "SET" && fields[2].value == "3")
        #expect(fields["sEt"] == ["1", "", "3"] && fields["se"] == ["4"] && fields["s"] == [] && fields["sett"] == [])
        #expect(fields.first(name: "SET") == "1" && fields.firstIndex(name: "se") == 3 && fields.first(name: "") == nil)
        #expect(
            fields[1...].map(\.value) == ["", "3", "4"] && fields.reversed().map(\.value) == ["4", "3", "", "1"])
        let unicode: HeaderFields = [(name: "X", value: "1")]
        #expect(unicode.first(name: "X\u{301}") == nil && unicode.first(name: "\u{1D5EB}") == nil)
        let empty = HeaderFields()
        #expect(empty["x"] == [] && empty.first(name: "x") == nil && empty.startIndex == empty.endIndex)
    }
}
