import BackstopCore
import BackstopKeychain
import Foundation
import Logging

/// The default token store: entries `<prefix>/access_token`, `<prefix>/refresh_token` and `<prefix>/expires_at` in
/// the keychain file, and `<prefix>/last_refresh_failure` while the last refresh failed
/// (docs/reference/token-store.md). The refresh lock is the keychain's own exclusive file lock, so
/// single flight spans the processes that share the file; they see each other's tokens when they re-read under it.
final class KeychainTokenStore: TokenStore {
    let keychain: FileKeychain
    let prefix: String
    private let logger: Logger
    private let metrics: TokenStoreMetrics

    init(keychain: FileKeychain, prefix: String, logger: Logger, metrics: TokenStoreMetrics) {
        self.keychain = keychain
        self.prefix = prefix
        self.logger = logger
        self.metrics = metrics
    }

    var location: String { "keychain \(keychain.path) (\(prefix)/…)" }

    var accessEntry: String { "\(prefix)/access_token" }
    var refreshEntry: String { "\(prefix)/refresh_token" }
    var expiryEntry: String { "\(prefix)/expires_at" }
    /// `SECONDS CAUSE` of the last failed refresh; removed by the next write of tokens.
    var failureEntry: String { "\(prefix)/last_refresh_failure" }

    func tokens(in entries: [String: KeychainEntry]) -> StoredTokens {
        StoredTokens(
            accessToken: entries[accessEntry]?.stringValue.flatMap { $0.isEmpty ? nil : $0 },
            refreshToken: entries[refreshEntry]?.stringValue.flatMap { $0.isEmpty ? nil : $0 },
            expiresAt: entries[expiryEntry]?.stringValue.flatMap(StoredTokens.storedTime))
    }

    /// `entries` with `tokens` written over this upstream's entries (a refresh token is never removed: an endpoint
    /// that does not rotate sends none back).
    func merging(
        _ tokens: StoredTokens, into entries: [String: KeychainEntry], at stamp: Date
    ) -> [String: KeychainEntry] {
        var updated = entries
        updated[accessEntry] = tokens.accessToken.map { KeychainEntry(string: $0, updated: stamp) }
        updated[expiryEntry] = tokens.expiresAt.map {
            KeychainEntry(string: String(Int64($0.rounded(.down))), updated: stamp)
        }
        if let refresh = tokens.refreshToken, refresh != entries[refreshEntry]?.stringValue {
            updated[refreshEntry] = KeychainEntry(string: refresh, updated: stamp)
        }
        updated[failureEntry] = nil
        return updated
    }

    func load() async throws(TokenStoreError) -> StoredTokens {
        do {
            return tokens(in: try keychain.load())
        } catch {
            throw .unavailable(error.description)
        }
    }

    func withRefreshLock<Result: Sendable>(
        _ decide: @Sendable (StoredTokens) async -> LockedDecision<Result>
    ) async throws(TokenStoreError) -> (result: Result, writeFailure: TokenStoreError?) {
        let started = ContinuousClock.now
        var locked: ContinuousClock.Instant?
        // The refresh step ran and whatever it decided to store is on disk: what the metric counts as ok.
        var completed = false
        defer {
            if let locked { metrics.recordLockWait(store: "keychain", seconds: locked - started) }
            metrics.record(
                store: "keychain", operation: "refresh", ok: completed, seconds: ContinuousClock.now - started)
        }
        do {
            return try await keychain.withExclusiveLock { session in
                locked = ContinuousClock.now
                let entries = session.entries
                let decision = await decide(tokens(in: entries))
                guard let new = decision.store else {
                    if let failure = decision.failure { record(failure, over: entries, in: session) }
                    completed = true
                    return (decision.result, nil)
                }
                do throws(KeychainError) {
                    try session.write(merging(new, into: entries, at: Date()))
                } catch .durabilityUnconfirmed(let path, let code) {
                    logger.warning(
                        "keychain written but not synced",
                        metadata: [
                            "keychain": .string(path),
                            "problem": .string(
                                KeychainError.durabilityUnconfirmed(path: path, errno: code).description),
                        ])
                } catch {
                    return (decision.result, TokenStoreError.writeFailed(error.description))
                }
                completed = true
                return (decision.result, nil)
            }
        } catch let error as KeychainError {
            throw .unavailable(error.description)
        } catch {
            throw .unavailable(String(describing: type(of: error)))
        }
    }

    /// Notes a failed refresh for `tokens list`, under the lock the refresh held. A note that cannot be written is
    /// logged, not thrown: the refresh's own outcome is what the requests waiting on it need.
    private func record(
        _ failure: RefreshFailure, over entries: [String: KeychainEntry], in session: KeychainLockedSession
    ) {
        var updated = entries
        updated[failureEntry] = KeychainEntry(string: failure.stored)
        do throws(KeychainError) {
            try session.write(updated)
        } catch .durabilityUnconfirmed {
            return  // written; its fsync unconfirmed: a note, not tokens
        } catch {
            logger.warning(
                "cannot note the failed refresh in the keychain",
                metadata: ["keychain": .string(keychain.path), "problem": .string(error.description)])
        }
    }

    func storeIfUnchanged(_ tokens: StoredTokens, expectedRefreshToken: String?) async throws(TokenStoreError) -> Bool {
        do {
            return try await keychain.withExclusiveLock { (session: KeychainLockedSession) async throws -> Bool in
                let stored = session.entries
                guard stored[refreshEntry]?.stringValue == expectedRefreshToken else { return false }
                do throws(KeychainError) {
                    try session.write(merging(tokens, into: stored, at: Date()))
                } catch .durabilityUnconfirmed {
                    return true
                }
                return true
            }
        } catch let error as KeychainError {
            throw .writeFailed(error.description)
        } catch {
            throw .writeFailed(String(describing: type(of: error)))
        }
    }

    /// The keychain file's size, modification time and inode: any write by any process (an atomic replace makes a
    /// new inode) changes it.
    var revision: TokenStoreRevision? {
        var info = stat()
        guard stat(keychain.path, &info) == 0 else { return nil }
        return TokenStoreRevision([
            Int64(info.st_size), Int64(info.st_mtim.tv_sec), Int64(info.st_mtim.tv_nsec),
            Int64(bitPattern: UInt64(info.st_ino)),
        ])
    }

    func changes(for upstream: String) -> AsyncStream<StoredTokens>? { nil }

    func status() async throws(TokenStoreError) -> TokenStoreStatus {
        let entries: [String: KeychainEntry]
        do {
            entries = try keychain.load()
        } catch {
            throw .unavailable(error.description)
        }
        let tokens = tokens(in: entries)
        let updated = entries[accessEntry]?.updated ?? entries[refreshEntry]?.updated
        return TokenStoreStatus(
            hasAccessToken: tokens.accessToken != nil, hasRefreshToken: tokens.refreshToken != nil,
            expiresAt: tokens.expiresAt, updatedAt: updated?.timeIntervalSince1970,
            lastWrite: entries[accessEntry] != nil ? "refreshed" : (entries[refreshEntry] != nil ? "seeded" : nil),
            failure: entries[failureEntry]?.stringValue.flatMap { RefreshFailure(stored: $0) })
    }

    func seed(refreshToken: String) async throws(TokenStoreError) {
        do {
            try await keychain.withExclusiveLock { (session: KeychainLockedSession) async throws in
                var entries = session.entries
                entries[accessEntry] = nil
                entries[expiryEntry] = nil
                entries[failureEntry] = nil  // a new grant: no refresh of it has failed
                entries[refreshEntry] = KeychainEntry(string: refreshToken)
                do throws(KeychainError) {
                    try session.write(entries)
                } catch .durabilityUnconfirmed {
                    return
                }
            }
        } catch let error as KeychainError {
            throw .writeFailed(error.description)
        } catch {
            throw .writeFailed(String(describing: type(of: error)))
        }
    }
}

/// Keychain token stores for every upstream of one keychain.
public struct KeychainTokenStoreProvider: TokenStoreProvider {
    let keychain: FileKeychain
    let logger: Logger
    let metrics: TokenStoreMetrics

    public init(keychain: FileKeychain, logger: Logger, metrics: TokenStoreMetrics) {
        self.keychain = keychain
        self.logger = logger
        self.metrics = metrics
    }

    public func store(forPrefix prefix: String) -> any TokenStore {
        KeychainTokenStore(keychain: keychain, prefix: prefix, logger: logger, metrics: metrics)
    }

    public var location: String { "keychain \(keychain.path)" }
}
