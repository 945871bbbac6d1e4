import BackstopCore
import NIOConcurrencyHelpers
import PostgresNIO

/// One upstream's row in the fleet token store (docs/reference/token-store.md#how-a-refresh-runs).
///
/// A refresh is one transaction: take the upstream's advisory lock (waiting while another instance refreshes),
/// re-read the row, let the token manager decide (adopt what is stored, or call the token endpoint), write the new
/// tokens with the version bumped and notify the fleet, commit. Nobody uses the new tokens before the commit; a
/// holder that dies mid-transaction releases the lock with its connection and writes nothing.
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
            let row = try await backend.withConnectionWait { try await backend.readRow(prefix) }
            backend.metrics.record(store: "postgres", operation: "load", ok: true, seconds: started.secondsSince)
            return row?.0 ?? StoredTokens()
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
        let prefix = self.prefix
        let backend = self.backend
        do {
            // The transaction's closure runs to completion inside `transaction` (its task group awaits it).
            try await withoutActuallyEscaping(decide) { decide in
                try await backend.transaction { connection in
                    let waited = try await backend.lock(prefix, on: connection)
                    backend.metrics.recordLockWait(store: "postgres", seconds: waited)
                    let stored = try await backend.readRow(prefix, on: connection)?.0 ?? StoredTokens()
                    let decision = await decide(stored)
                    guard let new = decision.store else {
                        decided.withLockedValue { $0 = (decision.result, nil) }
                        return
                    }
                    do {
                        try await backend.write(new, prefix: prefix, outcome: "refreshed", on: connection)
                        decided.withLockedValue { $0 = (decision.result, nil) }
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
                backend.metrics.record(store: "postgres", operation: "refresh", ok: false, seconds: started.secondsSince)
                return (result, failure ?? .writeFailed(PostgresTokenBackend.describe(error)))
            }
            backend.metrics.record(store: "postgres", operation: "refresh", ok: false, seconds: started.secondsSince)
            throw Self.storeError(error)
        }
        backend.metrics.record(store: "postgres", operation: "refresh", ok: true, seconds: started.secondsSince)
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
            let written = try await backend.transaction { connection -> Bool in
                _ = try await backend.lock(prefix, on: connection)
                let stored = try await backend.readRow(prefix, on: connection)?.0 ?? StoredTokens()
                guard stored.refreshToken == expectedRefreshToken else { return false }
                try await backend.write(tokens, prefix: prefix, outcome: "refreshed", on: connection)
                return true
            }
            backend.metrics.record(store: "postgres", operation: "write", ok: true, seconds: started.secondsSince)
            return written
        } catch {
            backend.metrics.record(store: "postgres", operation: "write", ok: false, seconds: started.secondsSince)
            throw .writeFailed(PostgresTokenBackend.describe(error))
        }
    }

    var revision: TokenStoreRevision? { backend.revision(prefix) }

    func changes() -> AsyncStream<StoredTokens>? { backend.subscribe(prefix) }

    func status() async throws(TokenStoreError) -> TokenStoreStatus {
        let prefix = self.prefix
        let backend = self.backend
        do {
            try await backend.ensureTable()
            return try await backend.withConnectionWait { () async throws -> TokenStoreStatus in
                let rows = try await backend.client.query("""
                    SELECT sealed, extract(epoch from updated_at)::double precision, refreshed_by, last_outcome
                    FROM \(unescaped: backend.sqlTable) WHERE prefix = \(prefix)
                    """)
                for try await (sealed, updated, by, outcome) in rows.decode((ByteBuffer, Double, String, String).self) {
                    let tokens = try backend.open(sealed, prefix: prefix)
                    return TokenStoreStatus(
                        hasAccessToken: tokens.accessToken != nil, hasRefreshToken: tokens.refreshToken != nil,
                        expiresAt: tokens.expiresAt, updatedAt: updated, lastWrite: "\(outcome) by \(by)")
                }
                return TokenStoreStatus()
            }
        } catch {
            throw Self.storeError(error)
        }
    }

    func seed(refreshToken: String) async throws(TokenStoreError) {
        let prefix = self.prefix
        let backend = self.backend
        do {
            try await backend.ensureTable()
            try await backend.transaction { connection in
                _ = try await backend.lock(prefix, on: connection)
                try await backend.write(StoredTokens(refreshToken: refreshToken), prefix: prefix, outcome: "seeded",
                                        on: connection)
            }
        } catch {
            throw .writeFailed(PostgresTokenBackend.describe(error))
        }
    }

    static func storeError(_ error: any Error) -> TokenStoreError {
        if let store = error as? TokenStoreError { return store }
        if let transaction = error as? PostgresTransactionError,
            let inner = transaction.closureError ?? transaction.beginError, let store = inner as? TokenStoreError
        {
            return store
        }
        return .unavailable(PostgresTokenBackend.describe(error))
    }
}

extension ContinuousClock.Instant {
    var secondsSince: Duration { ContinuousClock.now - self }
}
