import BackstopCore
import BackstopKeychain
import BackstopTransport
import Foundation
import Logging
import NIOCore
import NIOConcurrencyHelpers

/// One upstream's OAuth2 token: hands out the current token, refreshes it (single flight across whoever shares its
/// token store: the processes sharing a keychain file, or a whole fleet on PostgreSQL), and has every refresh
/// stored before anyone uses it (docs/reference/behaviour.md#oauth2, docs/reference/token-store.md).
///
/// The decisions come from the pure `TokenState`; this actor performs them. A refresh runs as an unstructured
/// task owned by the manager, so a waiting request that is cancelled never cancels it. The refresh holds the store's
/// lock, re-reads the store first, and adopts a token another process already stored instead of calling the
/// endpoint (`TokenRefreshStep`). Tokens another instance stores are also adopted as soon as the store reports them.
public actor TokenManager {
    /// Outcomes counted for `backstop_token_refreshes_total{result}`.
    public enum RefreshResult: String, Sendable, CaseIterable {
        case success, failure, adopted
    }

    private let upstreamName: String
    private let store: any TokenStore
    private let step: TokenRefreshStep
    private let logger: Logger
    private let clock: any BackstopClock
    private let counters: TokenRefreshCounters
    private var state: TokenState {
        didSet { publishFastPath() }
    }
    private var refresh: Task<Void, Never>?
    private var watcher: Task<Void, Never>?
    /// The current token and until when it may be used without asking the actor (its proactive refresh point or
    /// expiry): the per-request fast path, so a valid token costs a lock, not an actor hop (and never the store).
    private let fastPath = NIOLockedValueBox<(token: ManagedToken, until: Double)?>(nil)
    private var random = SystemRandomNumberGenerator()

    init(
        upstreamName: String, config: OAuth2Config, store: any TokenStore, secrets: FileKeychain?,
        fetcher: TransportFetcher, tls: TransportTLSOptions, logger: Logger, counters: TokenRefreshCounters,
        clock: any BackstopClock = SystemClock()
    ) {
        self.upstreamName = upstreamName
        self.store = store
        self.step = TokenRefreshStep(
            upstreamName: upstreamName, config: config, secrets: secrets, fetcher: fetcher, tls: tls, logger: logger,
            clock: clock)
        self.logger = logger
        self.counters = counters
        self.clock = clock
        self.state = TokenState(configuration: TokenState.Configuration(config))
    }

    /// Adopts tokens other instances store, for as long as the manager is in use (stores that can tell only).
    func startWatchingStore() {
        guard watcher == nil, let changes = store.changes() else { return }
        watcher = Task { [weak self] in
            for await tokens in changes {
                guard let self else { return }
                await self.storeChanged(tokens)
            }
        }
    }

    /// Stops adopting (the manager is being replaced or the server stops).
    func stopWatchingStore() {
        watcher?.cancel()
        watcher = nil
    }

    private func storeChanged(_ tokens: StoredTokens) {
        if state.lastFailure != nil, tokens.refreshToken != nil {
            // A new grant (`backstop tokens seed` on any instance) ends a failure hold-down, as a keychain change does.
            state.failureHoldDownLifted()
        }
        guard let access = tokens.accessToken, access != state.currentToken?.value else { return }
        if state.loaded(token: access, expiry: tokens.expiresAt, now: clock.wall(), using: &random) != nil {
            counters.record(upstream: upstreamName, result: .adopted)
            logger.info("token adopted from the token store", metadata: [
                "upstream": .string(upstreamName), "store": .string(store.location),
            ])
        }
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

    /// Whether a token is held now (valid, stale or being refreshed), for the status page.
    public nonisolated var holdsToken: Bool {
        holding.withLockedValue { $0 }
    }

    /// What `currentExpiry` reads: the state's token expiry, copied out of the actor whenever the state changes.
    private let published = NIOLockedValueBox<Double?>(nil)
    private let holding = NIOLockedValueBox(false)

    private func publishFastPath() {
        published.withLockedValue { $0 = state.currentToken?.expiry }
        holding.withLockedValue { $0 = state.currentToken != nil }
        var entry: (token: ManagedToken, until: Double)?
        if case .valid(let token) = state.phase {
            let until = state.nextProactiveRefreshTime ?? token.expiry ?? .infinity
            entry = (token, until)
        }
        fastPath.withLockedValue { $0 = entry }
    }

    /// The token for a request about to be sent; nil when none can be had (→ 502 `token-unavailable`).
    public func tokenForRequest() async -> ManagedToken? {
        liftHoldDownIfStoreChanged()
        return await resolve(state.tokenForRequest(now: clock.wall()))
    }

    /// The store's revision when the last refresh failed.
    private var revisionAtFailure: TokenStoreRevision?

    /// After a failed refresh, requests fail fast for `failureCooldown` (5 s) instead of hammering the token
    /// endpoint; but when the store changed since (`backstop keychain set` or `tokens seed` of a new refresh
    /// token), the new grant is tried at once. Only checked while a failure holds (one `stat` for the keychain).
    private func liftHoldDownIfStoreChanged() {
        guard state.lastFailure != nil, let before = revisionAtFailure else { return }
        if store.revision != before {
            revisionAtFailure = nil
            state.failureHoldDownLifted()
            logger.notice("token store changed since the failed refresh; trying again now", metadata: [
                "upstream": .string(upstreamName),
            ])
        }
    }

    private func noteRefreshFailure(final: Bool) {
        counters.record(upstream: upstreamName, result: .failure)
        revisionAtFailure = store.revision
        state.refreshFailed(final: final, now: clock.wall())
    }

    /// The upstream rejected `token` (a `refresh_on` status): returns the token to replay with, or nil when the
    /// refresh failed (→ the original response with `token-refresh-failed`).
    public func tokenRejected(_ token: ManagedToken) async -> ManagedToken? {
        liftHoldDownIfStoreChanged()
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

    private func performRefresh(replacing staleValue: String?) async {
        defer { refresh = nil }
        let step = self.step
        let outcome: TokenRefreshStep.Outcome
        let writeFailure: TokenStoreError?
        do throws(TokenStoreError) {
            (outcome, writeFailure) = try await store.withRefreshLock { stored in
                await step.decide(stored: stored, replacing: staleValue)
            }
        } catch {
            logger.error("token refresh failed", metadata: [
                "upstream": .string(upstreamName), "store": .string(store.location), "error": .string(error.description),
            ])
            noteRefreshFailure(final: false)
            return
        }
        switch outcome {
        case .adopted(let tokens):
            state.refreshSucceeded(
                token: tokens.accessToken ?? "", expiry: tokens.expiresAt, now: clock.wall(), using: &random)
            counters.record(upstream: upstreamName, result: .adopted)
            logger.info("token loaded from the token store", metadata: [
                "upstream": .string(upstreamName), "store": .string(store.location),
            ])
        case .refreshed(let tokens, let previousRefreshToken):
            if let writeFailure {
                // The endpoint may already have spent the old refresh token: use the new tokens anyway, and keep
                // trying to store them.
                counters.recordKeychainWriteError()
                logger.error("cannot store refreshed tokens; using them and retrying the write", metadata: [
                    "upstream": .string(upstreamName), "store": .string(store.location),
                    "problem": .string(writeFailure.description),
                ])
                schedulePersist(tokens, expectedRefreshToken: previousRefreshToken)
            }
            state.refreshSucceeded(
                token: tokens.accessToken ?? "", expiry: tokens.expiresAt, now: clock.wall(), using: &random)
            counters.record(upstream: upstreamName, result: .success)
            logger.info("token refreshed", metadata: [
                "upstream": .string(upstreamName),
                "rotated": .stringConvertible(tokens.refreshToken != previousRefreshToken),
            ])
        case .failed(let final):
            noteRefreshFailure(final: final)
        }
    }

    // MARK: Persisting after a failed write

    /// Tokens that could not be written yet, and the refresh token the store held when they were obtained (they
    /// are stale once another process stored newer tokens).
    private var pendingPersist: (tokens: StoredTokens, expectedRefreshToken: String?)?
    private var persistTask: Task<Void, Never>?
    /// Bumped by each new pending write, so finishing an older one does not drop a newer one.
    private var pendingGeneration = 0
    /// Waits between write attempts: exponential from 1 s to 1 min, full jitter.
    private static let persistBackoff = Backoff(BackoffConfig(
        strategy: .exponential, base: .seconds(1), max: .seconds(60), multiplier: 2, jitter: .full))

    private func schedulePersist(_ tokens: StoredTokens, expectedRefreshToken: String?) {
        pendingPersist = (tokens, expectedRefreshToken)
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
            let generation = pendingGeneration
            do throws(TokenStoreError) {
                let stillCurrent = try await store.storeIfUnchanged(
                    pending.tokens, expectedRefreshToken: pending.expectedRefreshToken)
                if generation == pendingGeneration { pendingPersist = nil }
                logger.notice(
                    stillCurrent ? "refreshed tokens stored" : "newer tokens found in the token store; pending write dropped",
                    metadata: ["upstream": .string(upstreamName), "store": .string(store.location)])
            } catch {
                counters.recordKeychainWriteError()
                logger.error("cannot store refreshed tokens; retrying", metadata: [
                    "upstream": .string(upstreamName), "problem": .string(error.description),
                ])
            }
        }
    }
}

/// What a refresh does while holding the store's lock: adopt a token someone else stored, or call the token
/// endpoint (with its retry policy) and return the new tokens to store. Sendable and without state of its own, so it
/// runs inside any store's lock.
struct TokenRefreshStep: Sendable {
    enum Outcome: Sendable {
        /// A token another process stored, newer than the one being replaced and unexpired.
        case adopted(StoredTokens)
        /// Fresh tokens from the endpoint; `previousRefreshToken` is the one that was spent.
        case refreshed(StoredTokens, previousRefreshToken: String?)
        /// Logged already; `final`: only a human can fix it (400/401 from the endpoint, no refresh token).
        case failed(final: Bool)
    }

    let upstreamName: String
    let config: OAuth2Config
    /// Where `client_secret_entry` is read from (always the local keychain, whatever the token store).
    let secrets: FileKeychain?
    let fetcher: TransportFetcher
    let tls: TransportTLSOptions
    let logger: Logger
    let clock: any BackstopClock
    let endpointPolicy = TokenEndpointRetryPolicy()
    /// One call to the token endpoint: connecting, and the whole exchange. Refreshes hold the store's lock, so a
    /// hung endpoint must not hold it (and every waiting request) for long.
    static let endpointConnectTimeout = Duration.seconds(5)
    static let endpointCallTimeout = Duration.seconds(15)

    func decide(stored: StoredTokens, replacing staleValue: String?) async -> LockedDecision<Outcome> {
        // Another process (or an earlier run) already stored a token this one has not seen: adopt it.
        if let access = stored.accessToken, access != staleValue, stored.expiresAt.map({ $0 > clock.wall() }) ?? true {
            return LockedDecision(result: .adopted(stored))
        }
        let secret = config.clientSecretEntry.flatMap { try? secrets?.entry($0)?.stringValue }
        let endpointRequest: TokenEndpointRequest
        do {
            endpointRequest = try TokenRequestBuilder.build(
                config: config, refreshToken: stored.refreshToken, clientSecret: secret)
        } catch {
            logger.error("no refresh token in the token store", metadata: [
                "upstream": .string(upstreamName), "entry": .string("\(config.keychainPrefix)/refresh_token"),
            ])
            return LockedDecision(result: .failed(final: true))
        }
        var random = SystemRandomNumberGenerator()
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
                guard case .success(let response) = result else { return LockedDecision(result: .failed(final: false)) }
                return accept(response.body, stored: stored)
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
                    metadata["fix"] = .string("store a new refresh token: backstop tokens seed \(upstreamName)")
                    logger.error("token refresh refused by the token endpoint; a new grant is needed", metadata: metadata)
                } else {
                    metadata["next_try"] = .string("on the next request after 5s")
                    logger.error("token refresh failed", metadata: metadata)
                }
                return LockedDecision(result: .failed(final: final))
            }
        }
    }

    private func accept(_ body: [UInt8], stored: StoredTokens) -> LockedDecision<Outcome> {
        let parsed: TokenResponse
        do {
            parsed = try TokenResponseParser.parse(body, fields: config.fields)
        } catch {
            logger.error("token endpoint response unusable", metadata: [
                "upstream": .string(upstreamName), "problem": .string("\(error)"),
            ])
            return LockedDecision(result: .failed(final: false))
        }
        let tokens = StoredTokens(
            accessToken: parsed.accessToken, refreshToken: parsed.refreshToken ?? stored.refreshToken,
            expiresAt: parsed.expiry(now: clock.wall()))
        // Stored before the lock is released, so before anyone uses them: a crash now must not lose a rotated
        // refresh token.
        return LockedDecision(result: .refreshed(tokens, previousRefreshToken: stored.refreshToken), store: tokens)
    }

    private static func describe(_ outcome: TokenEndpointOutcome) -> String {
        switch outcome {
        case .transportFailure: "transport-failure"
        case .status(let code): "status-\(code)"
        }
    }
}

/// Token refresh outcomes per upstream, read by the metrics endpoint.
public final class TokenRefreshCounters: Sendable {
    private let counts = NIOLockedValueBox<[String: [TokenManager.RefreshResult: Int]]>([:])
    /// The last refresh per upstream (wall-clock seconds and result), for the status page.
    private let last = NIOLockedValueBox<[String: (at: Double, result: TokenManager.RefreshResult)]>([:])
    private let clock: any BackstopClock

    public init(clock: any BackstopClock = SystemClock()) { self.clock = clock }

    private let keychainWriteErrors = NIOLockedValueBox(0)

    func record(upstream: String, result: TokenManager.RefreshResult) {
        counts.withLockedValue { $0[upstream, default: [:]][result, default: 0] += 1 }
        let now = clock.wall()
        last.withLockedValue { $0[upstream] = (now, result) }
    }

    /// When `upstream`'s token was last refreshed (or adopted), and how that ended.
    public func lastRefresh(upstream: String) -> (at: Double, result: TokenManager.RefreshResult)? {
        last.withLockedValue { $0[upstream] }
    }

    /// A keychain write of refreshed tokens failed (`backstop_keychain_write_errors_total`).
    func recordKeychainWriteError() { keychainWriteErrors.withLockedValue { $0 += 1 } }

    public var keychainWriteErrorCount: Int { keychainWriteErrors.withLockedValue { $0 } }

    /// `[upstream: [result: count]]`.
    public var snapshot: [String: [TokenManager.RefreshResult: Int]] { counts.withLockedValue { $0 } }
}
