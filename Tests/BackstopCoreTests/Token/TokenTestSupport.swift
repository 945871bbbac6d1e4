import BackstopCore
import Testing

func tokenBytes(_ text: String) -> [UInt8] { Array(text.utf8) }

/// `#expect(a == b)` for values produced by `mutating` calls, which `#expect` cannot take directly (the macro
/// captures the receiver immutably).
func expectValue<T: Equatable>(
    _ actual: T, _ expected: T, sourceLocation: Testing.SourceLocation = #_sourceLocation
) {
    #expect(actual == expected, sourceLocation: sourceLocation)
}
