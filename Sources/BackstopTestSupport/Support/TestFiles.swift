import Foundation

/// Scratch files for tests.
public enum TestFiles {
    /// Creates a fresh private directory under `NSTemporaryDirectory()` (mkdtemp) and returns its path.
    public static func makeTemporaryDirectory(prefix: String = "backstop-test") throws -> String {
        let base = NSTemporaryDirectory()
        let separator = base.hasSuffix("/") ? "" : "/"
        var template = Array("\(base)\(separator)\(prefix)-XXXXXX".utf8CString)
        let created = template.withUnsafeMutableBufferPointer { buffer in
            mkdtemp(buffer.baseAddress!)
        }
        guard created != nil else {
            throw TestFilesError.cannotCreateDirectory(errno: errno)
        }
        return template.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
    }

    /// Removes `path` and everything below it, ignoring errors (cleanup must not fail a test).
    public static func remove(_ path: String) {
        try? FileManager.default.removeItem(atPath: path)
    }
}

/// Failures of `TestFiles`.
public enum TestFilesError: Error, CustomStringConvertible {
    case cannotCreateDirectory(errno: Int32)

    public var description: String {
        switch self {
        case .cannotCreateDirectory(let code):
            return "mkdtemp failed with errno \(code)"
        }
    }
}
