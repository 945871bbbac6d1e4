import BackstopCore
import BackstopKeychain
import BackstopTracing
import BackstopTransport
import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import Synchronization

/// One upstream's OAuth2 token: hands out the current token, refreshes it (single flight across whoever shares its
/// token store: the processes sharing a keychain file, or a whole fleet on PostgreSQL), and has every refresh
/// stored before anyone uses it (docs/reference/behaviour.md#oauth2, docs/reference/token-store.md).
///
/// The decisions come from the pure `TokenState`; this actor performs them. A refresh runs as a job of the server's
/// background work (`BackgroundWork`, children of `ProxyServer.run()`), not in any request's task, so a waiting
/// request that is cancelled never cancels it; waiters wait for its number to finish. The refresh holds the store's
/// lock, re-reads the store first, and adopts a token another process already stored instead of calling the
/// endpoint (`TokenRefreshStep`). Tokens another instance stores are also adopted as soon as the store reports them.
///
/// Proactive refreshes run on a timer while the upstream is in use (`TokenState.proactiveTimer`): the manager asks
/// the state after every change, sleeps until the instant it names, and asks again. When the upstream has been idle
/// for 10 minutes the timer stops and the fast path is closed, so the next request comes to the actor and restarts
/// it (docs/reference/behaviour.md#oauth2).
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
    /// Records a span per refresh (docs/reference/operations.md#tracing); nil without `tracing`.
    private let tracer: Tracer?
    /// The token endpoint's host, the refresh span's `server.address`.
    private let tokenEndpointHost: String
    /// The span of the refresh in flight, which the requests waiting on it link to.
    private var refreshSpan: SpanTimer?
    private var state: TokenState {
        didSet { publishFastPath() }
    }
    /// The number of the refresh in flight (refreshes are numbered as they start); nil when none runs.
    private var refreshInFlight: Int?
    private var refreshesStarted = 0
    /// The highest refresh number finished, read by waiters outside the actor.
    private let refreshesFinished = Atomic<Int>(0)
    private let refreshEnded = ConditionWaiters()
    /// Runs refreshes, the proactive-refresh timer and pending writes (the server's background work).
    private let background: BackgroundWork
    /// The per-request fast path, so a valid token costs a lock, not an actor hop (and never the store).
    private let fastPath = NIOLockedValueBox(FastPath())
    private var random = SplitMix64()
    /// The instant the proactive-refresh timer wakes at (nil: none armed). Each arming gets a new number; a timer
    /// job whose number is no longer current ends at once (`timerChanges`) and never fires.
    private var timerDue: Double?
    private let timerNumber = Atomic<Int>(0)
    private let timerChanges = ConditionWaiters()
    /// The timer stopped because the upstream was idle: the fast path stays closed until a request comes.
    private var idle = false
    private var stopped = false
    /// Set by `stop()`: ends `run()`.
    private let stopping = OnceFlag()

    /// What requests read without the actor: the current token and until when it may be used that way (its
    /// proactive refresh point or expiry; nil token: ask the actor), and when a request last asked.
    struct FastPath {
        var token: ManagedToken?
        var until: Double = -.infinity
        var lastUsed: Double?
    }

    init(
        upstreamName: String, config: OAuth2Config, store: any TokenStore, secrets: FileKeychain?,
        fetcher: TransportFetcher, tls: TransportTLSOptions, logger: Logger, counters: TokenRefreshCounters,
        background: BackgroundWork, tracer: Tracer? = nil, clock: any BackstopClock = SystemClock()
    ) {
        self.upstreamName = upstreamName
        self.background = background
        self.tracer = tracer
        self.tokenEndpointHost = SpanAttributes.hostAndPort(config.tokenURL)?.0 ?? "-"
        self.store = store
        self.step = TokenRefreshStep(
            upstreamName: upstreamName, config: config, secrets: secrets, fetcher: fetcher, tls: tls, logger: logger,
            clock: clock)
        self.logger = logger
        self.counters = counters
        self.clock = clock
        self.state = TokenState(configuration: TokenState.Configuration(config))
    }

    /// Adopts tokens other instances store (stores that can tell only) until `stop()`: the server runs it as
    /// background work (`ProxyServer.run`).
    func run() async {
        guard !stopped, let changes = store.changes(for: upstreamName) else { return }
        let stopping = self.stopping
        await withTaskGroup(of: Void.self) { group in
            group.addTask { [weak self] in
                for await tokens in changes {
                    guard let self else { return }
                    await self.storeChanged(tokens)
                }
            }
            group.addTask { await stopping.wait() }
            await group.next()
            group.cancelAll()
        }
    }

    /// Stops adopting and the proactive-refresh timer (the manager is being replaced or the server stops).
    func stop() {
        stopped = true
        stopping.set()
        disarmTimer()
    }

    private func storeChanged(_ tokens: StoredTokens) {
        if state.lastFailure != nil, tokens.refreshToken != nil {
            // A new grant (`backstop tokens seed` on any instance) ends a failure hold-down, as a keychain change does.
            state.failureHoldDownLifted()
        }
        defer { scheduleProactiveRefresh() }
        guard let access = tokens.accessToken, access != state.currentToken?.value else { return }
        if state.loaded(token: access, expiry: tokens.expiresAt, now: clock.wall(), using: &random) != nil {
            counters.record(upstream: upstreamName, result: .adopted)
            logger.info(
                "token adopted from the token store",
                metadata: [
                    "upstream": .string(upstreamName), "store": .string(store.location),
                ])
        }
    }

    /// The current token when it is valid and not yet due for a proactive refresh; nil means "ask the actor".
    public nonisolated func cachedToken() -> ManagedToken? {
        let now = clock.wall()
        return fastPath.withLockedValue { entry in
            entry.lastUsed = now
            guard now < entry.until else { return nil }
            return entry.token
        }
    }

    /// The expiry of the token in use (seconds since the epoch), for `/metrics`; nil without a token or expiry, and
    /// while the upstream is idle: its token is then left to expire on purpose (the next request gets a new one),
    /// and an expiry gauge running out would page for a token nobody uses.
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
        published.withLockedValue { $0 = idle ? nil : state.currentToken?.expiry }
        holding.withLockedValue { $0 = state.currentToken != nil }
        var token: ManagedToken?
        var until = -Double.infinity
        if case .valid(let valid) = state.phase, !idle, let handOutUntil = state.handOutUntil {
            token = valid
            until = handOutUntil
        }
        fastPath.withLockedValue {
            $0.token = token
            $0.until = until
        }
    }

    /// The token for a request about to be sent; nil when none can be had (→ 502 `token-unavailable`). `trace` is
    /// the request's: a refresh it starts is a span of its trace; `refresh` is the recorded span of the refresh it
    /// waited on, for its server span to link to.
    public func tokenForRequest(trace: RequestTrace? = nil) async -> (token: ManagedToken?, refresh: SpanLink?) {
        noteUse()
        await liftHoldDownIfStoreChanged()
        let action = state.tokenForRequest(now: clock.wall())
        scheduleProactiveRefresh()
        return await resolve(action, trace: trace)
    }

    /// A request asked for the token (the fast path records its own): after an idle spell, the timer starts again.
    private func noteUse() {
        let now = clock.wall()
        fastPath.withLockedValue { $0.lastUsed = max($0.lastUsed ?? now, now) }
        if idle {
            idle = false
            publishFastPath()
        }
    }

    // MARK: Proactive refresh on a timer

    /// Asks the state what the timer does next and does it: start the refresh, (re)arm the timer, or let it go.
    private func scheduleProactiveRefresh() {
        guard !stopped else { return }
        let now = clock.wall()
        let lastUsed = fastPath.withLockedValue { $0.lastUsed }
        var wake: Double?
        switch state.proactiveTimer(now: now, lastUsed: lastUsed) {
        case .refreshNow:
            if state.startProactiveRefresh(now: now) { startRefresh(parent: nil) }
        case .wake(let at):
            wake = at
        case .idle:
            if !idle {
                idle = true
                publishFastPath()
                logger.debug(
                    "upstream idle; proactive refreshes paused until its next request",
                    metadata: [
                        "upstream": .string(upstreamName)
                    ])
            }
        case .stop:
            break
        }
        guard wake != timerDue else { return }
        let number = disarmTimer()
        timerDue = wake
        guard let wake else { return }
        background.spawn { [self] in
            let superseded = await withTimeLimit(.seconds(max(0, wake - now))) {
                await self.timerChanges.wait { self.timerNumber.load(ordering: .acquiring) != number }
            }
            guard !superseded, !Task.isCancelled else { return }
            await self.timerFired(number)
        }
    }

    /// Ends the armed timer's job, if any; returns the number the next arming gets.
    @discardableResult
    private func disarmTimer() -> Int {
        timerDue = nil
        let number = timerNumber.add(1, ordering: .acquiringAndReleasing).newValue
        timerChanges.resumeAll()
        return number
    }

    private func timerFired(_ number: Int) {
        guard number == timerNumber.load(ordering: .acquiring) else { return }
        timerDue = nil
        scheduleProactiveRefresh()
    }

    /// The store's revision and its tokens when the last refresh failed (tokens nil: unknown, the store failed).
    private var revisionAtFailure: TokenStoreRevision?
    private var tokensAtFailure: StoredTokens?

    /// After a failed refresh, requests fail fast for `failureCooldown` (5 s) instead of hammering the token
    /// endpoint; but when the stored tokens changed since (`backstop keychain set` or `tokens seed` of a new refresh
    /// token, another process's refresh), the new ones are tried at once. A change of the store that leaves the
    /// tokens as they were — another process sharing the keychain noting its own failed refresh — does not lift it:
    /// two processes failing in turn would otherwise lift each other's hold-down and call the endpoint without
    /// pause. Only checked while a failure holds: one `stat` for the keychain, a read only when that changed.
    private func liftHoldDownIfStoreChanged() async {
        guard state.lastFailure != nil, let before = revisionAtFailure else { return }
        let revision = store.revision
        guard revision != before else { return }
        if let baseline = tokensAtFailure {
            let current = try? await store.load()
            // Another failure, a lift or a refresh may have happened while the tokens were read: it decides then.
            guard revisionAtFailure == before, state.lastFailure != nil else { return }
            if current == baseline {
                revisionAtFailure = revision
                return
            }
        }
        revisionAtFailure = nil
        tokensAtFailure = nil
        state.failureHoldDownLifted()
        logger.notice(
            "token store changed since the failed refresh; trying again now",
            metadata: [
                "upstream": .string(upstreamName)
            ])
    }

    /// `tokens`: what the refresh found in the store under its lock; nil when the store itself failed.
    private func noteRefreshFailure(final: Bool, tokens: StoredTokens?) {
        counters.record(upstream: upstreamName, result: .failure)
        revisionAtFailure = store.revision
        tokensAtFailure = tokens
        state.refreshFailed(final: final, now: clock.wall())
    }

    /// The upstream rejected `token` (a `refresh_on` status): returns the token to replay with, or nil when the
    /// refresh failed (→ the original response with `token-refresh-failed`); `trace` and `refresh` as for
    /// `tokenForRequest`.
    public func tokenRejected(
        _ token: ManagedToken, trace: RequestTrace? = nil
    ) async
        -> (token: ManagedToken?, refresh: SpanLink?)
    {
        noteUse()
        await liftHoldDownIfStoreChanged()
        let action = state.markStale(token: token, now: clock.wall())
        scheduleProactiveRefresh()
        let (replacement, refresh) = await resolve(action, trace: trace)
        guard let replacement, replacement.generation != token.generation else { return (nil, refresh) }
        return (replacement, refresh)
    }

    private func resolve(_ first: TokenAction, trace: RequestTrace?) async -> (ManagedToken?, SpanLink?) {
        var action = first
        var waited: SpanLink?
        // Each wait ends with a finished refresh, so a handful of rounds always settles.
        for _ in 0..<4 {
            switch action {
            case .use(let token):
                return (token, waited)
            case .useAndStartRefresh(let token):
                startRefresh(parent: nil)  // ahead of expiry, nobody waits: a trace of its own
                return (token, waited)
            case .startRefresh, .waitForRefresh:
                if refreshInFlight == nil { startRefresh(parent: trace) }
                if waited == nil, let span = refreshSpan, span.sampled { waited = span.link }
                if let number = refreshInFlight { await waitForRefresh(number) }
            case .fail:
                return (nil, waited)
            }
            action = state.tokenForRequest(now: clock.wall())
        }
        return (nil, waited)
    }

    /// Returns once refresh `number` finished (or the waiting task is cancelled).
    private nonisolated func waitForRefresh(_ number: Int) async {
        await refreshEnded.wait { refreshesFinished.load(ordering: .acquiring) >= number }
    }

    /// Starts the refresh (single flight); `parent` is the request that waits for it, nil for one ahead of expiry.
    private func startRefresh(parent: RequestTrace?) {
        guard refreshInFlight == nil else { return }
        let staleValue = state.currentToken?.value
        let span = tracer?.startRefresh(parent: parent, at: clock.monotonic())
        refreshSpan = span
        refreshesStarted += 1
        let number = refreshesStarted
        refreshInFlight = number
        background.spawn { [self] in await self.performRefresh(number, replacing: staleValue, span: span) }
    }

    /// Refresh `number`, then its span ends and only then are its waiters woken: a request that waited starts its
    /// attempt after the refresh span's end, as its trace shows (docs/reference/operations.md#tracing).
    private func performRefresh(_ number: Int, replacing staleValue: String?, span: SpanTimer?) async {
        let (result, cause) = await refreshOutcome(replacing: staleValue)
        span?.finish(
            RefreshFacts(
                upstream: upstreamName, tokenEndpointHost: tokenEndpointHost, outcome: result.rawValue,
                failure: cause),
            at: clock.monotonic())
        refreshInFlight = nil
        refreshSpan = nil
        refreshesFinished.store(number, ordering: .releasing)
        refreshEnded.resumeAll()
        scheduleProactiveRefresh()
    }

    /// One refresh: what it came to, and why it failed (the refresh span's `error.type`).
    private func refreshOutcome(replacing staleValue: String?) async -> (TokenManager.RefreshResult, String?) {
        let step = self.step
        let outcome: TokenRefreshStep.Outcome
        let writeFailure: TokenStoreError?
        do throws(TokenStoreError) {
            (outcome, writeFailure) = try await store.withRefreshLock { stored in
                await step.decide(stored: stored, replacing: staleValue)
            }
        } catch .rolledBack(let stored, let seen) {
            // Only a human can tell which tokens are current: like a refused grant, no proactive retries.
            logger.warning(
                "token store row is older than one already seen; not used",
                metadata: [
                    "upstream": .string(upstreamName), "store": .string(store.location),
                    "stored_version": .stringConvertible(stored), "seen_version": .stringConvertible(seen),
                    "fix": .string("store a new refresh token: backstop tokens seed \(upstreamName)"),
                ])
            noteRefreshFailure(final: true, tokens: nil)
            return (.failure, "token-store-rolled-back")
        } catch {
            logger.error(
                "token refresh failed",
                metadata: [
                    "upstream": .string(upstreamName), "store": .string(store.location),
                    "error": .string(error.description),
                ])
            noteRefreshFailure(final: false, tokens: nil)
            return (.failure, "token-store-failed")
        }
        switch outcome {
        case .adopted(let tokens):
            state.refreshSucceeded(
                token: tokens.accessToken ?? "", expiry: tokens.expiresAt, now: clock.wall(), using: &random)
            counters.record(upstream: upstreamName, result: .adopted)
            logger.info(
                "token loaded from the token store",
                metadata: [
                    "upstream": .string(upstreamName), "store": .string(store.location),
                ])
            return (.adopted, nil)
        case .refreshed(let tokens, let previousRefreshToken):
            if let writeFailure {
                // The endpoint may already have spent the old refresh token: use the new tokens anyway, and keep
                // trying to store them.
                counters.recordKeychainWriteError()
                logger.error(
                    "cannot store refreshed tokens; using them and retrying the write",
                    metadata: [
                        "upstream": .string(upstreamName), "store": .string(store.location),
                        "problem": .string(writeFailure.description),
                    ])
                schedulePersist(tokens, expectedRefreshToken: previousRefreshToken)
            }
            state.refreshSucceeded(
                token: tokens.accessToken ?? "", expiry: tokens.expiresAt, now: clock.wall(), using: &random)
            counters.record(upstream: upstreamName, result: .success)
            logger.info(
                "token refreshed",
                metadata: [
                    "upstream": .string(upstreamName),
                    "rotated": .stringConvertible(tokens.refreshToken != previousRefreshToken),
                ])
            return (.success, nil)
        case .failed(let final, let cause, let stored):
            noteRefreshFailure(final: final, tokens: stored)
            return (.failure, cause)
        }
    }

    // MARK: Persisting after a failed write

    /// Tokens that could not be written yet, and the refresh token the store held when they were obtained (they
    /// are stale once another process stored newer tokens).
    private var pendingPersist: (tokens: StoredTokens, expectedRefreshToken: String?)?
    private var persisting = false
    /// Bumped by each new pending write, so finishing an older one does not drop a newer one.
    private var pendingGeneration = 0
    /// Waits between write attempts: exponential from 1 s to 1 min, full jitter.
    private static let persistBackoff = Backoff(
        BackoffConfig(
            strategy: .exponential, base: .seconds(1), max: .seconds(60), multiplier: 2, jitter: .full))

    private func schedulePersist(_ tokens: StoredTokens, expectedRefreshToken: String?) {
        pendingPersist = (tokens, expectedRefreshToken)
        pendingGeneration += 1
        guard !persisting else { return }
        persisting = true
        background.spawn { [self] in await self.persistUntilWritten() }
    }

    private func persistUntilWritten() async {
        defer { persisting = false }
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
                    stillCurrent
                        ? "refreshed tokens stored" : "newer tokens found in the token store; pending write dropped",
                    metadata: ["upstream": .string(upstreamName), "store": .string(store.location)])
            } catch {
                counters.recordKeychainWriteError()
                logger.error(
                    "cannot store refreshed tokens; retrying",
                    metadata: [
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
        /// Logged already; `final`: only a human can fix it (400/401 from the endpoint, no refresh token). `cause`
        /// names it for the refresh span (docs/reference/operations.md#tracing); `stored`: the tokens the refresh
        /// found under the lock, the hold-down's baseline.
        case failed(final: Bool, cause: String, stored: StoredTokens)
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

    /// A failed refresh over `stored`: reported to the token manager, and recorded in the store as its last refresh
    /// outcome.
    private func failed(final: Bool, cause: String, stored: StoredTokens) -> LockedDecision<Outcome> {
        LockedDecision(
            result: .failed(final: final, cause: cause, stored: stored),
            failure: RefreshFailure(at: clock.wall(), cause: cause))
    }

    func decide(stored: StoredTokens, replacing staleValue: String?) async -> LockedDecision<Outcome> {
        // Another process (or an earlier run) already stored a token this one has not seen: adopt it.
        if let access = stored.accessToken, access != staleValue, stored.expiresAt.map({ $0 > clock.wall() }) ?? true {
            return LockedDecision(result: .adopted(stored))
        }
        let secret = config.clientSecretEntry.flatMap { try? secrets?.entry($0)?.stringValue }
        let credentials: TokenClientCredentials
        switch TokenClientCredentials.load(config: config, keychain: secrets) {
        case .success(let loaded): credentials = loaded
        case .failure(let problem):
            logger.error(
                "token endpoint client credentials unusable",
                metadata: [
                    "upstream": .string(upstreamName), "problem": .string(problem.description),
                ])
            return failed(final: false, cause: "client-credentials-unusable", stored: stored)
        }
        var tls = self.tls
        tls.clientIdentity = credentials.tlsIdentity
        var random = SplitMix64()
        var attempt = 1
        while true {
            let endpointRequest: TokenEndpointRequest
            do {
                // A new assertion (new `jti`, `iat`) for every call, retries included: providers refuse a replayed one.
                let assertion = try credentials.signer.map {
                    try $0.assertion(
                        clientID: config.clientID ?? "", audience: config.tokenURL, now: Int64(clock.wall()))
                }
                endpointRequest = try TokenRequestBuilder.build(
                    config: config, refreshToken: stored.refreshToken, clientSecret: secret, clientAssertion: assertion)
            } catch let error as TokenRequestError where error == .missingRefreshToken {
                logger.error(
                    "no refresh token in the token store",
                    metadata: [
                        "upstream": .string(upstreamName), "entry": .string("\(config.keychainPrefix)/refresh_token"),
                    ])
                return failed(final: true, cause: "no-refresh-token", stored: stored)
            } catch {
                logger.error(
                    "token request cannot be made",
                    metadata: [
                        "upstream": .string(upstreamName), "problem": .string("\(error)"),
                    ])
                return failed(final: false, cause: "token-request-unusable", stored: stored)
            }
            let result = await fetcher.fetch(
                TransportRequest(
                    url: endpointRequest.url, method: endpointRequest.method,
                    headers: HeaderFields(endpointRequest.headers),
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
                guard case .success(let response) = result else {
                    return failed(final: false, cause: "token-endpoint-failed", stored: stored)
                }
                return accept(response.body, stored: stored)
            case .retry(let delay):
                var metadata = failureMetadata(result, url: endpointRequest.url)
                metadata["attempt"] = .stringConvertible(attempt)
                logger.warning("token endpoint failed; retrying", metadata: metadata)
                attempt += 1
                try? await Task.sleep(for: delay)
            case .giveUp(let final):
                var metadata = failureMetadata(result, url: endpointRequest.url)
                metadata["attempt"] = .stringConvertible(attempt)
                metadata["needs_new_grant"] = .stringConvertible(final)
                // The span's cause: the OAuth error code when the endpoint gave one (`invalid_grant`), else the
                // outcome (`status-503`, `connect-failure`).
                var cause = "token-endpoint-failed"
                if case .string(let outcome)? = metadata["outcome"] { cause = outcome }
                if case .success(let response) = result, let code = TokenResponseParser.oauthErrorCode(response.body) {
                    metadata["oauth_error"] = .string(code)
                    cause = code
                }
                if final {
                    // 400/401 from the token endpoint (invalid_grant, bad client credentials): retrying cannot help.
                    // A client_credentials grant has no refresh token to seed: its client's credentials are wrong.
                    metadata["fix"] = .string(
                        config.grant == .clientCredentials
                            ? "check the client's credentials (client_id, client_secret_entry, client_key_entry or the "
                                + "client certificate) with the token endpoint's operator"
                            : "store a new refresh token: backstop tokens seed \(upstreamName)")
                    logger.error(
                        "token refresh refused by the token endpoint; a new grant is needed", metadata: metadata)
                } else {
                    metadata["next_try"] = .string("on the next request after 5s")
                    logger.error("token refresh failed", metadata: metadata)
                }
                return failed(final: final, cause: cause, stored: stored)
            }
        }
    }

    private func accept(_ body: [UInt8], stored: StoredTokens) -> LockedDecision<Outcome> {
        let parsed: TokenResponse
        do {
            parsed = try TokenResponseParser.parse(body, fields: config.fields)
        } catch {
            logger.error(
                "token endpoint response unusable",
                metadata: [
                    "upstream": .string(upstreamName), "problem": .string("\(error)"),
                ])
            return failed(final: false, cause: "token-response-unusable", stored: stored)
        }
        let tokens = StoredTokens(
            accessToken: parsed.accessToken, refreshToken: parsed.refreshToken ?? stored.refreshToken,
            expiresAt: parsed.expiry(now: clock.wall()))
        // Stored before the lock is released, so before anyone uses them: a crash now must not lose a rotated
        // refresh token.
        return LockedDecision(result: .refreshed(tokens, previousRefreshToken: stored.refreshToken), store: tokens)
    }

    /// What a failed token endpoint call logs, as a failed upstream attempt does (docs/reference/operations.md#logs):
    /// the outcome (`status-400`, or the transport's `connect-failure`, `reset`, `timeout`), for a transport failure
    /// curl's error, the errno and the address tried, and the endpoint's URL without its query (which could carry a
    /// key). Never the request body: it holds the refresh token and the client secret.
    private func failureMetadata(_ result: Result<FetchedResponse, TransportFailure>, url: String) -> Logger.Metadata {
        var metadata: Logger.Metadata = [
            "upstream": .string(upstreamName), "url": .string(String(url.prefix { $0 != "?" })),
        ]
        switch result {
        case .success(let response):
            metadata["outcome"] = .string("status-\(response.head.status)")
        case .failure(let failure):
            metadata["outcome"] = .string(failure.label)
            metadata["reason"] = .string(failure.detail)
        }
        return metadata
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
