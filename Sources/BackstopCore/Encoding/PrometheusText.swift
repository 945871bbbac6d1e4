/// The Prometheus text exposition format that `/metrics` serves (docs/reference/operations.md#metrics). Every source
/// of metrics writes through it, so the HELP and TYPE lines and label escaping are done one way.
public struct PrometheusText: Sendable {
    /// A metric family's TYPE.
    public enum Kind: String, Sendable {
        case counter, gauge, histogram, summary
    }

    /// The exposition written so far.
    public private(set) var text = ""

    public init() {}

    /// Starts a family: its HELP and TYPE lines (written even when no sample follows).
    public mutating func family(_ name: String, _ kind: Kind, _ help: String) {
        text += "# HELP \(name) \(help)\n# TYPE \(name) \(kind.rawValue)\n"
    }

    /// One sample: `name{label="value",…} value`, label values escaped, labels in the order given.
    public mutating func sample(
        _ name: String, _ labels: KeyValuePairs<String, String> = [:], _ value: some CustomStringConvertible
    ) {
        text += name
        if !labels.isEmpty {
            text += "{"
            var first = true
            for (label, labelValue) in labels {
                if !first { text += "," }
                first = false
                text += label + "=\"" + Self.escape(labelValue) + "\""
            }
            text += "}"
        }
        text += " \(value)\n"
    }

    /// One sample without labels: `name value`.
    public mutating func sample(_ name: String, _ value: some CustomStringConvertible) {
        sample(name, [:], value)
    }

    /// Appends an exposition written elsewhere.
    public mutating func append(_ other: PrometheusText) { text += other.text }

    /// A label value as the format quotes it: backslash, double quote and newline escaped.
    public static func escape(_ value: String) -> String {
        var out = ""
        for character in value {
            switch character {
            case "\\": out += "\\\\"
            case "\"": out += "\\\""
            case "\n": out += "\\n"
            default: out.append(character)
            }
        }
        return out
    }
}
