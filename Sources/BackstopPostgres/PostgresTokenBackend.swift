import BackstopCore
import BackstopKeychain
import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOSSL
import PostgresNIO

/// The fleet token store on PostgreSQL (docs/reference/token-store.md): one row per upstream `keychain_prefix` in one
/// table, the tokens sealed under the keychain key (`RecordSealer`) together with the row's version, refreshes
/// serialized fleet-wide by a transaction-scoped advisory lock, and `LISTEN`/`NOTIFY` so every instance adopts a new
/// token at once.
///
/// Nothing a role without the keychain key can do is trusted: a notification only makes the instance re-read the row,
/// and only a row with a newer sealed version counts as a change; a row older than one the instance has seen (its
/// high-water mark, `RowVersionMarks`) is never used (`RowVersions`, docs/reference/token-store.md#row-versions).
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
    /// The newest sealed version of each row this instance has seen, kept in its keychain.
    let marks: RowVersionMarks
    /// Wall-clock readings for the version a seed writes.
    let clock: any BackstopClock
    /// One direct connection, made only to say why the pool has none (`unreachableReason`).
    private let probeConfiguration: PostgresConnection.Configuration
    private let quiet = Logger(label: "backstop.postgres", factory: { _ in SwiftLogNoOpLogHandler() })
    /// Per prefix: the token managers adopting changes, by upstream name.
    private let subscribers = NIOLockedValueBox<[String: [Subscriber]]>([:])
    /// Per prefix: the newest row version this process has read or written (the store's revision). Only a row
    /// newer than this is a change worth telling the token manager about.
    private let latest = NIOLockedValueBox<[String: Int64]>([:])
    /// Per prefix: the rolled-back version last warned about from a notification, so a flood of them logs once.
    private let warnedRollback = NIOLockedValueBox<[String: Int64]>([:])
    private let tableReady = NIOLockedValueBox(false)

    var table: String { config.table }
    /// The table as it is written in SQL: always quoted, so any name `check` accepts works, reserved words
    /// (`select`, `user`) included (docs/reference/token-store.md). `check` allows only `[a-z_][a-z0-9_]*`, so the name
    /// needs no escaping inside the quotes, and the quoted name is the same table as the plain one.
    var sqlTable: String { "\"\(config.table)\"" }
    /// The notification channel: the table's name (a plain identifier, checked by the config loader).
    var channel: String { config.table }

    /// Sets up the pool and the listener, which `run()` runs. Never fails for an unreachable database: the store then
    /// answers `unavailable` until it is back (requests keep using tokens they hold); the first problem is logged.
    /// `versions` is the keychain that keeps this instance's high-water marks (nil: in memory only, for tests).
    public init(
        config: PostgresStoreConfig, password: String?, sealer: RecordSealer, logger: Logger,
        metrics: TokenStoreMetrics, versions: FileKeychain? = nil, clock: any BackstopClock = SystemClock(),
        instanceID: String = PostgresTokenBackend.defaultInstanceID()
    ) throws(TokenStoreError) {
        self.config = config
        self.sealer = sealer
        self.logger = logger
        self.metrics = metrics
        self.clock = clock
        self.instanceID = instanceID
        self.marks = RowVersionMarks(keychain: versions, logger: logger)
        let tls = try Self.tlsConfiguration(config)
        var configuration = PostgresClient.Configuration(
            host: config.host, port: config.port, username: config.user, password: password, database: config.database,
            tls: tls.map { .require($0) } ?? .disable)
        configuration.options.maximumConnections = Self.maxConnections
        configuration.options.connectTimeout = .seconds(5)
        self.client = PostgresClient(configuration: configuration)
        let probeTLS: PostgresConnection.Configuration.TLS
        do {
            probeTLS = try tls.map { .require(try NIOSSLContext(configuration: $0)) } ?? .disable
        } catch {
            throw .unavailable("token_store TLS cannot be set up: \(error)")
        }
        var probe = PostgresConnection.Configuration(
            host: config.host, port: config.port, username: config.user, password: password, database: config.database,
            tls: probeTLS)
        probe.options.connectTimeout = .seconds(2)
        self.probeConfiguration = probe
    }

    /// `hostname:pid`.
    public static func defaultInstanceID() -> String {
        var name = [CChar](repeating: 0, count: 256)
        gethostname(&name, name.count - 1)
        return "\(String(decoding: name.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)):\(getpid())"
    }

    /// The TLS settings of `token_store.tls`; nil: no TLS.
    static func tlsConfiguration(_ config: PostgresStoreConfig) throws(TokenStoreError) -> TLSConfiguration? {
        switch config.tls {
        case .disable:
            return nil
        case .require:
            var tls = TLSConfiguration.makeClientConfiguration()
            tls.certificateVerification = .none
            return tls
        case .verifyFull:
            var tls = TLSConfiguration.makeClientConfiguration()
            if let caFile = config.caFile {
                guard FileManager.default.isReadableFile(atPath: caFile) else {
                    throw .unavailable("token_store.ca_file \(caFile) cannot be read")
                }
                // A FIFO or a device would hold the store's connection (and `run`) for as long as nothing writes.
                var info = stat()
                guard stat(caFile, &info) == 0, info.st_mode & S_IFMT == S_IFREG else {
                    throw .unavailable("token_store.ca_file \(caFile) is not a regular file")
                }
                tls.trustRoots = .file(caFile)
            }
            return tls
        }
    }

    /// Runs the pool (PostgreSQL's `PostgresClient` service) and the listener (which checks the table first) until
    /// the task is cancelled, then ends every subscription.
    public func run() async {
        await withDiscardingTaskGroup { group in
            group.addTask { await self.client.run() }
            group.addTask {
                _ = try? await self.ensureTable()
                await self.listenForChanges()
            }
        }
        subscribers.withLockedValue { all in
            for subscriber in all.values.flatMap({ $0 }) { subscriber.continuation.finish() }
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
                let found = try await connection.queryIfOpen(
                    "SELECT to_regclass(\(self.sqlTable)) IS NOT NULL", logger: self.quiet)
                for try await exists in found.decode(Bool.self) where exists { return }
                try await connection.queryIfOpen(
                    "SELECT pg_advisory_xact_lock(hashtextextended(\("backstop:create:\(self.table)"), 0))",
                    logger: self.quiet)
                try await connection.queryIfOpen(
                    PostgresQuery(
                        unsafeSQL: """
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
            let failure = Self.storeError(error)
            logger.error(
                "token store: cannot create or check the table",
                metadata: [
                    "store": .string(location), "problem": .string(failure.description),
                ])
            throw failure
        }
    }

    /// A row as this instance reads it: the tokens and the version sealed with them.
    struct Row: Sendable {
        var tokens: StoredTokens
        /// 0 for a row sealed before versions were (it is older than any row written since).
        var version: Int64
    }

    /// The row (nil: no row). Throws `unreadable` for a record this key cannot open. Says nothing about whether the
    /// row may be used: that is `accept`'s.
    func readRow(_ prefix: String, on connection: PostgresConnection? = nil) async throws -> Row? {
        let query: PostgresQuery = "SELECT sealed FROM \(unescaped: sqlTable) WHERE prefix = \(prefix)"
        let rows: PostgresRowSequence
        if let connection {
            rows = try await connection.queryIfOpen(query, logger: quiet)
        } else {
            rows = try await client.query(query, logger: quiet)
        }
        for try await sealed in rows.decode(ByteBuffer.self) {
            return try open(sealed, prefix: prefix)
        }
        return nil
    }

    /// Tokens and their version as sealed bytes: a small JSON object, sealed with the table and prefix as context. The
    /// version is inside the seal: the `version` column is a copy for people, which any writer could change.
    func seal(_ tokens: StoredTokens, version: Int64, prefix: String) -> ByteBuffer {
        let record = SealedRecord(
            access: tokens.accessToken, refresh: tokens.refreshToken, expires: tokens.expiresAt, version: version)
        // Encoding four optional scalars cannot fail.
        let json = (try? JSONEncoder().encode(record)) ?? Data()
        return ByteBuffer(bytes: sealer.seal(Array(json), context: "\(table)/\(prefix)"))
    }

    func open(_ sealed: ByteBuffer, prefix: String) throws(TokenStoreError) -> Row {
        guard let plain = sealer.open(Array(sealed.readableBytesView), context: "\(table)/\(prefix)"),
            let record = try? JSONDecoder().decode(SealedRecord.self, from: Data(plain))
        else {
            throw .unreadable(
                "the row for \(prefix) in \(table) cannot be opened with this keychain key (another key "
                    + "file, or the row was altered); fix: share the fleet's key file, or re-seed with 'backstop tokens seed'"
            )
        }
        return Row(
            tokens: StoredTokens(accessToken: record.access, refreshToken: record.refresh, expiresAt: record.expires),
            version: max(record.version ?? 0, 0))
    }

    struct SealedRecord: Codable {
        var access: String?
        var refresh: String?
        var expires: Double?
        /// Absent in rows sealed before versions were.
        var version: Int64?
    }

    /// The tokens of `row` if this instance may use them: a row older than the newest one it has seen is refused
    /// (`rolledBack`); a newer one raises the high-water mark first (written to the keychain). A notification's
    /// refusal is logged here, once per version; a refresh's by the token manager, which names the upstream.
    func accept(
        _ row: Row, prefix: String, fromNotification: Bool = false
    ) async throws(TokenStoreError) -> StoredTokens {
        switch RowVersions.judge(stored: row.version, highWater: marks.mark(prefix)) {
        case .current:
            break
        case .newer:
            await marks.raise(prefix, to: row.version)
        case .rolledBack(let seen):
            if fromNotification,
                warnedRollback.withLockedValue({ $0.updateValue(row.version, forKey: prefix) }) != row.version
            {
                // Once per upstream adopting this prefix's tokens, named as a refresh's refusal names it.
                let upstreams = Set(subscribers.withLockedValue { ($0[prefix] ?? []).map(\.upstream) }).sorted()
                for upstream in upstreams {
                    logger.warning(
                        "token store row is older than one already seen; not used",
                        metadata: [
                            "upstream": .string(upstream), "store": .string(location), "prefix": .string(prefix),
                            "stored_version": .stringConvertible(row.version),
                            "seen_version": .stringConvertible(seen),
                            "fix": .string("store a new refresh token: backstop tokens seed \(upstream)"),
                        ])
                }
            }
            throw .rolledBack(stored: row.version, seen: seen)
        }
        return row.tokens
    }

    /// Notes that this process read or wrote version `version` of the row; returns whether it is newer than any it
    /// had (a change to report).
    @discardableResult
    func observe(_ prefix: String, version: Int64) -> Bool {
        latest.withLockedValue { latest in
            if let known = latest[prefix], known >= version { return false }
            latest[prefix] = version
            return true
        }
    }

    /// Version `version` of the row was committed by this process: it is both seen and the newest.
    func wrote(_ prefix: String, version: Int64) async {
        observe(prefix, version: version)
        await marks.raise(prefix, to: version)
    }

    /// Notes a failed refresh in the row's `last_outcome`, after the last write's outcome:
    /// `refreshed|failed SECONDS HOST:PID CAUSE` (docs/reference/token-store.md#the-table). The tokens, their
    /// version and `updated_at` stay; the next write replaces the whole value. Inside the refresh's transaction; a
    /// note that cannot be written is logged, not thrown (it would roll back nothing worth keeping, and the refresh's
    /// own outcome is what the waiting requests need).
    func record(_ failure: RefreshFailure, prefix: String, on connection: PostgresConnection) async {
        let note = "failed \(Int64(failure.at.rounded(.down))) \(instanceID) \(failure.cause)"
        do {
            try await connection.queryIfOpen(
                """
                UPDATE \(unescaped: sqlTable) SET last_outcome = split_part(last_outcome, '|', 1) || '|' || \(note)
                WHERE prefix = \(prefix)
                """, logger: quiet)
        } catch {
            logger.warning(
                "token store: cannot note the failed refresh",
                metadata: ["store": .string(location), "problem": .string(Self.describe(error))])
        }
    }

    /// `last_outcome` split into the last write's outcome (`refreshed`, `seeded`) and the failed refresh noted after
    /// it, if any.
    static func outcomes(_ value: String) -> (written: String, failure: RefreshFailure?) {
        guard let bar = value.firstIndex(of: "|") else { return (value, nil) }
        let written = String(value[..<bar])
        // `failed SECONDS HOST:PID CAUSE`
        let parts = value[value.index(after: bar)...].split(separator: " ", maxSplits: 3)
        guard parts.count == 4, parts[0] == "failed", let seconds = Int64(parts[1]) else { return (written, nil) }
        return (written, RefreshFailure(at: Double(seconds), cause: String(parts[3]), by: String(parts[2])))
    }

    /// Upserts the row as version `version` and notifies the fleet, inside the caller's transaction (which holds the
    /// upstream's lock: the caller chose `version` from the row it read under it).
    func write(
        _ tokens: StoredTokens, version: Int64, prefix: String, outcome: String, on connection: PostgresConnection
    ) async throws {
        let sealed = seal(tokens, version: version, prefix: prefix)
        try await connection.queryIfOpen(
            """
            INSERT INTO \(unescaped: sqlTable) (prefix, sealed, version, expires_at, updated_at, refreshed_by, last_outcome)
            VALUES (\(prefix), \(sealed), \(version), \(tokens.expiresAt), now(), \(instanceID), \(outcome))
            ON CONFLICT (prefix) DO UPDATE SET sealed = EXCLUDED.sealed, version = EXCLUDED.version,
                expires_at = EXCLUDED.expires_at, updated_at = now(), refreshed_by = EXCLUDED.refreshed_by,
                last_outcome = EXCLUDED.last_outcome
            """, logger: quiet)
        // Delivered at commit, to every instance listening (this one skips its own). A hint only: receivers re-read.
        try await connection.queryIfOpen(
            "SELECT pg_notify(\(channel), \("\(prefix)|\(version)|\(instanceID)"))", logger: quiet)
    }

    /// The advisory lock of one upstream, held until the transaction ends (a crashed holder's lock is released with
    /// its connection). Keyed by table and prefix, hashed to 64 bits by the server.
    func lock(_ prefix: String, on connection: PostgresConnection) async throws -> Duration {
        let started = ContinuousClock.now
        try await connection.queryIfOpen(
            PostgresQuery(unsafeSQL: "SET LOCAL lock_timeout = '\(Self.lockWait.secondsAndAttoseconds.seconds)s'"),
            logger: quiet)
        try await connection.queryIfOpen(
            "SELECT pg_advisory_xact_lock(hashtextextended(\("backstop:\(table):\(prefix)"), 0))",
            logger: quiet, waitsUpTo: Self.lockWait)
        return ContinuousClock.now - started
    }

    /// Runs `body` in a transaction, failing fast (`unavailable`) when no connection is had within `connectionWait`.
    /// Not `PostgresClient.withTransaction`: its `ROLLBACK` after a failure goes to the connection even when the
    /// failure was that connection closing, and then never ends (see `queryIfOpen`).
    func transaction<T: Sendable>(_ body: @escaping @Sendable (PostgresConnection) async throws -> T) async throws -> T
    {
        try await withConnectionWait { connected in
            try await self.client.withConnection { connection in
                connected.set()
                try await connection.queryIfOpen("BEGIN;", logger: self.quiet)
                let value: T
                do {
                    value = try await body(connection)
                } catch {
                    _ = try? await connection.queryIfOpen("ROLLBACK;", logger: self.quiet)
                    throw error
                }
                try await connection.queryIfOpen("COMMIT;", logger: self.quiet)
                return value
            }
        }
    }

    /// Runs `body`; if it has not got a connection (`body` sets `connected` once it has) within `connectionWait`
    /// and the database does not answer a new connection either, cancels it and throws `unavailable`. Once `body`
    /// has its connection it is never cancelled from here: it may be holding tokens the endpoint just issued, which
    /// must reach the store or the caller (docs/reference/token-store.md#how-a-refresh-runs); its statements are
    /// bounded by `statementDeadline` instead. A pool that is only busy (the server takes a new connection) is
    /// waited for.
    func withConnectionWait<T: Sendable>(
        _ body: @escaping @Sendable (_ connected: OnceFlag) async throws -> T
    ) async throws -> T {
        let connected = OnceFlag()
        // The connection wait's timer: nil when it runs out (set again while the pool is only busy).
        let timer: @Sendable () async throws -> T? = {
            try await Task.sleep(for: Self.connectionWait)
            return nil
        }
        return try await withThrowingTaskGroup(of: T?.self) { group in
            group.addTask {
                do {
                    return try await body(connected)
                } catch  where Self.isUnexplained(error) {
                    // The pool gave up connecting (its circuit breaker opens after a minute of failures) and says
                    // nothing more: ask the server.
                    throw TokenStoreError.unavailable(await self.unreachableReason(after: "no connection"))
                }
            }
            group.addTask(operation: timer)
            while let next = try await group.next() {
                if let value = next {
                    group.cancelAll()
                    return value
                }
                // The wait elapsed: fine if `body` has its connection, or the server answers a new one (the pool is
                // busy); else the database is down.
                if connected.isSet { continue }
                if let problem = await directProbe() {
                    group.cancelAll()
                    throw TokenStoreError.unavailable("no connection within \(Self.connectionWait): \(problem)")
                }
                group.addTask(operation: timer)
            }
            throw TokenStoreError.unavailable("cancelled")
        }
    }

    /// An error of the pool's own that names no cause (the types the store explains are PostgreSQL's and its own).
    static func isUnexplained(_ error: any Error) -> Bool {
        !(error is PSQLError || error is TokenStoreError || error is CancellationError
            || error is PostgresDecodingError)
    }

    /// Why the pool has no connection, for the error: the pool retries failed connections by itself and keeps their
    /// errors, so one direct attempt tells a server that answered with an error (a wrong password is `28P01`, an
    /// unknown database `3D000`) from one that did not answer at all.
    private func unreachableReason(after waited: String) async -> String {
        guard let problem = await directProbe() else {
            return "\(waited) (the server accepts new connections: every pooled one is busy)"
        }
        return "\(waited): \(problem)"
    }

    /// One direct connection, made and closed (2 s to connect, 3 s in all): nil when the server took it, else why
    /// not.
    private func directProbe() async -> String? {
        let configuration = probeConfiguration
        let quiet = self.quiet
        return await withTaskGroup(of: String??.self) { group in
            group.addTask {
                do {
                    let connection = try await PostgresConnection.connect(
                        configuration: configuration, id: 0, logger: quiet)
                    try? await connection.close()
                    return .some(nil)
                } catch {
                    return .some(Self.describe(error))
                }
            }
            group.addTask {
                try? await Task.sleep(for: .seconds(3))
                return .none
            }
            let first = await group.next() ?? .none
            group.cancelAll()
            return first ?? "no answer to a new connection either"
        }
    }

    /// `backstop check --online`: problems found connecting to the database and with the table (missing rights),
    /// or none.
    public func check() async -> [String] {
        do {
            return try await withConnectionWait { _ async throws -> [String] in
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
                        problems.append(
                            "table \(self.table) does not exist and role \(self.config.user) may not create it "
                                + "(create it as the schema owner, see docs/reference/token-store.md)")
                    }
                }
                return problems
            }
        } catch {
            let reason: String =
                switch Self.storeError(error) {
                case .unavailable(let why): why
                case let other: other.description
                }
            return ["cannot use \(config.displayURL): \(reason)"]
        }
    }

    // MARK: changes

    struct Subscriber {
        let upstream: String
        let continuation: AsyncStream<StoredTokens>.Continuation
    }

    func subscribe(_ prefix: String, upstream: String) -> AsyncStream<StoredTokens> {
        let (stream, continuation) = AsyncStream.makeStream(of: StoredTokens.self, bufferingPolicy: .bufferingNewest(1))
        subscribers.withLockedValue {
            $0[prefix, default: []].append(Subscriber(upstream: upstream, continuation: continuation))
        }
        return stream
    }

    /// The newest row version this process has seen: it changes only when a newer sealed row is read or written,
    /// never because of a notification alone (any role may send one).
    func revision(_ prefix: String) -> TokenStoreRevision {
        TokenStoreRevision([latest.withLockedValue { $0[prefix] ?? -1 }])
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
                    logger.warning(
                        "token store: listening for changes failed; retrying",
                        metadata: [
                            "store": .string(location), "problem": .string(Self.describe(error)),
                        ])
                }
            }
            let factor: Int = 1 << min(failures, 5)
            let delay: Duration = min(Duration.milliseconds(250) * factor, Duration.seconds(5))
            try? await Task.sleep(for: delay)
        }
    }

    /// `prefix|version|instance`: another instance says it stored tokens for `prefix`. Any role may send that, so
    /// it is only a hint to re-read the row; the version and instance in it are never believed (the instance only
    /// skips this process's own writes, which it knows already).
    private func notified(_ payload: String) async {
        metrics.record(store: "postgres", operation: "notify", ok: true, seconds: .zero)
        // Split from the right: the version and the instance id never hold a `|`, a keychain prefix may.
        var parts = payload.split(separator: "|", omittingEmptySubsequences: false).map(String.init)
        guard parts.count >= 3, let instance = parts.popLast(), instance != instanceID, parts.popLast() != nil else {
            return
        }
        let prefix = parts.joined(separator: "|")
        guard subscribers.withLockedValue({ $0[prefix] != nil }) else { return }
        await publish(prefix)
    }

    private func resync() async {
        let prefixes = subscribers.withLockedValue { Array($0.keys) }
        for prefix in prefixes { await publish(prefix) }
    }

    /// Re-reads the row and tells the subscribers when it is newer than any this process has seen (and not older
    /// than its high-water mark); anything else is no change.
    private func publish(_ prefix: String) async {
        do {
            guard let row = try await readRow(prefix) else { return }
            let tokens: StoredTokens
            do throws(TokenStoreError) {
                tokens = try await accept(row, prefix: prefix, fromNotification: true)
            } catch {
                return
            }
            guard observe(prefix, version: row.version) else { return }
            let subscribed = subscribers.withLockedValue { $0[prefix] ?? [] }
            for subscriber in subscribed { subscriber.continuation.yield(tokens) }
        } catch {
            logger.error(
                "token store: cannot read a changed row",
                metadata: [
                    "store": .string(location), "prefix": .string(prefix), "problem": .string(Self.describe(error)),
                ])
        }
    }

    /// `error` as a store error: one the store raised as it is (wrapping it in another would print both prefixes:
    /// `token store unavailable: token store unavailable: …`), anything else as `unavailable`.
    static func storeError(_ error: any Error) -> TokenStoreError {
        error as? TokenStoreError ?? .unavailable(describe(error))
    }

    /// `error` as a failed write: one the store raised as it is (the database was unavailable, the row unreadable),
    /// anything else as `writeFailed`.
    static func writeError(_ error: any Error) -> TokenStoreError {
        error as? TokenStoreError ?? .writeFailed(describe(error))
    }

    /// An error as an operator can act on it: the SQL state and message, the connection problem, or the store's own
    /// description. Never the configuration (which holds the password) and never a bind value.
    static func describe(_ error: any Error) -> String {
        if let store = error as? TokenStoreError { return store.description }
        if let psql = error as? PSQLError {
            if let state = psql.serverInfo?[.sqlState] {
                return "\(state): \(psql.serverInfo?[.message] ?? "server error")"
            }
            if let underlying = psql.underlying {
                return "\(psql.code): \(String(describing: type(of: underlying))) \(underlying)"
            }
            return "\(psql.code)"
        }
        if let decoding = error as? PostgresDecodingError {
            // A column altered under the store (a type changed, a NULL where none may be): never the value itself.
            return "a row the store cannot read: column \(decoding.columnName) is \(decoding.postgresType) "
                + "(\(decoding.code))"
        }
        return String(describing: type(of: error))
    }
}
