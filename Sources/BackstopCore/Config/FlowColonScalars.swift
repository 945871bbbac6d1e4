import Yams

/// IPv6 values in flow lists, as the docs write them: `deny_addresses: [127.0.0.0/8, ::1/128, ::/128]`.
///
/// The YAML parser (libyaml, YAML 1.1) reads every `:` inside `[...]` or `{...}` as a value indicator, so a plain
/// value that starts with one (`::1/128`) is a syntax error there, though YAML 1.2 reads it as a plain scalar, as it
/// does outside brackets (`- ::1/128`). Before parsing, the leading `:` of each such value is swapped for a private
/// use character, one character for one so that every line and column stays where it was; the composed tree gets
/// the `:` back (docs/reference/config.md#yaml). Only values made of the characters of an address, a CIDR or a
/// `host:port` are touched; anything else is left for the parser to report.
enum FlowColonScalars {
    /// Stands in for the leading `:` while libyaml reads the text. Never used when the text already holds it.
    static let placeholder: Unicode.Scalar = "\u{E000}"

    /// `yaml` with the placeholder at the start of each colon-led plain value inside a flow collection, or nil when
    /// there is none (or the text already holds the placeholder).
    static func protect(_ yaml: String) -> String? {
        let text = Array(yaml.unicodeScalars)
        guard !text.contains(placeholder) else { return nil }
        var scanner = Scanner(text: text)
        scanner.run()
        guard !scanner.protected.isEmpty else { return nil }
        var out = text
        for index in scanner.protected { out[index] = placeholder }
        var result = String.UnicodeScalarView()
        result.append(contentsOf: out)
        return String(result)
    }

    /// `node` with every placeholder turned back into `:`, in every scalar, keys included: `protect` refuses text
    /// that already holds one, so each is one it put there, and the round trip is exact wherever the scanner took a
    /// character for structure that was not (a value is never changed, only a parse error turned into a value).
    static func restore(_ node: Node) -> Node {
        switch node {
        case .scalar(var scalar):
            guard scalar.string.unicodeScalars.contains(placeholder) else { return node }
            let tag = scalar.tag
            scalar.string = restored(scalar.string)
            scalar.tag = tag
            return .scalar(scalar)
        case .mapping(var mapping):
            for index in mapping.indices {
                let pair = mapping[index]
                mapping[index] = (key: restore(pair.key), value: restore(pair.value))
            }
            return .mapping(mapping)
        case .sequence(var sequence):
            for index in sequence.indices { sequence[index] = restore(sequence[index]) }
            return .sequence(sequence)
        case .alias:
            return node
        }
    }

    /// `text` with every placeholder turned back into `:`.
    static func restored(_ text: String) -> String {
        var out = String.UnicodeScalarView()
        for c in text.unicodeScalars { out.append(c == placeholder ? ":" : c) }
        return String(out)
    }

    /// A small reader of YAML's structure: enough to know where a node starts inside a flow collection, while
    /// stepping over quoted scalars, comments and block scalars (whose lines are text, never structure).
    private struct Scanner {
        let text: [Unicode.Scalar]
        var protected: [Int] = []
        var index = 0
        /// Open `[` and `{`.
        var depth = 0
        /// The next character that is not blank starts a node.
        var nodeStart = true
        var lineIndent = 0
        /// Skipping the lines of a block scalar: those more indented than this.
        var blockIndent: Int?

        init(text: [Unicode.Scalar]) { self.text = text }

        func at(_ offset: Int) -> Unicode.Scalar? {
            index + offset < text.count ? text[index + offset] : nil
        }

        static func isBlank(_ c: Unicode.Scalar?) -> Bool {
            c == nil || c == " " || c == "\t" || c == "\n" || c == "\r"
        }

        /// The characters of an IPv6 address, a CIDR or a `host:port`.
        static func isAddressCharacter(_ c: Unicode.Scalar) -> Bool {
            switch c {
            case "0"..."9", "a"..."z", "A"..."Z", ":", ".", "/", "%", "-", "_": true
            default: false
            }
        }

        mutating func skipLine() {
            while let c = at(0), c != "\n" { index += 1 }
        }

        mutating func run() {
            var lineStart = true
            while index < text.count {
                if lineStart {
                    lineStart = false
                    var indent = 0
                    while at(indent) == " " { indent += 1 }
                    let blankLine = at(indent) == nil || at(indent) == "\n" || at(indent) == "\r"
                    if let block = blockIndent {
                        if blankLine || indent > block {
                            skipLine()
                            continue
                        }
                        blockIndent = nil
                    }
                    lineIndent = indent
                    index += indent
                    if depth == 0 { nodeStart = true }
                    continue
                }
                let c = text[index]
                switch c {
                case "\n":
                    lineStart = true
                    index += 1
                case " ", "\t", "\r":
                    index += 1
                case "#" where index == 0 || Self.isBlank(text[index - 1]):
                    skipLine()
                case "'" where nodeStart, "\"" where nodeStart:
                    skipQuoted(c)
                    nodeStart = false
                case "[" where nodeStart, "{" where nodeStart:
                    depth += 1
                    nodeStart = true
                    index += 1
                case "]" where depth > 0, "}" where depth > 0:
                    depth -= 1
                    nodeStart = false
                    index += 1
                case "," where depth > 0:
                    nodeStart = true
                    index += 1
                case "-" where nodeStart && depth == 0 && Self.isBlank(at(1)):
                    index += 1
                case "|" where nodeStart && depth == 0, ">" where nodeStart && depth == 0:
                    blockIndent = lineIndent
                    skipLine()
                case ":":
                    let next = at(1)
                    if Self.isBlank(next) || (depth > 0 && (next == "," || next == "]" || next == "}")) {
                        nodeStart = true  // a value indicator
                        index += 1
                    } else if depth > 0, nodeStart {
                        protectValue()
                    } else {
                        nodeStart = false
                        index += 1
                    }
                case "&" where nodeStart, "!" where nodeStart:
                    // An anchor or a tag: the node it belongs to starts after it.
                    while let c = at(0), !Self.isBlank(c) { index += 1 }
                default:
                    nodeStart = false
                    index += 1
                }
            }
        }

        /// A colon-led plain value inside a flow collection: protected when it is made of address characters.
        mutating func protectValue() {
            var end = index
            while end < text.count, !Self.isBlank(text[end]), text[end] != ",", text[end] != "]", text[end] != "}" {
                end += 1
            }
            if text[index..<end].allSatisfy(Self.isAddressCharacter) { protected.append(index) }
            nodeStart = false
            index = end
        }

        /// Steps over a quoted scalar ('' and backslash escapes), across lines.
        mutating func skipQuoted(_ quote: Unicode.Scalar) {
            index += 1
            while let c = at(0) {
                if quote == "\"", c == "\\" {
                    index += 2
                    continue
                }
                if c == quote {
                    if quote == "'", at(1) == "'" {
                        index += 2
                        continue
                    }
                    index += 1
                    return
                }
                index += 1
            }
        }
    }
}
