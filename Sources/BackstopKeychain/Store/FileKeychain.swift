import Foundation

/// An encrypted keychain file on disk (docs/reference/operations.md#keychain).
///
/// Reads take no lock: writers replace the file with an atomic rename, so a reader always sees a complete
/// keychain. Every read-modify-write holds an exclusive `flock` on `<path>.lock` for its whole duration, which
/// serializes writers across processes, threads and tasks. The synchronous methods block the calling thread
/// while waiting for the lock (pass `wait: false` to fail fast with `.lockBusy` instead); async callers use the
/// async `withExclusiveLock`, which waits on a dedicated thread and may hold the lock across `await`s.
///
/// A file that cannot be read (wrong key, truncated, tampered with) is never overwritten: every write first
/// decodes the current file under the lock and stops on any error.
public final class FileKeychain: Sendable {
    /// The keychain file.
    public let path: String
    let key: KeychainKey
    /// The largest keychain file read or written (64 MiB: thousands of certificate chains): anything larger is not
    /// a keychain, and reading it whole would take that much memory.
    public static let maxFileBytes = 64 << 20

    /// The key the file is sealed under, for what else Backstop seals under the keychain key (queued deliveries,
    /// docs/reference/behaviour.md#queued-delivery).
    public var sealingKey: KeychainKey { key }

    public init(path: String, key: KeychainKey) {
        self.path = path
        self.key = key
    }

    /// The sidecar file that carries the cross-process lock.
    public var lockPath: String { path + ".lock" }

    /// Whether the keychain file exists (it may still be unreadable).
    public func exists() throws(KeychainError) -> Bool {
        try Posix.exists(path)
    }

    /// Reads and decrypts the whole keychain. A missing file raises `.missing`.
    public func load() throws(KeychainError) -> [String: KeychainEntry] {
        let fd: Int32
        do {
            // Non-blocking: opening a FIFO for reading would wait for a writer (forever); it is refused below.
            fd = try Posix.open(path, O_RDONLY | O_NOCTTY | O_NONBLOCK)
        } catch .io(_, _, let code) where code == ENOENT {
            throw .missing(path: path)
        }
        defer { close(fd) }
        // A device (/dev/zero), a FIFO or a file far larger than any keychain is not read whole into memory.
        let info = try Posix.fstat(fd, path: path)
        guard info.st_mode & S_IFMT == S_IFREG else {
            throw .malformedContents(path: path, reason: "it is not a regular file")
        }
        guard info.st_size <= Self.maxFileBytes else {
            throw .malformedContents(
                path: path, reason: "it has \(info.st_size) bytes, more than a keychain's \(Self.maxFileBytes)")
        }
        do {
            return try KeychainCodec.decode(try Posix.readAll(fd, path: path), key: key)
        } catch {
            throw error.at(path: path)
        }
    }

    /// One entry, or nil when absent.
    public func entry(_ name: String) throws(KeychainError) -> KeychainEntry? {
        try load()[name]
    }

    /// Creates an empty keychain unless one exists. Returns whether it created one.
    @discardableResult
    public func createIfMissing() throws(KeychainError) -> Bool {
        try locked(wait: true) { () throws(KeychainError) -> Bool in
            if try exists() { return false }
            try write([:])
            return true
        }
    }

    /// Lock, re-read, apply `body`, write (only if the entries changed), unlock. Errors from `body` are rethrown
    /// and nothing is written.
    @discardableResult
    public func update<T>(
        wait: Bool = true, _ body: (inout [String: KeychainEntry]) throws -> T
    ) throws -> T {
        try withExclusiveLock(wait: wait) { session in
            var entries = session.entries
            let result = try body(&entries)
            if entries != session.entries { try session.write(entries) }
            return result
        }
    }

    /// Runs `body` holding the keychain lock, with the entries as they are on disk now; `body` decides whether to
    /// write (for token refresh: "lock, re-read, maybe refresh, write"). The session is only valid inside `body`.
    @discardableResult
    public func withExclusiveLock<T>(wait: Bool = true, _ body: (KeychainLockedSession) throws -> T) throws -> T {
        let outcome = try locked(wait: wait) { () throws(KeychainError) -> Result<T, any Error> in
            let session = KeychainLockedSession(keychain: self, entries: try load())
            defer { session.invalidate() }
            do { return .success(try body(session)) } catch { return .failure(error) }
        }
        return try outcome.get()
    }

    /// The async form of `withExclusiveLock`, for callers such as a token manager that must await network I/O
    /// (the token request) while holding the lock. The lock is waited for on a dedicated thread, never on the
    /// cooperative pool, and `body` runs in the caller's isolation.
    @discardableResult
    public func withExclusiveLock<T>(
        isolation: isolated (any Actor)? = #isolation, _ body: (KeychainLockedSession) async throws -> T
    ) async throws -> T {
        let lock: FileLock
        do throws(FileLock.Failure) {
            lock = try await FileLock.acquire(path: lockPath)
        } catch {
            throw error.keychainError(path: lockPath)
        }
        defer { lock.release() }
        let session = KeychainLockedSession(keychain: self, entries: try load())
        defer { session.invalidate() }
        return try await body(session)
    }

    /// Stores one entry (stamped `now`).
    public func set(_ name: String, value: [UInt8], now: Date = Date()) throws(KeychainError) {
        try KeychainEntryName.validate(name)
        try mutate { $0[name] = KeychainEntry(value: value, updated: now) }
    }

    /// Removes one entry, returning it (nil, and no write, when it was absent).
    @discardableResult
    public func remove(_ name: String) throws(KeychainError) -> KeychainEntry? {
        try mutate { $0.removeValue(forKey: name) }
    }

    /// Re-encrypts the keychain under `newKey` with one atomic replace, and returns the keychain opened with it.
    /// The current key must open the file; if it cannot, nothing is written.
    public func rekey(to newKey: KeychainKey) throws(KeychainError) -> FileKeychain {
        let rekeyed = FileKeychain(path: path, key: newKey)
        try locked(wait: true) { () throws(KeychainError) in
            try rekeyed.write(try load())
        }
        return rekeyed
    }

    // MARK: Internals

    private func mutate<T>(_ body: (inout [String: KeychainEntry]) -> T) throws(KeychainError) -> T {
        try locked(wait: true) { () throws(KeychainError) -> T in
            var entries = try load()
            let before = entries
            let result = body(&entries)
            if entries != before { try write(entries) }
            return result
        }
    }

    func locked<T>(wait: Bool, _ body: () throws(KeychainError) -> T) throws(KeychainError) -> T {
        let lock: FileLock
        do throws(FileLock.Failure) {
            lock = try FileLock(path: lockPath, wait: wait)
        } catch {
            throw error.keychainError(path: lockPath)
        }
        defer { lock.release() }
        return try body()
    }

    /// Must be called with the lock held: stale temporaries are only known to be abandoned while nobody else
    /// can be writing.
    func write(_ entries: [String: KeychainEntry]) throws(KeychainError) {
        AtomicFile.removeStaleTemporaries(for: path)
        let sealed = KeychainCodec.encode(entries, key: key)
        guard sealed.count <= Self.maxFileBytes else {
            throw .malformedContents(
                path: path, reason: "the entries would take \(sealed.count) bytes, more than \(Self.maxFileBytes)")
        }
        try AtomicFile.replace(path, with: sealed)
    }
}

/// The keychain as seen while holding its lock (see `FileKeychain.withExclusiveLock`). Not `Sendable` and
/// unusable once the closure returns: the lock belongs to the call that created it.
public final class KeychainLockedSession {
    private let keychain: FileKeychain
    private var valid = true
    /// The entries on disk, updated by `write`.
    public private(set) var entries: [String: KeychainEntry]

    init(keychain: FileKeychain, entries: [String: KeychainEntry]) {
        self.keychain = keychain
        self.entries = entries
    }

    /// The keychain file this session locks.
    public var path: String { keychain.path }

    /// Atomically replaces the keychain with `entries`.
    public func write(_ entries: [String: KeychainEntry]) throws(KeychainError) {
        guard valid else { throw .lockReleased(path: keychain.path) }
        try keychain.write(entries)
        self.entries = entries
    }

    func invalidate() { valid = false }
}
