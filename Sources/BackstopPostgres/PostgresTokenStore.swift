import BackstopCore
import NIOConcurrencyHelpers
import PostgresNIO

/// One upstream's row in the fleet token store (docs/reference/token-store.md#how-a-refresh-runs).
///
/// A refresh is one transaction: take the upstream's advisory lock (waiting while another instance refreshes),
/// re-read the row (refused when older than one this instance has seen), let the token manager decide (adopt what
/// is stored, or call the token endpoint), write the new tokens sealed with the next version and notify the fleet,
/// commit. Nobody uses the new tokens before the commit; a holder that dies mid-transaction releases the lock with
/// its connection and writes nothing.
final class PostgresTokenStore: TokenStore {
    let backend: PostgresTokenBackend
    let prefix: String

    init(backend: PostgresTokenBackend, prefix: String) {
        self.backend = backend
        self.prefix = prefix
    }

    var location: String { "\(backend.location) (\(prefix))" }

    func load() async throws(TokenStoreError) -> StoredTokens {
        let started = ContinuousClock.now
        do {
            try await backend.ensureTable()
            let prefix = self.prefix
            let backend = self.backend
            let row = try await backend.withConnectionWait { _ in try await backend.readRow(prefix) }
            var tokens = StoredTokens()
            if let row { tokens = try await backend.accept(row, prefix: prefix) }
            backend.metrics.record(store: "postgres", operation: "load", ok: true, seconds: started.secondsSince)
            return tokens
        } catch {
            backend.metrics.record(store: "postgres", operation: "load", ok: false, seconds: started.secondsSince)
            throw Self.storeError(error)
        }
    }

    func withRefreshLock<Result: Sendable>(
        _ decide: @Sendable (StoredTokens) async -> LockedDecision<Result>
    ) async throws(TokenStoreError) -> (result: Result, writeFailure: TokenStoreError?) {
        let started = ContinuousClock.now
        try await backend.ensureTable()
        // The decision escapes the transaction's closure through this box: a failed write rolls the transaction
        // back (by throwing), but what the token endpoint issued must still reach the token manager.
        let decided = NIOLockedValueBox<(Result, TokenStoreError?)?>(nil)
        let written = NIOLockedValueBox<Int64?>(nil)
        let prefix = self.prefix
        let backend = self.backend
        do {
            // The transaction's closure runs to completion inside `transaction` (its task group awaits it).
            try await withoutActuallyEscaping(decide) { decide in
                try await backend.transaction { connection in
                    let waited = try await backend.lock(prefix, on: connection)
                    backend.metrics.recordLockWait(store: "postgres", seconds: waited)
                    let row = try await backend.readRow(prefix, on: connection)
                    var stored = StoredTokens()
                    if let row {
                        // A rolled-back row throws here: nothing decided, nothing sent, nothing written.
                        stored = try await backend.accept(row, prefix: prefix)
                        backend.observe(prefix, version: row.version)
                    }
                    let decision = await decide(stored)
                    guard let new = decision.store else {
                        decided.withLockedValue { $0 = (decision.result, nil) }
                        if let failure = decision.failure, row != nil {
                            await backend.record(failure, prefix: prefix, on: connection)
                        }
                        return
                    }
                    let version = RowVersions.next(after: row?.version, highWater: backend.marks.mark(prefix))
                    do {
                        try await backend.write(
                            new, version: version, prefix: prefix, outcome: "refreshed", on: connection)
                        decided.withLockedValue { $0 = (decision.result, nil) }
                        written.withLockedValue { $0 = version }
                    } catch {
                        let failure = TokenStoreError.writeFailed(PostgresTokenBackend.describe(error))
                        decided.withLockedValue { $0 = (decision.result, failure) }
                        throw error
                    }
                }
            }
        } catch {
            if let (result, failure) = decided.withLockedValue({ $0 }) {
                // Decided, then the write or the commit failed: the caller keeps the tokens and writes again.
                backend.metrics.record(
                    store: "postgres", operation: "refresh", ok: false, seconds: started.secondsSince)
                return (result, failure ?? .writeFailed(PostgresTokenBackend.describe(error)))
            }
            backend.metrics.record(store: "postgres", operation: "refresh", ok: false, seconds: started.secondsSince)
            throw Self.storeError(error)
        }
        backend.metrics.record(store: "postgres", operation: "refresh", ok: true, seconds: started.secondsSince)
        // Committed: only now is the written version this instance's newest (a failed commit must not raise the mark
        // above the row, or the instance would refuse its own row).
        if let version = written.withLockedValue({ $0 }) { await backend.wrote(prefix, version: version) }
        guard let (result, failure) = decided.withLockedValue({ $0 }) else {
            throw .unavailable("the refresh transaction ended without a decision")
        }
        return (result, failure)
    }

    func storeIfUnchanged(_ tokens: StoredTokens, expectedRefreshToken: String?) async throws(TokenStoreError) -> Bool {
        let started = ContinuousClock.now
        let prefix = self.prefix
        let backend = self.backend
        do {
            // The write goes ahead only over the row the spent refresh token came from (also when that row was
            // rolled back to it since: these tokens are newer than it).
            let written = try await backend.transaction { connection -> Int64? in
                _ = try await backend.lock(prefix, on: connection)
                let row = try await backend.readRow(prefix, on: connection)
                guard row?.tokens.refreshToken == expectedRefreshToken else { return nil }
                let version = RowVersions.next(after: row?.version, highWater: backend.marks.mark(prefix))
                try await backend.write(tokens, version: version, prefix: prefix, outcome: "refreshed", on: connection)
                return version
            }
            backend.metrics.record(store: "postgres", operation: "write", ok: true, seconds: started.secondsSince)
            if let written { await backend.wrote(prefix, version: written) }
            return written != nil
        } catch {
            backend.metrics.record(store: "postgres", operation: "write", ok: false, seconds: started.secondsSince)
            throw PostgresTokenBackend.writeError(error)
        }
    }

    var revision: TokenStoreRevision? { backend.revision(prefix) }

    func changes(for upstream: String) -> AsyncStream<StoredTokens>? { backend.subscribe(prefix, upstream: upstream) }

    func status() async throws(TokenStoreError) -> TokenStoreStatus {
        let prefix = self.prefix
        let backend = self.backend
        do {
            try await backend.ensureTable()
            return try await backend.withConnectionWait { _ async throws -> TokenStoreStatus in
                let rows = try await backend.client.query(
                    """
                    SELECT sealed, extract(epoch from updated_at)::double precision, refreshed_by, last_outcome
                    FROM \(unescaped: backend.sqlTable) WHERE prefix = \(prefix)
                    """)
                for try await (sealed, updated, by, outcome) in rows.decode((ByteBuffer, Double, String, String).self) {
                    let tokens = try backend.open(sealed, prefix: prefix).tokens
                    let (written, failure) = PostgresTokenBackend.outcomes(outcome)
                    return TokenStoreStatus(
                        hasAccessToken: tokens.accessToken != nil, hasRefreshToken: tokens.refreshToken != nil,
                        expiresAt: tokens.expiresAt, updatedAt: updated, lastWrite: "\(written) by \(by)",
                        failure: failure)
                }
                return TokenStoreStatus()
            }
        } catch {
            throw Self.storeError(error)
        }
    }

    /// Replaces the row whatever it holds (rolled back, or sealed under another key), with a version above every
    /// version any instance can have seen (`RowVersions.seed`), so the whole fleet accepts it.
    func seed(refreshToken: String) async throws(TokenStoreError) {
        let prefix = self.prefix
        let backend = self.backend
        let now = backend.clock.wall()
        do {
            try await backend.ensureTable()
            let version = try await backend.transaction { connection -> Int64 in
                _ = try await backend.lock(prefix, on: connection)
                let stored: Int64?
                do {
                    stored = try await backend.readRow(prefix, on: connection)?.version
                } catch is TokenStoreError {
                    stored = nil  // sealed under another key: replaced all the same
                }
                let version = RowVersions.seed(after: stored, highWater: backend.marks.mark(prefix), now: now)
                try await backend.write(
                    StoredTokens(refreshToken: refreshToken), version: version, prefix: prefix,
                    outcome: "seeded", on: connection)
                return version
            }
            await backend.wrote(prefix, version: version)
        } catch {
            throw PostgresTokenBackend.writeError(error)
        }
    }

    static func storeError(_ error: any Error) -> TokenStoreError { PostgresTokenBackend.storeError(error) }
}

extension ContinuousClock.Instant {
    var secondsSince: Duration { ContinuousClock.now - self }
}
