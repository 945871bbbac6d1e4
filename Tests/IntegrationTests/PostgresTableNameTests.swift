import BackstopCore
import BackstopKeychain
import BackstopPostgres
import BackstopTestSupport
import Foundation
import Testing

/// `token_store.table` names that are SQL reserved words work: every statement quotes the table
/// (docs/reference/token-store.md). Against a real PostgreSQL server.
@Suite("PostgreSQL table names", .enabled(if: TestPostgres.isAvailable, "\(TestPostgres.unavailableReason ?? "")"))
struct PostgresTableNameTests {
    @Test(
        "a table named select, user or order: created, written, read, notified and checked",
        arguments: ["select", "user", "order"])
    func reservedWord(table: String) async throws {
        try await PostgresStoreTests.withCluster { pg in
            let key = KeychainKey.generate()
            let a = try PostgresStoreTests.backend(pg, key: key, instance: "a", table: table)
            let b = try PostgresStoreTests.backend(pg, key: key, instance: "b", table: table)
            try await PostgresStoreTests.running([a, b]) {
                let storeA = a.store(forPrefix: "api")
                let storeB = b.store(forPrefix: "api")
                let changes = try #require(storeB.changes(for: "app"))
                let tokens = StoredTokens(accessToken: "access-1", refreshToken: "refresh-1", expiresAt: 2e9)
                let (_, failure) = try await storeA.withRefreshLock { _ in LockedDecision(result: (), store: tokens) }
                #expect(failure == nil)
                #expect(await changes.next(within: .seconds(20)) == tokens)
                let (underLock, _) = try await storeB.withRefreshLock { stored in LockedDecision(result: stored) }
                #expect(underLock == tokens)
                let status = try await storeB.status()
                #expect(status.hasAccessToken && status.hasRefreshToken)
                #expect(await a.check().isEmpty)
            }
        }
    }
}
