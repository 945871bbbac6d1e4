import BackstopCore
import Logging
import NIOConcurrencyHelpers

#if canImport(Glibc)
import Glibc
#endif

/// A swift-log handler writing one event per line to stderr, as logfmt or JSON (docs/reference/operations.md).
///
/// Metadata keys that could carry secrets (`authorization`, `cookie`, `token`, `secret`, `password`, `key`)
/// are redacted here, as a last line of defence: callers must not log secrets in the first place.
public struct LineLogHandler: LogHandler {
    public var metadata: Logger.Metadata = [:]
    private let settings: LogSettings
    private let label: String

    /// `settings` is shared by every logger of the process, so a reload that changes `log.level` or `log.format`
    /// takes effect everywhere at once.
    public init(label: String, settings: LogSettings) {
        self.label = label
        self.settings = settings
    }

    public var logLevel: Logger.Level {
        get { settings.level }
        set { settings.level = newValue }
    }

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    public func log(event: LogEvent) {
        var merged = metadata
        if let extra = event.metadata { merged.merge(extra) { _, new in new } }
        let line = Self.render(
            time: Self.timestamp(), level: event.level, message: "\(event.message)", metadata: merged,
            format: settings.format)
        // One write(2) per line keeps lines whole when several threads log at once.
        var bytes = Array(line.utf8)
        bytes.withUnsafeMutableBytes { buffer in
            var offset = 0
            while offset < buffer.count {
                let n = Glibc.write(2, buffer.baseAddress! + offset, buffer.count - offset)
                if n <= 0 { break }
                offset += n
            }
        }
    }

    /// Renders one line (with trailing newline). Public for tests.
    public static func render(
        time: String, level: Logger.Level, message: String, metadata: Logger.Metadata, format: LogFormat
    ) -> String {
        var fields: [(String, String, isNumber: Bool)] = [
            ("time", time, false), ("level", level.rawValue, false), ("msg", message, false),
        ]
        for key in metadata.keys.sorted() {
            if isSensitive(key) {
                fields.append((key, "[redacted]", false))
            } else {
                let value = metadata[key]!
                fields.append((key, "\(value)", isNumber(value)))
            }
        }
        switch format {
        case .logfmt:
            return fields.map { "\($0.0)=\(logfmtQuote($0.1))" }.joined(separator: " ") + "\n"
        case .json:
            return "{"
                + fields.map { "\(jsonQuote($0.0)):\($0.isNumber ? $0.1 : jsonQuote($0.1))" }.joined(separator: ",")
                + "}\n"
        }
    }

    /// Numbers (and booleans) are written bare in JSON: `"status":502`, not `"status":"502"`.
    private static func isNumber(_ value: Logger.Metadata.Value) -> Bool {
        guard case .stringConvertible(let convertible) = value else { return false }
        if let double = convertible as? Double { return double.isFinite }
        return convertible is any LogNumber || convertible is Bool
    }

    /// Whether a metadata key may carry a secret: it contains `token`, `secret`, `password` or `credential`, or
    /// one of its words (split at `_`, `-`, `.`) is `key`, `apikey`, `authorization`, `cookie` or `set-cookie`.
    /// Matching `key` as a word keeps `keychain` or `monkey` readable while `key`, `api_key`, `key_id` are not.
    static func isSensitive(_ key: String) -> Bool {
        let lower = key.lowercased()
        if ["token", "secret", "password", "credential", "cookie", "authorization"].contains(where: {
            lower.contains($0)
        }) {
            return true
        }
        let words = lower.split(whereSeparator: { $0 == "_" || $0 == "-" || $0 == "." })
        return words.contains { $0 == "key" || $0 == "apikey" }
    }

    /// A logfmt value: bare when it holds only visible characters other than `=` and `"`, else quoted with every
    /// character of `DisplayText.mustEscape` escaped, so a client's SNI, path or header never starts a line of its own
    /// (docs/reference/operations.md#logs).
    static func logfmtQuote(_ value: String) -> String {
        var needsQuotes = value.isEmpty
        var ascii = true
        for byte in value.utf8 {
            if byte <= 0x20 || byte == 0x7F || byte == UInt8(ascii: "=") || byte == UInt8(ascii: "\"") {
                needsQuotes = true
                break
            }
            if byte >= 0x80 { ascii = false }
        }
        if !needsQuotes && !ascii { needsQuotes = value.unicodeScalars.contains(where: DisplayText.mustEscape) }
        guard needsQuotes else { return value }
        var out = "\""
        out.reserveCapacity(value.utf8.count + 2)
        for scalar in value.unicodeScalars { appendEscaped(scalar, to: &out) }
        return out + "\""
    }

    /// A JSON string with the same scalars escaped as in logfmt (JSON itself requires only C0, `"` and `\\`).
    static func jsonQuote(_ value: String) -> String {
        var out = "\""
        out.reserveCapacity(value.utf8.count + 2)
        for scalar in value.unicodeScalars { appendEscaped(scalar, to: &out) }
        return out + "\""
    }

    /// Appends `scalar`, escaped as logfmt and JSON both read it: `\"`, `\\`, `\n`, `\r`, `\t`, else `\uXXXX`.
    private static func appendEscaped(_ scalar: Unicode.Scalar, to out: inout String) {
        switch scalar {
        case "\"": out += "\\\""
        case "\\": out += "\\\\"
        default:
            if DisplayText.mustEscape(scalar) {
                DisplayText.escape(scalar, to: &out)
            } else {
                out.unicodeScalars.append(scalar)
            }
        }
    }

    static func timestamp() -> String {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        return ISO8601Time.format(seconds: Int64(now.tv_sec), milliseconds: Int(now.tv_nsec / 1_000_000))
    }
}

/// The log level and format every `LineLogHandler` of the process reads at each event (atomically swapped on
/// reload).
public final class LogSettings: Sendable {
    private let state: NIOLockedValueBox<(level: Logger.Level, format: LogFormat)>

    public init(level: Logger.Level, format: LogFormat) {
        state = NIOLockedValueBox((level, format))
    }

    public var level: Logger.Level {
        get { state.withLockedValue { $0.level } }
        set { state.withLockedValue { $0.level = newValue } }
    }

    public var format: LogFormat {
        get { state.withLockedValue { $0.format } }
        set { state.withLockedValue { $0.format = newValue } }
    }

    /// Applies a config's `log` section.
    public func apply(_ config: LogConfig) {
        state.withLockedValue { $0 = (config.level.loggerLevel, config.format) }
    }
}

extension LogLevel {
    /// The swift-log level for a config level.
    public var loggerLevel: Logger.Level {
        switch self {
        case .trace: .trace
        case .debug: .debug
        case .info: .info
        case .notice: .notice
        case .warning: .warning
        case .error: .error
        }
    }
}
