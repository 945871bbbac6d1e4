import Foundation

/// `/status.json`: the snapshot with snake_case keys, sorted so the output is stable; a key left out means
/// "unknown" (no answered request in the window, no expiry known).
public enum StatusJSON {
    public static func render(_ snapshot: StatusSnapshot) -> String {
        let encoder = JSONEncoder()
        encoder.keyEncodingStrategy = .convertToSnakeCase
        encoder.outputFormatting = [.sortedKeys, .prettyPrinted, .withoutEscapingSlashes]
        encoder.nonConformingFloatEncodingStrategy = .convertToString(
            positiveInfinity: "inf", negativeInfinity: "-inf", nan: "nan")
        guard let data = try? encoder.encode(snapshot) else { return "{}\n" }
        return String(decoding: data, as: UTF8.self) + "\n"
    }
}
