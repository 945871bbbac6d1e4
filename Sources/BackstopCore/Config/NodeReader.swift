import Yams

/// Reads typed values out of a Yams node tree, collecting every problem with its line and column instead of
/// stopping at the first.
struct NodeReader {
    let file: String
    /// Resolves `${NAME}` in values (docs/reference/config.md#environment-variables).
    let environment: ConfigEnvironment
    private(set) var errors: [ConfigError] = []
    /// Values whose `${…}` could not be expanded, reported once however often they are read.
    private var unexpandable: Set<SourceLocation> = []

    init(file: String, environment: ConfigEnvironment = ConfigEnvironment([:])) {
        self.file = file
        self.environment = environment
    }

    func location(_ node: Node) -> SourceLocation {
        let mark = node.mark
        return SourceLocation(file: file, line: mark?.line ?? 1, column: mark?.column ?? 1)
    }

    mutating func fail(_ node: Node, _ message: String) {
        errors.append(ConfigError(location: location(node), message: message))
    }

    mutating func fail(at location: SourceLocation, _ message: String) {
        errors.append(ConfigError(location: location, message: message))
    }

    /// The entries of a mapping, reporting keys not in `allowed` (with a suggestion) and duplicate keys.
    mutating func mapping(_ node: Node, _ path: String, allowed: [String]) -> MappingView? {
        guard case .mapping(let mapping) = node else {
            fail(node, "\(NodeReader.quoted(path)) must be a mapping, not \(Self.kind(node))")
            return nil
        }
        var view = MappingView()
        for (key, value) in mapping {
            guard case .scalar(let scalar) = key else {
                fail(key, "keys in \(NodeReader.quoted(path)) must be plain strings")
                continue
            }
            let name = scalar.string
            guard allowed.contains(name) else {
                var message = "unknown key '\(name)' in \(NodeReader.quoted(path))"
                if let suggestion = Self.closest(name, allowed) { message += "; did you mean '\(suggestion)'?" }
                message += " (allowed: \(allowed.joined(separator: ", ")))"
                fail(key, message)
                continue
            }
            if view.entries[name] != nil {
                fail(key, "duplicate key '\(name)' in \(NodeReader.quoted(path))")
                continue
            }
            view.entries[name] = (key, value)
        }
        return view
    }

    /// A scalar's text with its `${NAME}` references expanded; every typed reader below goes through here.
    mutating func scalar(_ node: Node, _ path: String) -> String? {
        guard case .scalar(let scalar) = node else {
            fail(node, "\(NodeReader.quoted(path)) must be a single value, not \(Self.kind(node))")
            return nil
        }
        switch VariableExpansion.expand(scalar.string, environment.value) {
        case .success(let text):
            // No value of a config can hold NUL (a YAML "\0" or "\u0000"): the C calls that take paths and
            // addresses would cut it there and use what comes before.
            if text.utf8.contains(0) {
                fail(node, "\(NodeReader.quoted(path)): NUL (U+0000) cannot be part of a value")
                return nil
            }
            return text
        case .failure(let problem):
            if unexpandable.insert(location(node)).inserted { fail(node, "\(NodeReader.quoted(path)): \(problem)") }
            return nil
        }
    }

    mutating func string(_ node: Node, _ path: String, allowEmpty: Bool = false) -> String? {
        guard let text = scalar(node, path) else { return nil }
        if NodeReader.isNull(node) && !text.isEmpty {
            fail(node, "\(NodeReader.quoted(path)) must not be null")
            return nil
        }
        if !allowEmpty && text.isEmpty {
            fail(node, "\(NodeReader.quoted(path)) must not be empty")
            return nil
        }
        return text
    }

    mutating func bool(_ node: Node, _ path: String) -> Bool? {
        guard let text = scalar(node, path) else { return nil }
        switch text {
        case "true", "True", "TRUE", "yes", "on": return true
        case "false", "False", "FALSE", "no", "off": return false
        default:
            fail(node, "\(NodeReader.quoted(path)) must be true or false, not '\(text)'")
            return nil
        }
    }

    mutating func int(_ node: Node, _ path: String, range: ClosedRange<Int>) -> Int? {
        guard let text = scalar(node, path) else { return nil }
        guard let value = Int(text) else {
            fail(node, "\(NodeReader.quoted(path)) must be a whole number, not '\(text)'")
            return nil
        }
        guard range.contains(value) else {
            fail(
                node,
                "\(NodeReader.quoted(path)) must be between \(range.lowerBound) and \(range.upperBound), not \(value)")
            return nil
        }
        return value
    }

    mutating func double(_ node: Node, _ path: String, minimum: Double) -> Double? {
        guard let text = scalar(node, path) else { return nil }
        guard let value = Double(text), value.isFinite else {
            fail(node, "\(NodeReader.quoted(path)) must be a number, not '\(text)'")
            return nil
        }
        guard value >= minimum else {
            fail(node, "\(NodeReader.quoted(path)) must be at least \(minimum), not \(text)")
            return nil
        }
        return value
    }

    mutating func duration(_ node: Node, _ path: String) -> Duration? {
        guard let text = scalar(node, path) else { return nil }
        guard let value = DurationParser.parse(text) else {
            if DurationParser.isTooLong(text) {
                fail(node, "\(NodeReader.quoted(path)): '\(text)' is too long (at most 1000000000s, about 31 years)")
                return nil
            }
            fail(
                node,
                "\(NodeReader.quoted(path)): '\(text)' is not a duration (use a number with a unit: 250ms, 2s, 5m, 1h)")
            return nil
        }
        return value
    }

    mutating func size(_ node: Node, _ path: String) -> Int? {
        guard let text = scalar(node, path) else { return nil }
        guard let value = SizeParser.parse(text) else {
            fail(node, "\(NodeReader.quoted(path)): '\(text)' is not a size (use bytes or a unit: 512KiB, 8MiB, 1GiB)")
            return nil
        }
        return value
    }

    mutating func sequence(_ node: Node, _ path: String) -> [Node]? {
        if case .sequence(let sequence) = node { return Array(sequence) }
        fail(node, "\(NodeReader.quoted(path)) must be a list, not \(Self.kind(node))")
        return nil
    }

    mutating func stringList(_ node: Node, _ path: String) -> [(String, Node)]? {
        guard let items = sequence(node, path) else { return nil }
        var out: [(String, Node)] = []
        for item in items {
            if let text = string(item, "\(path)[]") { out.append((text, item)) }
        }
        return out
    }

    mutating func oneOf<T: RawRepresentable>(_ node: Node, _ path: String, _ cases: [T]) -> T?
    where T.RawValue == String {
        guard let text = scalar(node, path) else { return nil }
        if let value = cases.first(where: { $0.rawValue == text }) { return value }
        fail(
            node,
            "\(NodeReader.quoted(path)) must be one of \(cases.map(\.rawValue).joined(separator: " | ")), not '\(text)'"
        )
        return nil
    }

    /// A plain `~`, `null` or empty scalar: YAML's "no value".
    static func isNull(_ node: Node) -> Bool {
        guard case .scalar(let s) = node, s.style == .plain else { return false }
        return s.string.isEmpty || s.string == "~" || s.string == "null" || s.string == "Null" || s.string == "NULL"
    }

    /// A scalar whose text is empty (`""`, `''`, or nothing).
    static func isEmptyString(_ node: Node) -> Bool {
        if case .scalar(let s) = node { return s.string.isEmpty }
        return false
    }

    /// `path` quoted for a message: `'retry.attempts'`; under a named upstream only the key part is, since the
    /// label carries its own quotes (`upstream 'a': 'circuit.max_inflight'`).
    static func quoted(_ path: String) -> String {
        guard let separator = path.range(of: "': ") else { return "'\(path)'" }
        return "\(path[..<separator.lowerBound])': '\(path[separator.upperBound...])'"
    }

    static func kind(_ node: Node) -> String {
        switch node {
        case .scalar: "a single value"
        case .mapping: "a mapping"
        case .sequence: "a list"
        case .alias: "an alias"
        }
    }

    /// The allowed key closest to a misspelt one, for "did you mean": edit distance (a swap of neighbours counts
    /// as one edit) at most 2, or a third of the key's length for long keys (`per_tries` → `per_try`).
    static func closest(_ name: String, _ allowed: [String]) -> String? {
        let limit = Swift.max(2, name.count / 3)
        var best: (String, Int)?
        for candidate in allowed {
            let d = editDistance(Array(name), Array(candidate))
            if d <= limit, best == nil || d < best!.1 { best = (candidate, d) }
        }
        return best?.0
    }

    /// Optimal string alignment distance: insertions, deletions, substitutions and adjacent transpositions.
    static func editDistance(_ a: [Character], _ b: [Character]) -> Int {
        if a.isEmpty { return b.count }
        if b.isEmpty { return a.count }
        var beforePrevious: [Int] = []
        var previous = Array(0...b.count)
        for i in 1...a.count {
            var current = [i] + Array(repeating: 0, count: b.count)
            for j in 1...b.count {
                let cost = a[i - 1] == b[j - 1] ? 0 : 1
                current[j] = Swift.min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost)
                if i > 1, j > 1, a[i - 1] == b[j - 2], a[i - 2] == b[j - 1] {
                    current[j] = Swift.min(current[j], beforePrevious[j - 2] + 1)
                }
            }
            beforePrevious = previous
            previous = current
        }
        return previous[b.count]
    }
}

/// The known keys of one mapping, with their key and value nodes.
struct MappingView {
    var entries: [String: (key: Node, value: Node)] = [:]
    subscript(_ name: String) -> Node? { entries[name]?.value }
    func keyNode(_ name: String) -> Node? { entries[name]?.key }
}
