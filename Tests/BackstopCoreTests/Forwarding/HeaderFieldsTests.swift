import BackstopCore
import BackstopTestSupport
import Testing

/// `HeaderFields`: fields held as bytes, read from a client's head or appended, looked up by name
/// case-insensitively, and never holding a byte that could add a line to a head.
@Suite("Header fields as bytes")
struct HeaderFieldsTests {
    /// The fields of a head read by `HTTP1RequestReader` (the way the proxy gets them).
    static func read(_ head: String) throws -> HeaderFields {
        let event = RequestHeads.read(head).event
        guard case .head(let parsed) = event else {
            Issue.record("not a head: \(event)")
            return HeaderFields()
        }
        return parsed.fields
    }

    static func pairs(_ fields: HeaderFields) -> [String] { fields.map { "\($0.name)=\($0.value)" } }

    @Test func fieldsReadFromAHeadKeepTheirBytesAndOrder() throws {
        let fields = try Self.read(
            "GET /p HTTP/1.1\r\nHost: a.test\r\nX-Empty:\r\nAccept:  \t*/*\r\nX-Trail: v  \r\nx-obs: caf\u{e9}\r\n\r\n")
        #expect(Self.pairs(fields) == ["Host=a.test", "X-Empty=", "Accept=*/*", "X-Trail=v", "x-obs=caf\u{e9}"])
        #expect(fields.count == 5)
        #expect(fields.name(at: 2) == "Accept" && fields.value(at: 2) == "*/*")
        #expect(fields.nameCount(at: 0) == 4 && fields.valueCount(at: 0) == 6)
        #expect(fields.lineBytes == (4 + 6 + 4) + (7 + 0 + 4) + (6 + 3 + 4) + (7 + 1 + 4) + (5 + 5 + 4))
    }

    @Test func lookupsIgnoreTheCaseOfNames() throws {
        let fields = try Self.read("GET / HTTP/1.1\r\nHOST: h\r\nX-A: 1\r\nx-a: 2\r\nX-AB: 3\r\n\r\n")
        #expect(fields.first(name: "host") == "h")
        #expect(fields.first(name: "x-a") == "1")
        #expect(fields["X-a"] == ["1", "2"])
        #expect(fields.contains(name: "x-ab") && !fields.contains(name: "x-abc") && !fields.contains(name: "x"))
        #expect(fields.firstIndex(name: "x-ab") == 3)
        #expect(fields.nameEquals(at: 1, "X-A") && !fields.nameEquals(at: 1, "X-AB"))
    }

    @Test func removingANameTakesOutEveryFieldOfIt() throws {
        var fields = try Self.read("GET / HTTP/1.1\r\nA: 1\r\nb: 2\r\nB: 3\r\nC: 4\r\n\r\n")
        fields.remove(name: "B")
        #expect(Self.pairs(fields) == ["A=1", "C=4"])
        fields.remove(name: "missing")
        #expect(Self.pairs(fields) == ["A=1", "C=4"])
    }

    /// Nothing that could split a line or end a head early gets in: CR, LF, NUL, other controls, DEL in values;
    /// anything but a token as a name.
    @Test(arguments: [
        ("X", "a\r\nEvil: 1"), ("X", "lf\nonly"), ("X", "cr\ronly"), ("X", "nul\u{0}"), ("X", "bell\u{7}"),
        ("X", "del\u{7f}"), ("", "v"), ("Bad Name", "v"), ("Bad:Name", "v"), ("Bad\rName", "v"), ("N\u{e9}", "v"),
    ])
    func appendRefusesWhatCouldSplitAHead(name: String, value: String) {
        var fields: HeaderFields = [(name: "Kept", value: "1")]
        let appended = fields.append(name: name, value: value)
        #expect(!appended)
        #expect(Self.pairs(fields) == ["Kept=1"])
    }

    @Test func appendTakesTabsSpacesAndObsText() {
        var fields = HeaderFields()
        let appended = [
            fields.append(name: "X-Tab", value: "a\tb c"), fields.append(name: "X-Utf8", value: "t0k\u{20ac}n"),
            fields.append(name: "X-Empty", value: ""),
        ]
        #expect(appended == [true, true, true])
        #expect(Self.pairs(fields) == ["X-Tab=a\tb c", "X-Utf8=t0k\u{20ac}n", "X-Empty="])
    }

    @Test func aFieldCopiedFromAnotherKeepsItsBytes() throws {
        let client = try Self.read("GET / HTTP/1.1\r\nHost: h\r\nUser-Agent: app/1.0\r\n\r\n")
        var out: HeaderFields = [(name: "Host", value: "up")]
        out.append(fieldAt: 1, of: client)
        out.append(name: "Via", value: "1.1 backstop")
        #expect(Self.pairs(out) == ["Host=up", "User-Agent=app/1.0", "Via=1.1 backstop"])
        #expect(out.lineBytes == (4 + 2 + 4) + (10 + 7 + 4) + (3 + 12 + 4))
    }

    @Test func equalityComparesNamesAndValuesInOrder() throws {
        let read = try Self.read("GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\n\r\n")
        #expect(read == [(name: "A", value: "1"), (name: "B", value: "2")])
        #expect(read != [(name: "B", value: "2"), (name: "A", value: "1")])
        #expect(read != [(name: "a", value: "1"), (name: "B", value: "2")])
        #expect(read != [(name: "A", value: "1")])
    }

    /// The ranges a writer copies: each field's name and value, in the one byte store.
    @Test func fieldBytesHandTheWriterEveryRange() throws {
        var fields = try Self.read("GET / HTTP/1.1\r\nA: 1\r\nBb: 22\r\n\r\n")
        fields.append(name: "C", value: "333")
        let lines = fields.withFieldBytes { bytes, lines in
            lines.map {
                String(decoding: bytes[$0.name], as: UTF8.self) + ":" + String(decoding: bytes[$0.value], as: UTF8.self)
            }
        }
        #expect(lines == ["A:1", "Bb:22", "C:333"])
    }

    @Test func descriptionNamesFieldsWithoutValues() {
        let fields: HeaderFields = [(name: "Authorization", value: "Bearer secret")]
        #expect(!"\(fields)".contains("secret") && "\(fields)".contains("Authorization"))
    }
}
