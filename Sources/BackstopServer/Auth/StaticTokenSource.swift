import BackstopCore
import BackstopKeychain
import NIOConcurrencyHelpers

#if canImport(Glibc)
import Glibc
#endif

/// The value of a keychain entry for `auth: static`, cached and re-read when the keychain file changes
/// (checked at most once a second), so `backstop keychain set` takes effect without a restart.
final class StaticTokenSource: Sendable {
    private struct Cache {
        var value: String?
        var modified: timespec = timespec()
        /// -1: not read yet, or the last look failed: read at the next look.
        var size: Int = -1
        /// The second of the last look (nil: none yet).
        var checkedAt: Int64?
    }

    private let keychain: FileKeychain
    private let entry: String
    private let clock: any BackstopClock
    private let cache = NIOLockedValueBox(Cache())

    init(keychain: FileKeychain, entry: String, clock: any BackstopClock = SystemClock()) {
        self.keychain = keychain
        self.entry = entry
        self.clock = clock
    }

    /// The current value, or nil when the entry is absent, the keychain unreadable, or the value cannot be a
    /// header value (a control character such as CR or LF would let the entry inject header lines upstream).
    func value() -> String? {
        let now = clock.monotonic().secondsAndAttoseconds.seconds
        return cache.withLockedValue { cache in
            if cache.checkedAt == now { return cache.value }
            cache.checkedAt = now
            var info = stat()
            guard stat(keychain.path, &info) == 0 else {
                // Looked at again next second, whatever the file's times are then.
                cache.size = -1
                cache.value = nil
                return nil
            }
            if info.st_mtim.tv_sec == cache.modified.tv_sec && info.st_mtim.tv_nsec == cache.modified.tv_nsec
                && Int(info.st_size) == cache.size
            {
                return cache.value
            }
            cache.modified = info.st_mtim
            cache.size = Int(info.st_size)
            do {
                let stored = try keychain.entry(entry)?.stringValue
                cache.value = stored.flatMap { HTTPSyntax.isFieldValue($0) ? $0 : nil }
            } catch {
                // A read that failed (descriptors exhausted, an I/O error, a file caught mid-replace) is tried again
                // next second: the file's times and size alone would keep the failure until the file changed.
                cache.size = -1
                cache.value = nil
            }
            return cache.value
        }
    }
}
