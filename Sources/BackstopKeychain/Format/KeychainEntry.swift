import Foundation

/// One stored secret: opaque bytes plus the time it was last written.
public struct KeychainEntry: Sendable, Equatable {
    /// The secret itself. Bytes rather than a String so binary secrets survive unchanged.
    public var value: [UInt8]
    /// When the entry was last set. Stored with full `Date` precision.
    public var updated: Date

    public init(value: [UInt8], updated: Date = Date()) {
        self.value = value
        self.updated = updated
    }

    public init(string: String, updated: Date = Date()) {
        self.init(value: Array(string.utf8), updated: updated)
    }

    /// The value decoded as UTF-8, or nil when it is not valid UTF-8.
    public var stringValue: String? {
        String(validating: value, as: UTF8.self)
    }
}

extension KeychainEntry: CustomStringConvertible, CustomDebugStringConvertible, CustomReflectable {
    // A secret must never reach a log through string interpolation, `print` or `dump`.
    public var description: String { "KeychainEntry(\(value.count) bytes, updated \(updated))" }
    public var debugDescription: String { description }
    public var customMirror: Mirror { Mirror(self, children: ["updated": updated]) }
}

/// Rules for entry names, shared by the CLI and the token manager.
public enum KeychainEntryName {
    /// Longest accepted name, in UTF-8 bytes.
    public static let maxLength = 255

    /// Accepts non-empty names of at most 255 bytes without whitespace or control characters, so that
    /// `keychain list` (one name per line, tab-separated) can always be parsed back.
    public static func validate(_ name: String) throws(KeychainError) {
        if name.isEmpty { throw .invalidEntryName(name, reason: "empty") }
        if name.utf8.count > maxLength {
            throw .invalidEntryName(name, reason: "longer than \(maxLength) bytes")
        }
        for scalar in name.unicodeScalars {
            if scalar.properties.isWhitespace || scalar.properties.generalCategory == .control
                || scalar.properties.generalCategory == .format
            {
                throw .invalidEntryName(name, reason: "contains whitespace or a control character")
            }
        }
    }
}
