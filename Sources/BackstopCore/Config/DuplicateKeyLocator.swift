/// Finds positions in raw YAML text that Yams does not report precisely: the later of two duplicate mapping keys
/// (Yams names the first) and the line/column of a byte offset.
enum DuplicateKeyLocator {
    /// The next `key:` after `first` in the same mapping: later in the same line for a one-line flow mapping, else
    /// on a later line at the same column with only spaces before it. Stops at the first non-blank, non-comment line
    /// indented less than the key, where a block mapping ends. Nil when not found (the caller keeps `first`).
    static func laterOccurrence(of key: String, after first: TextPosition, in yaml: String) -> TextPosition? {
        let lines = yaml.split(separator: "\n", omittingEmptySubsequences: false)
        guard first.line >= 1, first.line <= lines.count else { return nil }
        let column = first.column
        let firstLine = Array(lines[first.line - 1].unicodeScalars)
        if let found = findInLine(firstLine, key: key, from: column) {
            return TextPosition(line: first.line, column: found)
        }
        for lineIndex in first.line..<lines.count {
            let scalars = Array(lines[lineIndex].unicodeScalars)
            let indent = scalars.prefix { $0 == " " }.count
            if indent == scalars.count || scalars[indent] == "#" { continue }
            if indent + 1 < column { return nil }
            guard indent + 1 == column else { continue }
            if startsWithKey(scalars, at: indent, key: key) { return TextPosition(line: lineIndex + 1, column: column) }
        }
        return nil
    }

    /// 1-based line and column (in Unicode scalars, as Yams counts) of a UTF-8 byte offset.
    static func position(ofUTF8Offset offset: Int, in yaml: String) -> TextPosition {
        var position = TextPosition(line: 1, column: 1)
        var consumed = 0
        for scalar in yaml.unicodeScalars {
            if consumed >= offset { break }
            consumed += String(scalar).utf8.count
            if scalar == "\n" {
                position.line += 1
                position.column = 1
            } else {
                position.column += 1
            }
        }
        return position
    }

    private static func startsWithKey(_ scalars: [Unicode.Scalar], at start: Int, key: String) -> Bool {
        let keyScalars = Array(key.unicodeScalars)
        for quote in [nil, "\"", "'"] as [Unicode.Scalar?] {
            var candidate = keyScalars
            if let quote { candidate = [quote] + keyScalars + [quote] }
            guard start + candidate.count <= scalars.count, Array(scalars[start..<start + candidate.count]) == candidate
            else { continue }
            var i = start + candidate.count
            while i < scalars.count && scalars[i] == " " { i += 1 }
            if i < scalars.count && scalars[i] == ":" { return true }
        }
        return false
    }

    /// The 1-based column of a later `key:` in a one-line flow mapping, after `{` or `,`.
    private static func findInLine(_ scalars: [Unicode.Scalar], key: String, from column: Int) -> Int? {
        var i = column  // 0-based index just after the first key's first character
        while i < scalars.count {
            guard scalars[i] == "," || scalars[i] == "{" else {
                i += 1
                continue
            }
            var j = i + 1
            while j < scalars.count && scalars[j] == " " { j += 1 }
            if startsWithKey(scalars, at: j, key: key) { return j + 1 }
            i = j
        }
        return nil
    }
}

/// A 1-based line and column in the YAML text.
struct TextPosition: Equatable {
    var line: Int
    var column: Int
}
