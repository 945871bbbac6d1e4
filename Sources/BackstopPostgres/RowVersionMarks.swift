import BackstopKeychain
import Logging
import NIOConcurrencyHelpers

/// This instance's high-water marks (docs/reference/token-store.md#row-versions): per upstream row, the newest sealed
/// version it has seen, so it never uses an older row. Kept in memory and in the local keychain (entry
/// `<keychain_prefix>/row_version`), so a restart remembers them: a row restored while the daemon was stopped is
/// refused too. Marks only ever rise (writers of a shared keychain file merge by taking the larger).
final class RowVersionMarks: Sendable {
    private let keychain: FileKeychain?
    private let logger: Logger
    private let marks: NIOLockedValueBox<[String: Int64]>

    static let suffix = "/row_version"

    static func entryName(_ prefix: String) -> String { prefix + suffix }

    /// Reads the marks the keychain holds; a keychain that cannot be read now starts with none (logged): rows are
    /// then judged from what this process sees.
    init(keychain: FileKeychain?, logger: Logger) {
        self.keychain = keychain
        self.logger = logger
        var loaded: [String: Int64] = [:]
        if let keychain {
            do throws(KeychainError) {
                for (name, entry) in try keychain.load() where name.hasSuffix(Self.suffix) {
                    if let value = entry.stringValue.flatMap({ Int64($0) }) {
                        loaded[String(name.dropLast(Self.suffix.count))] = value
                    }
                }
            } catch {
                logger.warning(
                    "token store: cannot read the row versions seen before from the keychain",
                    metadata: [
                        "keychain": .string(keychain.path), "problem": .string(error.description),
                    ])
            }
        }
        marks = NIOLockedValueBox(loaded)
    }

    /// The newest version of `prefix`'s row seen (nil: none).
    func mark(_ prefix: String) -> Int64? { marks.withLockedValue { $0[prefix] } }

    /// Raises the mark of `prefix` to `version` (never lowers it), and writes it to the keychain before returning.
    /// A failed write is logged: the mark still holds in memory for this process.
    func raise(_ prefix: String, to version: Int64) async {
        let raised = marks.withLockedValue { marks in
            if let known = marks[prefix], known >= version { return false }
            marks[prefix] = version
            return true
        }
        guard raised, let keychain else { return }
        let name = Self.entryName(prefix)
        do {
            try await keychain.withExclusiveLock { (session: KeychainLockedSession) async throws in
                var entries = session.entries
                if let stored = entries[name]?.stringValue.flatMap({ Int64($0) }), stored >= version { return }
                entries[name] = KeychainEntry(string: String(version))
                do {
                    try session.write(entries)
                } catch KeychainError.durabilityUnconfirmed(_, _) {
                    // Written; only the directory's sync is unconfirmed.
                }
            }
        } catch {
            logger.warning(
                "token store: cannot record the row version seen in the keychain",
                metadata: [
                    "keychain": .string(keychain.path), "entry": .string(name), "problem": .string("\(error)"),
                ])
        }
    }
}
