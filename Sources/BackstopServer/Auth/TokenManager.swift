import BackstopCore
import BackstopKeychain
import BackstopTransport
import Foundation
import Logging
import NIOCore
import NIOConcurrencyHelpers

/// One upstream's OAuth2 token: hands out the current token, refreshes it (single flight, also across
/// processes sharing the keychain file), and persists every refresh before anyone uses it.
///
/// The decisions come from the pure `TokenState`; this actor performs them. A refresh runs as an unstructured
/// task owned by the manager, so a waiting request that is cancelled never cancels it. Across processes the
/// refresh holds the keychain's exclusive lock, re-reads the keychain first, and adopts a token another process
/// already stored instead of calling the endpoint.
public actor TokenManager {
    /// Outcomes counted for `backstop_token_refreshes_total{result}`.
    public enum RefreshResult: String, Sendable, CaseIterable {
        case success, failure, adopted
    }

    private let upstreamName: String
    private let config: OAuth2Config
    private let keychain: FileKeychain
    private let fetcher: TransportFetcher
    private let tls: TransportTLSOptions
    private let logger: Logger
    private let clock: any BackstopClock
    private let endpointPolicy = TokenEndpointRetryPolicy()
    /// One call to the token endpoint: connecting, and the whole exchange. Refreshes hold the keychain lock, so a
    /// hung endpoint must not hold it (and every waiting request) for long.
    static let endpointConnectTimeout = Duration.seconds(5)
    static let endpointCallTimeout = Duration.seconds(15)
    private let counters: TokenRefreshCounters
    private var state: TokenState {
        didSet { publishFastPath() }
    }
    private var refresh: Task<Void, Never>?
    /// The current token and until when it may be used without asking the actor (its proactive refresh point or
    /// expiry): the per-request fast path, so a valid token costs a lock, not an actor hop.
    private let fastPath = NIOLockedValueBox<(token: ManagedToken, until: Double)?>(nil)
    private var random = SystemRandomNumberGenerator()

    init(
        upstreamName: String, config: OAuth2Config, keychain: FileKeychain, fetcher: TransportFetcher,
        tls: TransportTLSOptions, logger: Logger, counters: TokenRefreshCounters,
        clock: any BackstopClock = SystemClock()
    ) {
        self.upstreamName = upstreamName
        self.config = config
        self.keychain = keychain
        self.fetcher = fetcher
        self.tls = tls
        self.logger = logger
        self.counters = counters
        self.clock = clock
        self.state = TokenState(configuration: TokenState.Configuration(config))
    }

    /// The current token when it is valid and not yet due for a proactive refresh; nil means "ask the actor".
    public nonisolated func cachedToken() -> ManagedToken? {
        let now = clock.wall()
        return fastPath.withLockedValue { entry in
            guard let entry, now < entry.until else { return nil }
            return entry.token
        }
    }

    /// The expiry of the token in use (seconds since the epoch), for `/metrics`; nil without a token or expiry.
    public nonisolated var currentExpiry: Double? {
        published.withLockedValue { $0 }
    }

    /// What `currentExpiry` reads: the state's token expiry, copied out of the actor whenever the state changes.
    private let published = NIOLockedValueBox<Double?>(nil)

    private func publishFastPath() {
        published.withLockedValue { $0 = state.currentToken?.expiry }
        var entry: (token: ManagedToken, until: Double)?
        if case .valid(let token) = state.phase {
            let until = state.nextProactiveRefreshTime ?? token.expiry ?? .infinity
            entry = (token, until)
        }
        fastPath.withLockedValue { $0 = entry }
    }

    /// The token for a request about to be sent; nil when none can be had (→ 502 `token-unavailable`).
    public func tokenForRequest() async -> ManagedToken? {
        liftHoldDownIfKeychainChanged()
        return await resolve(state.tokenForRequest(now: clock.wall()))
    }

    /// The keychain file as it was when the last refresh failed (size, modification time, inode).
    private var keychainAtFailure: KeychainFileStamp?

    /// After a failed refresh, requests fail fast for `failureCooldown` (5 s) instead of hammering the token
    /// endpoint; but when the keychain file changed since (`backstop keychain set` of a new refresh token), the
    /// new grant is tried at once. Only checked while a failure holds (one `stat`).
    private func liftHoldDownIfKeychainChanged() {
        guard state.lastFailure != nil, let before = keychainAtFailure else { return }
        if KeychainFileStamp(path: keychain.path) != before {
            keychainAtFailure = nil
            state.failureHoldDownLifted()
            logger.notice("keychain changed since the failed refresh; trying again now", metadata: [
                "upstream": .string(upstreamName),
            ])
        }
    }

    private func noteRefreshFailure(final: Bool) {
        keychainAtFailure = KeychainFileStamp(path: keychain.path)
        state.refreshFailed(final: final, now: clock.wall())
    }

    /// The upstream rejected `token` (a `refresh_on` status): returns the token to replay with, or nil when the
    /// refresh failed (→ the original response with `token-refresh-failed`).
    public func tokenRejected(_ token: ManagedToken) async -> ManagedToken? {
        liftHoldDownIfKeychainChanged()
        let replacement = await resolve(state.markStale(token: token, now: clock.wall()))
        guard let replacement, replacement.generation != token.generation else { return nil }
        return replacement
    }

    private func resolve(_ first: TokenAction) async -> ManagedToken? {
        var action = first
        // Each wait ends with a finished refresh, so a handful of rounds always settles.
        for _ in 0..<4 {
            switch action {
            case .use(let token):
                return token
            case .useAndStartRefresh(let token):
                startRefresh()
                return token
            case .startRefresh:
                startRefresh()
                await refresh?.value
            case .waitForRefresh:
                if refresh == nil { startRefresh() }
                await refresh?.value
            case .fail:
                return nil
            }
            action = state.tokenForRequest(now: clock.wall())
        }
        return nil
    }

    private func startRefresh() {
        guard refresh == nil else { return }
        let staleValue = state.currentToken?.value
        refresh = Task { await self.performRefresh(replacing: staleValue) }
    }

    private var accessEntry: String { "\(config.keychainPrefix)/access_token" }
    private var refreshEntry: String { "\(config.keychainPrefix)/refresh_token" }
    private var expiryEntry: String { "\(config.keychainPrefix)/expires_at" }

    private func performRefresh(replacing staleValue: String?) async {
        defer { refresh = nil }
        do {
            try await keychain.withExclusiveLock { session in
                try await refreshHoldingLock(session, replacing: staleValue)
            }
        } catch {
            logger.error("token refresh failed", metadata: [
                "upstream": .string(upstreamName), "error": .string(Self.describe(error)),
            ])
            counters.record(upstream: upstreamName, result: .failure)
            noteRefreshFailure(final: false)
        }
    }

    private func refreshHoldingLock(_ session: KeychainLockedSession, replacing staleValue: String?) async throws {
        let entries = session.entries
        let stored = entries[accessEntry]?.stringValue
        let storedExpiry = entries[expiryEntry]?.stringValue.flatMap(Double.init)
        // Another process (or an earlier run) already stored a token this one has not seen: adopt it.
        if let stored, !stored.isEmpty, stored != staleValue, storedExpiry.map({ $0 > clock.wall() }) ?? true {
            state.refreshSucceeded(token: stored, expiry: storedExpiry, now: clock.wall(), using: &random)
            counters.record(upstream: upstreamName, result: .adopted)
            logger.info("token loaded from keychain", metadata: ["upstream": .string(upstreamName)])
            return
        }
        let secret = config.clientSecretEntry.flatMap { entries[$0]?.stringValue }
        let endpointRequest: TokenEndpointRequest
        do {
            endpointRequest = try TokenRequestBuilder.build(
                config: config, refreshToken: entries[refreshEntry]?.stringValue, clientSecret: secret)
        } catch {
            logger.error("no refresh token in the keychain", metadata: [
                "upstream": .string(upstreamName), "entry": .string(refreshEntry),
            ])
            counters.record(upstream: upstreamName, result: .failure)
            noteRefreshFailure(final: true)
            return
        }
        var attempt = 1
        while true {
            let result = await fetcher.fetch(
                TransportRequest(
                    url: endpointRequest.url, method: endpointRequest.method, headers: endpointRequest.headers,
                    body: .buffered(ByteBufferAllocator().buffer(bytes: endpointRequest.body)),
                    connectTimeout: Self.endpointConnectTimeout, tls: tls),
                timeout: Self.endpointCallTimeout)
            let outcome: TokenEndpointOutcome
            switch result {
            case .success(let response): outcome = .status(response.head.status)
            case .failure: outcome = .transportFailure
            }
            switch endpointPolicy.decide(outcome, attempt: attempt, using: &random) {
            case .accept:
                guard case .success(let response) = result else { return }
                try accept(response.body, entries: entries, session: session)
                return
            case .retry(let delay):
                logger.warning("token endpoint failed; retrying", metadata: [
                    "upstream": .string(upstreamName), "attempt": .stringConvertible(attempt),
                    "outcome": .string(Self.describe(outcome)),
                ])
                attempt += 1
                try? await Task.sleep(for: delay)
            case .giveUp(let final):
                var metadata: Logger.Metadata = [
                    "upstream": .string(upstreamName), "outcome": .string(Self.describe(outcome)),
                    "needs_new_grant": .stringConvertible(final),
                ]
                if case .success(let response) = result, let code = TokenResponseParser.oauthErrorCode(response.body) {
                    metadata["oauth_error"] = .string(code)
                }
                if final {
                    // 400/401 from the token endpoint (invalid_grant, bad client credentials): retrying cannot help.
                    metadata["fix"] = .string("store a new refresh token: backstop keychain set \(refreshEntry)")
                    logger.error("token refresh refused by the token endpoint; a new grant is needed", metadata: metadata)
                } else {
                    metadata["next_try"] = .string("on the next request after 5s")
                    logger.error("token refresh failed", metadata: metadata)
                }
                counters.record(upstream: upstreamName, result: .failure)
                noteRefreshFailure(final: final)
                return
            }
        }
    }

    private func accept(_ body: [UInt8], entries: [String: KeychainEntry], session: KeychainLockedSession) throws {
        let parsed: TokenResponse
        do {
            parsed = try TokenResponseParser.parse(body, fields: config.fields)
        } catch {
            logger.error("token endpoint response unusable", metadata: [
                "upstream": .string(upstreamName), "problem": .string("\(error)"),
            ])
            counters.record(upstream: upstreamName, result: .failure)
            noteRefreshFailure(final: false)
            return
        }
        let issuedAt = clock.wall()
        let expiry = parsed.expiry(now: issuedAt)
        let stamp = Date(timeIntervalSince1970: issuedAt)
        var tokenEntries: [String: KeychainEntry?] = [
            accessEntry: KeychainEntry(string: parsed.accessToken, updated: stamp),
            expiryEntry: expiry.map { KeychainEntry(string: String(Int64($0.rounded(.down))), updated: stamp) },
        ]
        if let rotated = parsed.refreshToken { tokenEntries[refreshEntry] = KeychainEntry(string: rotated, updated: stamp) }
        var updated = entries
        for (name, entry) in tokenEntries { updated[name] = entry }
        // Persist before anyone uses the new token: a crash now must not lose a rotated refresh token. If the write
        // fails, the tokens are still used (the old refresh token may already be spent) and persisting is retried.
        do throws(KeychainError) {
            try session.write(updated)
        } catch .durabilityUnconfirmed(let path, let code) {
            logger.warning("keychain written but not synced", metadata: [
                "upstream": .string(upstreamName),
                "problem": .string(KeychainError.durabilityUnconfirmed(path: path, errno: code).description),
            ])
        } catch {
            counters.recordKeychainWriteError()
            logger.error("cannot store refreshed tokens in the keychain; using them and retrying the write", metadata: [
                "upstream": .string(upstreamName), "problem": .string(error.description),
            ])
            schedulePersist(tokenEntries, expectedRefreshToken: entries[refreshEntry]?.stringValue)
        }
        state.refreshSucceeded(token: parsed.accessToken, expiry: expiry, now: issuedAt, using: &random)
        counters.record(upstream: upstreamName, result: .success)
        logger.info("token refreshed", metadata: [
            "upstream": .string(upstreamName), "rotated": .stringConvertible(parsed.refreshToken != nil),
        ])
    }

    // MARK: Persisting after a failed keychain write

    /// Token entries that could not be written yet, and the refresh token the keychain held when they were
    /// obtained (they are stale once another process stored newer tokens).
    private var pendingPersist: (entries: [String: KeychainEntry?], expectedRefreshToken: String?)?
    private var persistTask: Task<Void, Never>?
    /// Bumped by each new pending write, so finishing an older one does not drop a newer one.
    private var pendingGeneration = 0
    /// Waits between write attempts: exponential from 1 s to 1 min, full jitter.
    private static let persistBackoff = Backoff(BackoffConfig(
        strategy: .exponential, base: .seconds(1), max: .seconds(60), multiplier: 2, jitter: .full))

    private func schedulePersist(_ entries: [String: KeychainEntry?], expectedRefreshToken: String?) {
        pendingPersist = (entries, expectedRefreshToken)
        pendingGeneration += 1
        guard persistTask == nil else { return }
        persistTask = Task { await self.persistUntilWritten() }
    }

    private func persistUntilWritten() async {
        defer { persistTask = nil }
        var retry = 1
        while let pending = pendingPersist {
            try? await Task.sleep(for: Self.persistBackoff.delay(retry: retry, previous: nil, random: &random))
            retry += 1
            let refreshEntry = self.refreshEntry
            let generation = pendingGeneration
            do {
                let stillCurrent = try await keychain.withExclusiveLock { (session: KeychainLockedSession) async throws -> Bool in
                    var stored = session.entries
                    // Another process refreshed since: its tokens are newer than ours, keep them.
                    guard stored[refreshEntry]?.stringValue == pending.expectedRefreshToken else { return false }
                    for (name, entry) in pending.entries { stored[name] = entry }
                    try session.write(stored)
                    return true
                }
                if generation == pendingGeneration { pendingPersist = nil }
                logger.notice(
                    stillCurrent ? "refreshed tokens stored in the keychain" : "newer tokens found in the keychain; pending write dropped",
                    metadata: ["upstream": .string(upstreamName)])
            } catch let error as KeychainError {
                if case .durabilityUnconfirmed = error {
                    if generation == pendingGeneration { pendingPersist = nil }
                    continue
                }
                counters.recordKeychainWriteError()
                logger.error("cannot store refreshed tokens in the keychain; retrying", metadata: [
                    "upstream": .string(upstreamName), "problem": .string(error.description),
                ])
            } catch {
                counters.recordKeychainWriteError()
            }
        }
    }

    private static func describe(_ outcome: TokenEndpointOutcome) -> String {
        switch outcome {
        case .transportFailure: "transport-failure"
        case .status(let code): "status-\(code)"
        }
    }

    private static func describe(_ error: any Error) -> String {
        if let keychainError = error as? KeychainError { return keychainError.description }
        return String(describing: type(of: error))
    }
}

/// Token refresh outcomes per upstream, read by the metrics endpoint.
public final class TokenRefreshCounters: Sendable {
    private let counts = NIOLockedValueBox<[String: [TokenManager.RefreshResult: Int]]>([:])

    public init() {}

    private let keychainWriteErrors = NIOLockedValueBox(0)

    func record(upstream: String, result: TokenManager.RefreshResult) {
        counts.withLockedValue { $0[upstream, default: [:]][result, default: 0] += 1 }
    }

    /// A keychain write of refreshed tokens failed (`backstop_keychain_write_errors_total`).
    func recordKeychainWriteError() { keychainWriteErrors.withLockedValue { $0 += 1 } }

    public var keychainWriteErrorCount: Int { keychainWriteErrors.withLockedValue { $0 } }

    /// `[upstream: [result: count]]`.
    public var snapshot: [String: [TokenManager.RefreshResult: Int]] { counts.withLockedValue { $0 } }
}

/// Identifies one version of the keychain file on disk (size, modification time, inode): a write by any process
/// (an atomic replace makes a new inode) changes it.
struct KeychainFileStamp: Equatable {
    let size: Int
    let seconds: Int
    let nanoseconds: Int
    let inode: UInt64

    init?(path: String) {
        var info = stat()
        guard stat(path, &info) == 0 else { return nil }
        size = Int(info.st_size)
        seconds = Int(info.st_mtim.tv_sec)
        nanoseconds = Int(info.st_mtim.tv_nsec)
        inode = UInt64(info.st_ino)
    }
}
