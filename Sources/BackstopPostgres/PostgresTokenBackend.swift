import BackstopCore
import BackstopKeychain
import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOSSL
import PostgresNIO

/// The fleet token store on PostgreSQL (docs/reference/token-store.md): one row per upstream `keychain_prefix` in one
/// table, the tokens sealed under the keychain key (`RecordSealer`), refreshes serialized fleet-wide by a
/// transaction-scoped advisory lock, and `LISTEN`/`NOTIFY` so every instance adopts a new token at once.
///
/// One pool (`PostgresClient`, at most `maxConnections`) serves every upstream; one of its connections listens. The
/// pool reconnects by itself when the database comes back; the listener re-listens and re-reads every row it
/// watches, so a notification missed while disconnected is caught up.
public final class PostgresTokenBackend: TokenStoreProvider, Sendable {
    /// Connections in the pool: one listens; each upstream refreshing holds one (possibly while waiting for another
    /// instance's lock); the rest serve reads after notifications.
    static let maxConnections = 8
    /// How long an operation may wait for a connection before the store counts as down: the pool itself would
    /// queue for a minute, and a request waiting for a token must not.
    static let connectionWait = Duration.seconds(5)
    /// How long a refresh waits for another instance's refresh of the same upstream (the lock holder calls the
    /// token endpoint, which may take a while; then this one re-reads and adopts).
    static let lockWait = Duration.seconds(30)

    let config: PostgresStoreConfig
    let client: PostgresClient
    let sealer: RecordSealer
    /// Identifies this process in the table's `refreshed_by` column and in notifications.
    let instanceID: String
    let logger: Logger
    let metrics: TokenStoreMetrics
    private let quiet = Logger(label: "backstop.postgres", factory: { _ in SwiftLogNoOpLogHandler() })
    private let tasks = NIOLockedValueBox<[Task<Void, Never>]>([])
    private let subscribers = NIOLockedValueBox<[String: [AsyncStream<StoredTokens>.Continuation]]>([:])
    /// Per prefix: notifications seen from other instances (the store's revision).
    private let seen = NIOLockedValueBox<[String: Int64]>([:])
    private let tableReady = NIOLockedValueBox(false)

    var table: String { config.table }
    /// The table as it is written in SQL: always quoted, so any name `check` accepts works, reserved words
    /// (`select`, `user`) included (docs/reference/token-store.md). `check` allows only `[a-z_][a-z0-9_]*`, so the name
    /// needs no escaping inside the quotes, and the quoted name is the same table as the plain one.
    var sqlTable: String { "\"\(config.table)\"" }
    /// The notification channel: the table's name (a plain identifier, checked by the config loader).
    var channel: String { config.table }

    /// Starts the pool and the listener. Never fails for an unreachable database: the store then answers
    /// `unavailable` until it is back (requests keep using tokens they hold); the first problem is logged.
    public init(
        config: PostgresStoreConfig, password: String?, sealer: RecordSealer, logger: Logger,
        metrics: TokenStoreMetrics, instanceID: String = PostgresTokenBackend.defaultInstanceID()
    ) throws(TokenStoreError) {
        self.config = config
        self.sealer = sealer
        self.logger = logger
        self.metrics = metrics
        self.instanceID = instanceID
        var configuration = PostgresClient.Configuration(
            host: config.host, port: config.port, username: config.user, password: password, database: config.database,
            tls: try Self.tls(config))
        configuration.options.maximumConnections = Self.maxConnections
        configuration.options.connectTimeout = .seconds(5)
        self.client = PostgresClient(configuration: configuration)
    }

    /// `hostname:pid`.
    public static func defaultInstanceID() -> String {
        var name = [CChar](repeating: 0, count: 256)
        gethostname(&name, name.count - 1)
        return "\(String(decoding: name.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)):\(getpid())"
    }

    static func tls(_ config: PostgresStoreConfig) throws(TokenStoreError) -> PostgresClient.Configuration.TLS {
        switch config.tls {
        case .disable:
            return .disable
        case .require:
            var tls = TLSConfiguration.makeClientConfiguration()
            tls.certificateVerification = .none
            return .require(tls)
        case .verifyFull:
            var tls = TLSConfiguration.makeClientConfiguration()
            if let caFile = config.caFile {
                guard FileManager.default.isReadableFile(atPath: caFile) else {
                    throw .unavailable("token_store.ca_file \(caFile) cannot be read")
                }
                tls.trustRoots = .file(caFile)
            }
            return .require(tls)
        }
    }

    /// Runs the pool and the listener until `shutdown`.
    public func start() {
        let run = Task { await client.run() }
        let listen = Task { await listenForChanges() }
        tasks.withLockedValue { $0 += [run, listen] }
        Task { _ = try? await ensureTable() }
    }

    public func shutdown() async {
        let running = tasks.withLockedValue { tasks in
            defer { tasks = [] }
            return tasks
        }
        for task in running { task.cancel() }
        for task in running { await task.value }
        subscribers.withLockedValue { all in
            for continuation in all.values.flatMap({ $0 }) { continuation.finish() }
            all = [:]
        }
    }

    public var location: String { "postgres \(config.displayURL) table \(config.table)" }

    public func store(forPrefix prefix: String) -> any TokenStore { PostgresTokenStore(backend: self, prefix: prefix) }

    // MARK: the table

    /// Creates the table when missing (once per process, and again after a failure). A role that may only use an
    /// existing table never needs CREATE: the table is looked up first. Instances starting together create it
    /// under an advisory lock (concurrent `CREATE TABLE IF NOT EXISTS` can fail on PostgreSQL's catalog).
    func ensureTable() async throws(TokenStoreError) {
        if tableReady.withLockedValue({ $0 }) { return }
        do {
            try await transaction { connection in
                let found = try await connection.query("SELECT to_regclass(\(self.sqlTable)) IS NOT NULL", logger: self.quiet)
                for try await exists in found.decode(Bool.self) where exists { return }
                try await connection.query(
                    "SELECT pg_advisory_xact_lock(hashtextextended(\("backstop:create:\(self.table)"), 0))",
                    logger: self.quiet)
                try await connection.query(PostgresQuery(unsafeSQL: """
                    CREATE TABLE IF NOT EXISTS \(self.sqlTable) (
                        prefix text PRIMARY KEY,
                        sealed bytea NOT NULL,
                        version bigint NOT NULL DEFAULT 1,
                        expires_at double precision,
                        updated_at timestamptz NOT NULL DEFAULT now(),
                        refreshed_by text NOT NULL DEFAULT '',
                        last_outcome text NOT NULL DEFAULT ''
                    )
                    """), logger: self.quiet)
            }
            tableReady.withLockedValue { $0 = true }
        } catch {
            let problem = Self.describe(error)
            logger.error("token store: cannot create or check the table", metadata: [
                "store": .string(location), "problem": .string(problem),
            ])
            throw .unavailable(problem)
        }
    }

    /// The row's tokens and version (nil: no row). Throws `unreadable` for a record this key cannot open.
    func readRow(_ prefix: String, on connection: PostgresConnection? = nil) async throws -> (StoredTokens, Int64)? {
        let query: PostgresQuery = "SELECT sealed, version FROM \(unescaped: sqlTable) WHERE prefix = \(prefix)"
        let rows: PostgresRowSequence
        if let connection {
            rows = try await connection.query(query, logger: quiet)
        } else {
            rows = try await client.query(query, logger: quiet)
        }
        for try await (sealed, version) in rows.decode((ByteBuffer, Int64).self) {
            return (try open(sealed, prefix: prefix), version)
        }
        return nil
    }

    /// Tokens as sealed bytes: a small JSON object, sealed with the table and prefix as context.
    func seal(_ tokens: StoredTokens, prefix: String) -> ByteBuffer {
        let record = SealedRecord(access: tokens.accessToken, refresh: tokens.refreshToken, expires: tokens.expiresAt)
        // Encoding three optional scalars cannot fail.
        let json = (try? JSONEncoder().encode(record)) ?? Data()
        return ByteBuffer(bytes: sealer.seal(Array(json), context: "\(table)/\(prefix)"))
    }

    func open(_ sealed: ByteBuffer, prefix: String) throws(TokenStoreError) -> StoredTokens {
        guard let plain = sealer.open(Array(sealed.readableBytesView), context: "\(table)/\(prefix)"),
            let record = try? JSONDecoder().decode(SealedRecord.self, from: Data(plain))
        else {
            throw .unreadable("the row for \(prefix) in \(table) cannot be opened with this keychain key (another key "
                + "file, or the row was altered); fix: share the fleet's key file, or re-seed with 'backstop tokens seed'")
        }
        return StoredTokens(accessToken: record.access, refreshToken: record.refresh, expiresAt: record.expires)
    }

    struct SealedRecord: Codable {
        var access: String?
        var refresh: String?
        var expires: Double?
    }

    /// Upserts the row (version + 1) and notifies the fleet, inside the caller's transaction.
    func write(
        _ tokens: StoredTokens, prefix: String, outcome: String, on connection: PostgresConnection
    ) async throws {
        let sealed = seal(tokens, prefix: prefix)
        let rows = try await connection.query("""
            INSERT INTO \(unescaped: sqlTable) (prefix, sealed, version, expires_at, updated_at, refreshed_by, last_outcome)
            VALUES (\(prefix), \(sealed), 1, \(tokens.expiresAt), now(), \(instanceID), \(outcome))
            ON CONFLICT (prefix) DO UPDATE SET sealed = EXCLUDED.sealed, version = \(unescaped: sqlTable).version + 1,
                expires_at = EXCLUDED.expires_at, updated_at = now(), refreshed_by = EXCLUDED.refreshed_by,
                last_outcome = EXCLUDED.last_outcome
            RETURNING version
            """, logger: quiet)
        var version: Int64 = 0
        for try await value in rows.decode(Int64.self) { version = value }
        // Delivered at commit, to every instance listening (this one skips its own).
        try await connection.query(
            "SELECT pg_notify(\(channel), \("\(prefix)|\(version)|\(instanceID)"))", logger: quiet)
    }

    /// The advisory lock of one upstream, held until the transaction ends (a crashed holder's lock is released with
    /// its connection). Keyed by table and prefix, hashed to 64 bits by the server.
    func lock(_ prefix: String, on connection: PostgresConnection) async throws -> Duration {
        let started = ContinuousClock.now
        try await connection.query(PostgresQuery(unsafeSQL: "SET LOCAL lock_timeout = '\(Self.lockWait.components.seconds)s'"),
                                   logger: quiet)
        try await connection.query("SELECT pg_advisory_xact_lock(hashtextextended(\("backstop:\(table):\(prefix)"), 0))",
                                   logger: quiet)
        return ContinuousClock.now - started
    }

    /// Runs `body` in a transaction, failing fast (`unavailable`) when no connection is had within `connectionWait`.
    func transaction<T: Sendable>(_ body: @escaping @Sendable (PostgresConnection) async throws -> T) async throws -> T {
        try await withConnectionWait {
            try await self.client.withTransaction(logger: self.quiet) { connection in
                try await body(connection)
            }
        }
    }

    /// Runs `body`; if it has not got a connection (signalled by `body` starting its first statement) within
    /// `connectionWait`, cancels it and throws `unavailable`. Waiting for a lock does not count.
    func withConnectionWait<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) async throws -> T {
        try await withThrowingTaskGroup(of: T?.self) { group in
            group.addTask { try await body() }
            group.addTask {
                try await Task.sleep(for: Self.connectionWait)
                return nil
            }
            while let next = try await group.next() {
                if let value = next {
                    group.cancelAll()
                    return value
                }
                // The wait elapsed: fine if the pool has a connection working for us, else the database is down.
                if !(await hasOpenConnection()) {
                    group.cancelAll()
                    throw TokenStoreError.unavailable("no connection to \(config.displayURL) within \(Self.connectionWait)")
                }
            }
            throw TokenStoreError.unavailable("cancelled")
        }
    }

    /// Whether the database answers now (a trivial query with a short deadline).
    private func hasOpenConnection() async -> Bool {
        await withTaskGroup(of: Bool.self) { group in
            group.addTask {
                (try? await self.client.query("SELECT 1", logger: self.quiet)) != nil
            }
            group.addTask {
                try? await Task.sleep(for: .seconds(1))
                return false
            }
            let first = await group.next() ?? false
            group.cancelAll()
            return first
        }
    }

    /// `backstop check --online`: problems found connecting to the database and with the table (missing rights),
    /// or none.
    public func check() async -> [String] {
        do {
            return try await withConnectionWait { () async throws -> [String] in
                var problems: [String] = []
                let exists = try await self.client.query(
                    "SELECT to_regclass(\(self.sqlTable)) IS NOT NULL", logger: self.quiet)
                var present = false
                for try await value in exists.decode(Bool.self) { present = value }
                if present {
                    for privilege in ["SELECT", "INSERT", "UPDATE"] {
                        let rows = try await self.client.query(
                            "SELECT has_table_privilege(\(self.sqlTable), \(privilege))", logger: self.quiet)
                        for try await granted in rows.decode(Bool.self) where !granted {
                            problems.append("role \(self.config.user) lacks \(privilege) on table \(self.table)")
                        }
                    }
                } else {
                    let rows = try await self.client.query(
                        "SELECT has_schema_privilege(current_schema(), 'CREATE')", logger: self.quiet)
                    for try await granted in rows.decode(Bool.self) where !granted {
                        problems.append("table \(self.table) does not exist and role \(self.config.user) may not create it "
                            + "(create it as the schema owner, see docs/reference/token-store.md)")
                    }
                }
                return problems
            }
        } catch {
            return ["cannot use \(config.displayURL): \(Self.describe(error))"]
        }
    }

    // MARK: changes

    func subscribe(_ prefix: String) -> AsyncStream<StoredTokens> {
        let (stream, continuation) = AsyncStream.makeStream(of: StoredTokens.self, bufferingPolicy: .bufferingNewest(1))
        subscribers.withLockedValue { $0[prefix, default: []].append(continuation) }
        return stream
    }

    func revision(_ prefix: String) -> TokenStoreRevision {
        TokenStoreRevision([seen.withLockedValue { $0[prefix] ?? 0 }])
    }

    /// Listens on the table's channel for as long as the store runs, re-listening after a lost connection with
    /// backoff; after each (re)connection, re-reads every watched row.
    private func listenForChanges() async {
        var failures = 0
        while !Task.isCancelled {
            do {
                try await client.withConnection { connection in
                    try await connection.listen(on: self.channel) { notifications in
                        failures = 0
                        await self.resync()
                        for try await notification in notifications {
                            await self.notified(notification.payload)
                        }
                    }
                }
            } catch {
                if Task.isCancelled { return }
                failures += 1
                if failures == 1 {
                    logger.warning("token store: listening for changes failed; retrying", metadata: [
                        "store": .string(location), "problem": .string(Self.describe(error)),
                    ])
                }
            }
            let factor: Int = 1 << min(failures, 5)
            let delay: Duration = min(Duration.milliseconds(250) * factor, Duration.seconds(5))
            try? await Task.sleep(for: delay)
        }
    }

    /// `prefix|version|instance`: another instance stored tokens for `prefix`.
    private func notified(_ payload: String) async {
        metrics.record(store: "postgres", operation: "notify", ok: true, seconds: .zero)
        // Split from the right: the version and the instance id never hold a `|`, a keychain prefix may.
        var parts = payload.split(separator: "|", omittingEmptySubsequences: false).map(String.init)
        guard parts.count >= 3, let instance = parts.popLast(), instance != instanceID, parts.popLast() != nil else { return }
        let prefix = parts.joined(separator: "|")
        guard subscribers.withLockedValue({ $0[prefix] != nil }) else { return }
        seen.withLockedValue { $0[prefix, default: 0] += 1 }
        await publish(prefix)
    }

    private func resync() async {
        let prefixes = subscribers.withLockedValue { Array($0.keys) }
        for prefix in prefixes { await publish(prefix) }
    }

    private func publish(_ prefix: String) async {
        do {
            guard let (tokens, _) = try await readRow(prefix) else { return }
            let continuations = subscribers.withLockedValue { $0[prefix] ?? [] }
            for continuation in continuations { continuation.yield(tokens) }
        } catch {
            logger.error("token store: cannot read a changed row", metadata: [
                "store": .string(location), "prefix": .string(prefix), "problem": .string(Self.describe(error)),
            ])
        }
    }

    /// An error as an operator can act on it: the SQL state and message, the connection problem, or the store's own
    /// description. Never the configuration (which holds the password) and never a bind value.
    static func describe(_ error: any Error) -> String {
        if let store = error as? TokenStoreError { return store.description }
        if let transaction = error as? PostgresTransactionError {
            if let inner = transaction.closureError ?? transaction.beginError ?? transaction.commitError
                ?? transaction.rollbackError
            {
                return describe(inner)
            }
        }
        if let psql = error as? PSQLError {
            if let state = psql.serverInfo?[.sqlState] {
                return "\(state): \(psql.serverInfo?[.message] ?? "server error")"
            }
            if let underlying = psql.underlying { return "\(psql.code): \(String(describing: type(of: underlying))) \(underlying)" }
            return "\(psql.code)"
        }
        return String(describing: type(of: error))
    }
}
