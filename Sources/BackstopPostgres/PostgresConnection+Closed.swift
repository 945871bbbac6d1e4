import BackstopCore
import Logging
import PostgresNIO

extension PostgresConnection {
    /// `query`, refused at once on a connection that has closed (the pool shut down under us, or the server went
    /// away). postgres-nio (1.33) hands a statement written to a closed connection to no one: its answer never
    /// comes, and the awaiting task never ends, not even when cancelled. Seen as a whole test run hanging: the pool
    /// closed a connection mid-transaction at shutdown, and the `ROLLBACK` after the failed statement waited forever.
    /// PostgreSQL rolls back a transaction whose connection is gone, so nothing is lost by not sending one.
    /// Discardable as postgres-nio's `query` is: a statement that returns no rows (`BEGIN`, `LOCK`, DDL) has
    /// finished once the call returns, and its failure is thrown, not returned.
    @discardableResult
    func queryIfOpen(_ query: PostgresQuery, logger: Logger) async throws -> PostgresRowSequence {
        guard !isClosed else { throw TokenStoreError.unavailable("the connection to the database closed") }
        return try await self.query(query, logger: logger)
    }
}
