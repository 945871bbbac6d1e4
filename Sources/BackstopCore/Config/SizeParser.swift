/// Parses config sizes: plain bytes (`1048576`), binary units (`512KiB`, `8MiB`, `1GiB`), decimal units (`10KB`,
/// `5MB`, `1GB`) or `B`. Fractions are allowed with a unit (`1.5MiB`) and rounded to whole bytes.
public enum SizeParser {
    private static let units: [(suffix: String, bytes: Double)] = [
        ("KiB", 1024), ("MiB", 1_048_576), ("GiB", 1_073_741_824),
        ("KB", 1000), ("MB", 1_000_000), ("GB", 1_000_000_000), ("B", 1),
    ]

    /// The size in bytes, or nil when malformed, negative or above 1 PB (surely a typo).
    public static func parse(_ text: String) -> Int? {
        let trimmed = text.trimmingCharacters(in: " \t")
        for unit in units where trimmed.hasSuffix(unit.suffix) {
            let number = String(trimmed.dropLast(unit.suffix.count)).trimmingCharacters(in: " ")
            guard DurationParser.isPlainDecimal(number), let value = Double(number) else { return nil }
            let bytes = value * unit.bytes
            guard bytes < 1e15 else { return nil }
            return Int(bytes.rounded())
        }
        guard !trimmed.isEmpty, trimmed.count < 16, trimmed.allSatisfy(\.isASCIIDigit) else { return nil }
        return Int(trimmed)
    }
}
