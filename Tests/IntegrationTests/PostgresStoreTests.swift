import BackstopCore
import BackstopKeychain
import BackstopPostgres
import BackstopTestSupport
import Foundation
import Logging
import NIOConcurrencyHelpers
import Testing

/// The PostgreSQL token store against a real server (docs/reference/token-store.md): sealed rows, the refresh
/// transaction, notifications between instances, a tampered row, the database going away and coming back.
@Suite("PostgreSQL token store", .enabled(if: TestPostgres.isAvailable, "\(TestPostgres.unavailableReason ?? "")"))
struct PostgresStoreTests {
    static let quiet = Logger(label: "test") { _ in SwiftLogNoOpLogHandler() }

    static func backend(
        _ pg: TestPostgres, key: KeychainKey, instance: String, table: String = "backstop_tokens"
    )
        throws -> PostgresTokenBackend
    {
        let backend = try PostgresTokenBackend(
            config: PostgresStoreConfig(
                host: "127.0.0.1", port: pg.port, user: pg.user, database: pg.database,
                tls: .disable, table: table),
            password: pg.password, sealer: RecordSealer(keychainKey: key), logger: quiet, metrics: TokenStoreMetrics(),
            instanceID: instance)
        return backend
    }

    /// Waits (20 s at most) until PostgreSQL shows `count` sessions whose last statement was a `LISTEN`: the
    /// backends' listeners are connected then.
    static func waitForListeners(_ pg: TestPostgres, atLeast count: Int) async throws {
        let connected = try await Poll.holds(within: .seconds(20), every: .milliseconds(20)) {
            let listening = try await pg.psql(
                "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle' AND query ILIKE 'LISTEN %'")
            return (Int(listening.trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0) >= count
        }
        if !connected { Issue.record("fewer than \(count) token store listeners connected within 20 s") }
    }

    /// Runs `body` while every backend runs (their pools, listeners and table checks).
    static func running(_ backends: [PostgresTokenBackend], _ body: () async throws -> Void) async throws {
        guard let first = backends.first else { return try await body() }
        try await first.withRunning { try await running(Array(backends.dropFirst()), body) }
    }

    static func withCluster(_ body: (TestPostgres) async throws -> Void) async throws {
        let pg = try await TestPostgres.start()
        var failure: (any Error)?
        do { try await body(pg) } catch { failure = error }
        await pg.stop()
        if let failure { throw failure }
    }

    @Test(
        "a refresh stores sealed tokens (no plaintext in the table), another instance is notified and adopts them, and sees them under the lock"
    )
    func refreshNotifyAdopt() async throws {
        try await Self.withCluster { pg in
            let key = KeychainKey.generate()
            let a = try Self.backend(pg, key: key, instance: "a")
            let b = try Self.backend(pg, key: key, instance: "b")
            try await Self.running([a, b]) {
                let storeA = a.store(forPrefix: "api")
                let storeB = b.store(forPrefix: "api")
                let changes = try #require(storeB.changes(for: "app"))
                let before = storeB.revision
                // B's listener must be connected before A writes: a notification sent earlier reaches nobody.
                try await Self.waitForListeners(pg, atLeast: 2)

                let tokens = StoredTokens(
                    accessToken: "access-secret-1", refreshToken: "refresh-secret-1", expiresAt: 2e9)
                let (result, failure) = try await storeA.withRefreshLock { stored in
                    LockedDecision(result: stored, store: tokens)
                }
                #expect(result == StoredTokens())
                #expect(failure == nil)

                let seen = await changes.next(within: .seconds(20))
                #expect(seen == tokens)
                #expect(storeB.revision != before)
                let (underLock, _) = try await storeB.withRefreshLock { stored in LockedDecision(result: stored) }
                #expect(underLock == tokens)
                #expect(try await storeB.load() == tokens)

                let dump = try await pg.psql(
                    "SELECT prefix, encode(sealed, 'escape'), version, refreshed_by FROM backstop_tokens")
                #expect(dump.contains("api|"))
                #expect(dump.hasSuffix("|1|a\n"), "\(dump)")
                #expect(!dump.contains("secret"), "no plaintext token in the table")
            }
        }
    }

    @Test(
        "a failed refresh is noted in the row (tokens, version untouched) and shown by status; the next write clears it"
    )
    func refreshFailureNoted() async throws {
        try await Self.withCluster { pg in
            let a = try Self.backend(pg, key: KeychainKey.generate(), instance: "web-1:42")
            try await Self.running([a]) {
                let store = a.store(forPrefix: "api")
                let tokens = StoredTokens(accessToken: "x", refreshToken: "y", expiresAt: 2e9)
                _ = try await store.withRefreshLock { _ in LockedDecision(result: 0, store: tokens) }
                let written = try await store.status()
                #expect(written.failure == nil)
                #expect(written.lastRefresh?.outcome == "ok")

                let failure = RefreshFailure(at: 1_900_000_000, cause: "invalid_grant")
                _ = try await store.withRefreshLock { _ in LockedDecision(result: 0, failure: failure) }
                let failed = try await store.status()
                #expect(failed.failure == RefreshFailure(at: 1_900_000_000, cause: "invalid_grant", by: "web-1:42"))
                #expect(failed.lastWrite == "refreshed by web-1:42")
                #expect(failed.updatedAt == written.updatedAt)
                #expect(failed.lastRefresh?.at == 1_900_000_000)
                #expect(failed.lastRefresh?.outcome == "failed: invalid_grant (web-1:42)")
                #expect(try await store.load() == tokens)
                let version = try await pg.psql("SELECT version FROM backstop_tokens")
                #expect(version.trimmingCharacters(in: .whitespacesAndNewlines) == "1")

                // A second failure replaces the first; a write replaces both.
                _ = try await store.withRefreshLock { _ in
                    LockedDecision(result: 0, failure: RefreshFailure(at: 1_900_000_100, cause: "status-503"))
                }
                #expect(try await store.status().failure?.cause == "status-503")
                _ = try await store.withRefreshLock { _ in LockedDecision(result: 0, store: tokens) }
                let rewritten = try await store.status()
                #expect(rewritten.failure == nil)
                #expect(rewritten.lastWrite == "refreshed by web-1:42")
            }
        }
    }

    @Test(
        "eight refreshes at once whose token calls outlast the connection wait (the pool then has none free) all complete and are stored: none is cancelled holding issued tokens"
    )
    func slowRefreshesOnABusyPool() async throws {
        try await Self.withCluster { pg in
            let a = try Self.backend(pg, key: KeychainKey.generate(), instance: "a")
            try await Self.running([a]) {
                let prefixes = (1...8).map { "u\($0)" }
                // Each refresh's token call lasts until `release`: set once seven of them have held their connections
                // (idle in transaction, the pool's seven) past the 5-s connection wait, as behind a slow endpoint.
                let release = OnceFlag()
                async let refreshing = withTaskGroup(of: (String, Bool).self) { group in
                    for prefix in prefixes {
                        group.addTask {
                            let store = a.store(forPrefix: prefix)
                            let tokens = StoredTokens(
                                accessToken: "access-\(prefix)", refreshToken: "refresh-\(prefix)", expiresAt: 2e9)
                            do {
                                let (_, failure) = try await store.withRefreshLock { _ in
                                    await release.wait()
                                    return LockedDecision(result: 0, store: tokens)
                                }
                                return (prefix, failure == nil)
                            } catch {
                                return (prefix, false)
                            }
                        }
                    }
                    var outcomes: [String: Bool] = [:]
                    for await (prefix, ok) in group { outcomes[prefix] = ok }
                    return outcomes
                }
                let heldPastTheWait =
                    (try? await Poll.holds(within: .seconds(30), every: .milliseconds(100)) {
                        let held = try await pg.psql(
                            "SELECT count(*) FROM pg_stat_activity WHERE usename = 'backstop' AND state = "
                                + "'idle in transaction' AND now() - state_change > interval '5.5 seconds'")
                        return (Int(held.trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0) >= 7
                    }) ?? false
                release.set()
                let outcomes = await refreshing
                #expect(heldPastTheWait, "seven refreshes did not hold their connections past the connection wait")
                #expect(outcomes.filter { !$0.value }.isEmpty, "failed: \(outcomes.filter { !$0.value }.keys.sorted())")
                let rows = try await pg.psql("SELECT count(*) FROM backstop_tokens")
                #expect(rows.trimmingCharacters(in: .whitespacesAndNewlines) == "8")
            }
        }
    }

    @Test(
        "a database that hangs without closing its connections fails a refresh within the statement deadline instead of holding it"
    )
    func hungDatabaseFailsTheRefresh() async throws {
        try await Self.withCluster { pg in
            let a = try Self.backend(pg, key: KeychainKey.generate(), instance: "a")
            try await Self.running([a]) {
                let store = a.store(forPrefix: "api")
                let tokens = StoredTokens(accessToken: "x", refreshToken: "y", expiresAt: 2e9)
                _ = try await store.withRefreshLock { _ in LockedDecision(result: 0, store: tokens) }
                #expect(pg.freeze(true) >= 2)
                defer { pg.freeze(false) }
                let started = ContinuousClock.now
                let decided = NIOLockedValueBox(false)
                do {
                    _ = try await store.withRefreshLock { _ in
                        decided.withLockedValue { $0 = true }
                        return LockedDecision(result: 0, store: tokens)
                    }
                    Issue.record("a refresh against a stopped server succeeded")
                } catch {
                    #expect(
                        "\(error)".contains("did not answer") || "\(error)".contains("no connection"),
                        "\(error)")
                }
                let waited = ContinuousClock.now - started
                #expect(!decided.withLockedValue { $0 })
                #expect(waited < .seconds(25), "\(waited)")
                pg.freeze(false)
            }
        }
    }

    @Test("a row sealed under another key, or altered, is reported as unreadable with what to do; nothing crashes")
    func tamperedRow() async throws {
        try await Self.withCluster { pg in
            let a = try Self.backend(pg, key: KeychainKey.generate(), instance: "a")
            let other = try Self.backend(pg, key: KeychainKey.generate(), instance: "b")
            try await Self.running([a, other]) {
                let store = a.store(forPrefix: "api")
                _ = try await store.withRefreshLock { _ in
                    LockedDecision(result: 0, store: StoredTokens(accessToken: "x", refreshToken: "y", expiresAt: nil))
                }
                await #expect(throws: TokenStoreError.self) { try await other.store(forPrefix: "api").load() }
                try await pg.psql("UPDATE backstop_tokens SET sealed = overlay(sealed placing '\\x00'::bytea from 20)")
                do {
                    _ = try await store.load()
                    Issue.record("an altered row must not load")
                } catch {
                    guard case TokenStoreError.unreadable(let why) = error else { Issue.record("\(error)"); return }
                    #expect(why.contains("cannot be opened with this keychain key"))
                    #expect(why.contains("backstop tokens seed"))
                }
            }
        }
    }

    @Test("with the database down, operations fail fast as unavailable; after it is back they work again")
    func databaseDown() async throws {
        try await Self.withCluster { pg in
            let a = try Self.backend(pg, key: KeychainKey.generate(), instance: "a")
            try await Self.running([a]) {
                let store = a.store(forPrefix: "api")
                _ = try await store.load()
                try await pg.pause()
                let started = ContinuousClock.now
                do {
                    _ = try await store.withRefreshLock { _ in LockedDecision(result: 0) }
                    Issue.record("a refresh without the database must fail")
                } catch {
                    guard case TokenStoreError.unavailable = error else { Issue.record("\(error)"); return }
                }
                #expect(ContinuousClock.now - started < .seconds(15))
                try await pg.resume()
                let deadline = ContinuousClock.now + .seconds(30)
                var recovered = false
                while ContinuousClock.now < deadline && !recovered {
                    recovered = (try? await store.load()) != nil
                    if !recovered { try await Task.sleep(for: .milliseconds(200)) }
                }
                #expect(recovered)
            }
        }
    }

    @Test("instances starting together on an empty database all create or find the table (no catalog race)")
    func concurrentTableCreation() async throws {
        try await Self.withCluster { pg in
            let key = KeychainKey.generate()
            let backends = try (0..<6).map { try Self.backend(pg, key: key, instance: "i\($0)") }
            try await Self.running(backends) {
                let outcomes = await withTaskGroup(of: Bool.self) { group in
                    for backend in backends {
                        group.addTask { (try? await backend.store(forPrefix: "api").load()) != nil }
                    }
                    return await group.reduce(into: [Bool]()) { $0.append($1) }
                }
                #expect(outcomes == Array(repeating: true, count: 6))
            }
        }
    }
}
