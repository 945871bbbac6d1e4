import BackstopCore
import Logging
import PostgresNIO

extension PostgresConnection {
    /// How long a statement may go unanswered before its connection counts as dead (a server stopped, a network that
    /// drops packets without a reset): then the connection is closed, which ends the statement with an error. A
    /// statement that waits for a lock (`lock_timeout`) gets that wait on top.
    static let statementDeadline = Duration.seconds(10)

    /// `query`, refused at once on a connection that has closed (the pool shut down under us, or the server went
    /// away), and ended when the server does not answer within `statementDeadline` + `waitsUpTo`. postgres-nio (1.33)
    /// hands a statement written to a closed connection to no one, and one on a connection whose server stopped
    /// answering waits for the kernel to give up on it (~15 min): the awaiting task never ends, not even when
    /// cancelled. Seen as a whole test run hanging (the pool closed a connection mid-transaction at shutdown, and the
    /// `ROLLBACK` after the failed statement waited forever), and as a refresh and the drain held while the database
    /// was stopped (docs/reference/token-store.md#failure-semantics). Closing the connection ends the statement.
    /// PostgreSQL rolls back a transaction whose connection is gone, so nothing is lost by not sending one.
    /// Discardable as postgres-nio's `query` is: a statement that returns no rows (`BEGIN`, `LOCK`, DDL) has
    /// finished once the call returns, and its failure is thrown, not returned.
    @discardableResult
    func queryIfOpen(
        _ query: PostgresQuery, logger: Logger, waitsUpTo wait: Duration = .zero
    ) async throws
        -> PostgresRowSequence
    {
        guard !isClosed else { throw TokenStoreError.unavailable("the connection to the database closed") }
        let deadline = Self.statementDeadline + wait
        // A timer on the connection's own event loop, not a task: the statement is awaited here, and only closing
        // the connection ends it.
        let expired = OnceFlag()
        let timer = eventLoop.scheduleTask(in: .nanoseconds(deadline.nanosecondsClamped)) { [self] in
            expired.set()
            let closing: EventLoopFuture<Void> = self.close()
            closing.whenComplete { _ in }
        }
        defer { timer.cancel() }
        do {
            return try await self.query(query, logger: logger)
        } catch  where expired.isSet {
            throw TokenStoreError.unavailable("the database did not answer within \(deadline)")
        }
    }
}
