import BackstopCore
import Testing

/// The config model's location type; Swift Testing has one of the same name.
typealias SourceLocation = BackstopCore.SourceLocation

/// Shared helpers for the config suites: parse inline YAML, and find where a token sits in it so expected error
/// positions are exact without hand-counted columns.
enum ConfigFixture {
    static let file = "t.yaml"
    static let base = "/etc/backstop"
    /// A valid head every error fixture extends.
    static let head = "version: 1\nlisten: [127.0.0.1:8080]\n"

    static func parse(_ yaml: String) throws(ConfigErrors) -> Config {
        try ConfigLoader.parse(yaml: yaml, file: file, baseDirectory: base)
    }

    static func errors(_ yaml: String) -> [ConfigError] {
        do {
            _ = try parse(yaml)
            return []
        } catch {
            return error.errors
        }
    }

    /// `head` plus one upstream named `a` matching host `a.test`, with `extra` lines (indented 4) appended.
    static func upstream(_ extra: String = "", keychain: Bool = false) -> String {
        var yaml = head
        if keychain { yaml += "keychain: {path: k.bkc, key_file: k.key}\n" }
        yaml += "upstreams:\n  - name: a\n    match: {hosts: [a.test]}\n    url: http://a.test\n"
        if !extra.isEmpty { yaml += extra.split(separator: "\n").map { "    " + $0 }.joined(separator: "\n") + "\n" }
        return yaml
    }

    /// 1-based line and column of the `occurrence`-th appearance of `needle` (columns in characters; fixtures are
    /// ASCII, as Yams counts Unicode scalars).
    static func position(of needle: String, occurrence: Int = 1, in yaml: String) -> (line: Int, column: Int)? {
        var seen = 0
        for (lineIndex, line) in yaml.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            var searchStart = line.startIndex
            while let range = line[searchStart...].firstRange(of: needle) {
                seen += 1
                if seen == occurrence {
                    return (lineIndex + 1, line.distance(from: line.startIndex, to: range.lowerBound) + 1)
                }
                searchStart = line.index(after: range.lowerBound)
            }
        }
        return nil
    }
}

/// One error fixture: the YAML, the token the error must point at (and which occurrence of it), and a word its
/// message must contain.
struct ErrorCase: Sendable, CustomTestStringConvertible {
    var yaml: String
    var at: String
    var occurrence: Int = 1
    var word: String
    var testDescription: String { "\(word) @ \(at)#\(occurrence)" }

    init(_ yaml: String, at: String, _ word: String) {
        self.init(yaml, at: at, 1, word)
    }

    init(_ yaml: String, at: String, _ occurrence: Int, _ word: String) {
        self.yaml = yaml
        self.at = at
        self.occurrence = occurrence
        self.word = word
    }
}

/// Expects exactly one error, at the position of `c.at`, mentioning `c.word`.
func expectSingleError(_ c: ErrorCase, sourceLocation: Testing.SourceLocation = #_sourceLocation) {
    let found = ConfigFixture.errors(c.yaml)
    guard let expected = ConfigFixture.position(of: c.at, occurrence: c.occurrence, in: c.yaml) else {
        Issue.record("fixture does not contain '\(c.at)'", sourceLocation: sourceLocation)
        return
    }
    #expect(found.count == 1, "expected one error, got \(found)", sourceLocation: sourceLocation)
    guard let error = found.first else { return }
    #expect(
        error.location
            == BackstopCore.SourceLocation(
                file: ConfigFixture.file, line: expected.line,
                column: expected.column),
        "got \(error), expected \(expected.line):\(expected.column)", sourceLocation: sourceLocation)
    #expect(error.message.lowercased().contains(c.word.lowercased()), "got \(error)", sourceLocation: sourceLocation)
}
