/// One upstream's tokens as a token store keeps them. Descriptions never show the secrets.
public struct StoredTokens: Sendable, Equatable, CustomStringConvertible {
    public var accessToken: String?
    public var refreshToken: String?
    /// Wall-clock seconds since the Unix epoch; nil when the token endpoint gave no `expires_in`.
    public var expiresAt: Double?

    public init(accessToken: String? = nil, refreshToken: String? = nil, expiresAt: Double? = nil) {
        self.accessToken = accessToken
        self.refreshToken = refreshToken
        self.expiresAt = expiresAt
    }

    /// The latest time a stored expiry or failure may name (about the year 5138): anything later, negative, infinite
    /// or not a number is no time at all. A keychain entry is text anyone with the key may write (`keychain set`),
    /// and later times overflow the conversions to whole seconds and durations (a trap, a crash loop).
    public static let latestStoredTime = 1e11

    /// Unix seconds as a keychain entry holds them, nil when they are not a time this process can use.
    public static func storedTime(_ text: String) -> Double? {
        guard let seconds = Double(text), seconds.isFinite, seconds >= 0, seconds <= latestStoredTime else {
            return nil
        }
        return seconds
    }

    public var description: String {
        "StoredTokens(access: \(accessToken == nil ? "none" : "set"), refresh: \(refreshToken == nil ? "none" : "set"), "
            + "expires: \(expiresAt.map { String($0) } ?? "none"))"
    }
}

/// What a refresh decided while holding the store's lock, and the tokens to store before the lock is released.
public struct LockedDecision<Result: Sendable>: Sendable {
    public var result: Result
    /// Written before the lock is released (and before any request uses them); nil leaves the store as it was.
    public var store: StoredTokens?
    /// A refresh that failed, recorded under the same lock as the store's last refresh outcome (what
    /// `backstop tokens list` shows); the tokens stay as they were. A later write of tokens supersedes it.
    public var failure: RefreshFailure?

    public init(result: Result, store: StoredTokens? = nil, failure: RefreshFailure? = nil) {
        self.result = result
        self.store = store
        self.failure = failure
    }
}

/// A failed refresh as a token store keeps it: when, and its cause — a short label (`invalid_grant`, `status-503`,
/// `connect-failure`), never a token or an endpoint's free text.
public struct RefreshFailure: Sendable, Equatable {
    /// Wall-clock seconds since the epoch.
    public var at: Double
    public var cause: String
    /// Which instance failed (`HOST:PID`), for a shared store; nil when the store does not say.
    public var by: String?

    /// `cause` and `by` are cut to 64 characters of `[A-Za-z0-9._:-]` (others become `_`): the cause may come from
    /// the token endpoint (its OAuth error code), `by` from a database row, and `tokens list` prints both in a
    /// tab-separated line.
    public init(at: Double, cause: String, by: String? = nil) {
        self.at = at
        self.cause = Self.label(cause)
        self.by = by.map(Self.label)
    }

    /// At most 64 characters of `[A-Za-z0-9._:-]`, anything else `_`: safe in a tab-separated line and a log.
    static func label(_ text: String) -> String {
        String(
            String.UnicodeScalarView(
                text.unicodeScalars.prefix(64).map { scalar in
                    scalar.isASCII
                        && (scalar.properties.isAlphabetic || ("0"..."9").contains(scalar)
                            || "._:-".unicodeScalars.contains(scalar))
                        ? scalar : "_"
                }))
    }

    /// `SECONDS CAUSE`: how the stores keep it (seconds whole, since the epoch); nil for anything else.
    public init?(stored text: String, by: String? = nil) {
        let parts = text.split(separator: " ", maxSplits: 1)
        guard parts.count == 2, let seconds = StoredTokens.storedTime(String(parts[0])) else { return nil }
        self.init(at: seconds.rounded(.down), cause: String(parts[1]), by: by)
    }

    public var stored: String { "\(Int64(at.rounded(.down))) \(cause)" }
}

/// A store's state, cheap to read and to compare: it changes whenever the store may hold other tokens than it did
/// (a refresh by another process, `backstop tokens seed`). Opaque to the token manager.
public struct TokenStoreRevision: Sendable, Equatable {
    public let value: [Int64]
    public init(_ value: [Int64]) { self.value = value }
}

/// Why a token store could not do what was asked. Messages name the store and never hold a secret.
public enum TokenStoreError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The store cannot be reached or locked now (database down, lock timeout, keychain unreadable).
    case unavailable(String)
    /// What the store holds cannot be read (wrong key, altered record).
    case unreadable(String)
    /// The tokens could not be written.
    case writeFailed(String)
    /// The stored record is older than one this instance has already seen (a restored backup, a rolled-back row):
    /// its refresh token may have been spent, so it is not used (docs/reference/token-store.md#row-versions).
    case rolledBack(stored: Int64, seen: Int64)

    public var description: String {
        switch self {
        case .unavailable(let why): "token store unavailable: \(why)"
        case .unreadable(let why): "token store record unreadable: \(why)"
        case .writeFailed(let why): "token store write failed: \(why)"
        case .rolledBack(let stored, let seen):
            "token store record rolled back: version \(stored) is older than version \(seen) seen before (a restored "
                + "or altered row would replay a spent refresh token); it is not used: store a new refresh token with "
                + "'backstop tokens seed'"
        }
    }
}

/// Where one upstream's tokens live (docs/reference/token-store.md), as the token manager needs it: read them, run a
/// refresh under the store's single-flight lock ("lock, re-read, maybe refresh, write"), write again after a failed
/// write, and learn of tokens stored by someone else. The keychain file is one implementation (the lock spans the
/// processes sharing the file), PostgreSQL another (the lock spans the fleet).
///
/// The request path never calls a store while a token is valid: only refreshes, adoptions and failures do.
public protocol TokenStore: Sendable {
    /// Where the tokens are, for logs and `backstop tokens list` (never a secret).
    var location: String { get }

    /// The tokens as stored now, without the lock.
    func load() async throws(TokenStoreError) -> StoredTokens

    /// Runs `decide` holding this upstream's refresh lock, with the tokens as stored at that moment; stores the
    /// decision's tokens before releasing the lock. Throws when the lock or the read failed (`decide` did not run);
    /// a write that failed after `decide` ran is returned as `writeFailure`, with the decision, so the caller can
    /// keep tokens the endpoint already issued.
    func withRefreshLock<Result: Sendable>(
        _ decide: @Sendable (StoredTokens) async -> LockedDecision<Result>
    ) async throws(TokenStoreError) -> (result: Result, writeFailure: TokenStoreError?)

    /// Writes `tokens` unless the stored refresh token is no longer `expectedRefreshToken` (someone stored newer
    /// tokens meanwhile); returns whether it wrote. For retrying a failed write.
    func storeIfUnchanged(_ tokens: StoredTokens, expectedRefreshToken: String?) async throws(TokenStoreError) -> Bool

    /// The store's revision now (cheap; no network): a change means another process may have stored tokens.
    var revision: TokenStoreRevision? { get }

    /// Tokens stored by another instance, as they are stored, for as long as the store runs; nil when the store
    /// cannot tell (the keychain file: other processes are seen at the next refresh). `upstream` names the
    /// subscriber in what the store logs about the changes it cannot hand on (a rolled-back row).
    func changes(for upstream: String) -> AsyncStream<StoredTokens>?

    /// What `backstop tokens list` shows: expiry and the last write, never a token.
    func status() async throws(TokenStoreError) -> TokenStoreStatus

    /// Stores a refresh token an operator obtained (`backstop tokens seed`), dropping the access token (it may
    /// belong to a revoked grant), under the refresh lock.
    func seed(refreshToken: String) async throws(TokenStoreError)
}

/// One upstream's entry in `backstop tokens list`.
public struct TokenStoreStatus: Sendable, Equatable {
    /// Whether an access token and a refresh token are stored.
    public var hasAccessToken: Bool
    public var hasRefreshToken: Bool
    /// Wall-clock seconds since the epoch.
    public var expiresAt: Double?
    /// When the tokens were last written, seconds since the epoch.
    public var updatedAt: Double?
    /// What wrote them last: `refreshed` or `seeded` (and by whom, for a shared store); nil when unknown.
    public var lastWrite: String?
    /// The last refresh that failed, when none succeeded after it (a write of tokens supersedes it).
    public var failure: RefreshFailure?

    public init(
        hasAccessToken: Bool = false, hasRefreshToken: Bool = false, expiresAt: Double? = nil,
        updatedAt: Double? = nil, lastWrite: String? = nil, failure: RefreshFailure? = nil
    ) {
        self.hasAccessToken = hasAccessToken
        self.hasRefreshToken = hasRefreshToken
        self.expiresAt = expiresAt
        self.updatedAt = updatedAt
        self.lastWrite = lastWrite
        self.failure = failure
    }

    /// The last refresh and its outcome, for `tokens list`: the failure noted since the last write (every write of
    /// tokens, a seed too, removes the note, so one that is there is newer: no clocks compared); else the last write
    /// when a refresh made it (`ok`); nil when no refresh is known (nothing stored, or only a seed).
    public var lastRefresh: (at: Double, outcome: String)? {
        if let failure {
            return (failure.at, "failed: \(failure.cause)" + (failure.by.map { " (\($0))" } ?? ""))
        }
        guard lastWrite?.hasPrefix("refreshed") == true else { return nil }
        return updatedAt.map { ($0, "ok") }
    }
}

/// Makes the token store of each oauth2 upstream (one per `keychain_prefix`), for the configured `token_store`.
public protocol TokenStoreProvider: Sendable {
    func store(forPrefix prefix: String) -> any TokenStore
    /// Where tokens live, for logs.
    var location: String { get }
    /// Runs what the stores need in the background (connections, listeners) until the task is cancelled; the
    /// stores answer only while it runs. `backstop run` runs it in its service group; the default needs nothing.
    func run() async
}

extension TokenStoreProvider {
    public func run() async {}

    /// Runs `body` while `run()` serves the stores, then stops `run()` (short-lived commands, tests).
    public func withRunning<T: Sendable>(_ body: () async throws -> T) async throws -> T {
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await self.run() }
            defer { group.cancelAll() }
            return try await body()
        }
    }
}
