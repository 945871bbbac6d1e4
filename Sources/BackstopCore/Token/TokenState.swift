/// The lifecycle of one upstream's access token as a pure value state machine: the owner (an actor) calls a
/// `mutating` method for each event and performs the returned action. No I/O, no clock, no randomness of its own:
/// instants are wall-clock seconds since the Unix epoch passed as `now`, and jitter comes from the injected
/// generator.
///
/// Phases and transitions ("request" is `tokenForRequest`, "cooldown" means a refresh failed less than
/// `failureCooldown` ago):
///
///     from                    event                                      to                          action
///     missing, failed         request                                    fetching                    startRefresh
///     failed                  request, in cooldown                       failed                      fail
///     fetching                request                                    fetching                    waitForRefresh
///     valid(t)                request                                    valid(t)                    use(t)
///     valid(t)                request, proactive window                  refreshing(t, stale: false) useAndStart…
///     valid(t)                startProactiveRefresh, window              refreshing(t, stale: false) (true)
///     valid(t)                request, t expired                         fetching (failed: cooldown) startRefresh
///     valid(t)                markStale(t)                               refreshing(t, stale: true)  startRefresh
///     valid(t)                markStale(t), in cooldown                  stale(t)                    fail
///     refreshing(t, false)    request, t unexpired                       unchanged                   use(t)
///     refreshing(t, false)    markStale(t)                               refreshing(t, stale: true)  waitForRefresh
///     refreshing(t, true)     request                                    unchanged                   waitForRefresh
///     stale(t)                request or markStale(t), cooldown over     refreshing(t, stale: true)  startRefresh
///     any                     markStale(older generation)                as for a request
///     any                     refreshSucceeded(t')                       valid(t')
///     fetching                refreshFailed                              failed
///     refreshing(t, false)    refreshFailed                              valid(t), or failed if expired
///     refreshing(t, true)     refreshFailed                              stale(t)
///     no refresh running      loaded(t'), unexpired                      valid(t')
///
/// - `missing`: no token and no refresh; the next request starts a fetch.
/// - `fetching`: a refresh is running and there is no token to use; requests wait.
/// - `valid(t)`: `t` is handed out until its expiry. A request at or after expiry never gets it: it starts a
///   fetch (or waits, or fails within the cooldown). In the proactive window a request gets
///   `.useAndStartRefresh(t)`; a timer-driven owner can use `startProactiveRefresh(now:)` instead.
/// - `refreshing(t, stale: false)`: a proactive refresh is running; requests keep using `t` until it expires.
/// - `refreshing(t, stale: true)`: the upstream rejected `t`; requests wait for the refresh.
/// - `stale(t)`: the upstream rejected `t` and no refresh is running, because one failed less than
///   `failureCooldown` ago; requests fail until the cooldown ends, then the next one starts a refresh.
/// - `failed`: a refresh failed and there is no token; same cooldown rule.
///
/// Single flight: `markStale(token:now:)` acts only when `token` is the current token. A report about an older
/// generation (its refresh already happened) never starts another refresh: the request is replayed with the
/// current token, or waits for the refresh that is running.
///
/// Failures: after `refreshFailed`, no refresh starts before `failureCooldown` has passed, whichever event asks
/// for it; nothing retries on its own (the token endpoint retry policy handles retries within one refresh). After
/// a final failure (400/401, e.g. `invalid_grant`) proactive refreshes stop until a new token arrives, since
/// only a human can fix the grant; a request that actually needs a token still tries again after the cooldown,
/// which picks up a fix made in the keychain.
///
/// Proactive refresh: for a token with an expiry, at `expiry − refreshAhead − jitter`, where jitter is drawn once
/// per token, uniformly from [0, min(refreshAhead / 5, 30 s)], so a fleet does not refresh in lockstep. The point
/// is never earlier than halfway through the token's remaining lifetime when it was obtained: otherwise a token
/// that lives shorter than `refreshAhead` would be refreshed again immediately, forever. Nor is it sooner than
/// `minimumProactiveInterval` after that: a token endpoint handing out tokens that live a fraction of a second
/// gets at most one proactive call a second (requests that find such a token expired refresh it as usual).
///
/// The owner runs a timer for it (`proactiveTimer(now:lastUsed:)`), so the first request after the point does not
/// pay for the refresh; but only while the upstream is in use: once it has not been used for `idleAfter`
/// (10 minutes), the timer stops, and the next request starts it again (docs/reference/behaviour.md#oauth2).
///
///     proactiveTimer(now, lastUsed)                              answer
///     no proactive point (no token, no expiry, refreshing,       stop
///       after a final failure)
///     never used, or lastUsed ≤ now − idleAfter                  idle
///     now < point                                                wake(at: point)
///     now ≥ point                                                refreshNow
public struct TokenState: Sendable {
    /// Tunables.
    public struct Configuration: Sendable, Equatable {
        public var refreshAhead: Duration
        /// Minimum time between a failed refresh and the next one.
        public var failureCooldown: Duration
        /// How long after its last use an upstream still gets timer-driven proactive refreshes.
        public var idleAfter: Duration

        public init(
            refreshAhead: Duration = .seconds(60), failureCooldown: Duration = .seconds(5),
            idleAfter: Duration = .seconds(600)
        ) {
            self.refreshAhead = refreshAhead
            self.failureCooldown = failureCooldown
            self.idleAfter = idleAfter
        }

        public init(_ config: OAuth2Config, failureCooldown: Duration = .seconds(5)) {
            self.init(refreshAhead: config.refreshAhead, failureCooldown: failureCooldown)
        }

        /// The upper bound of the per-token jitter: min(refreshAhead / 5, 30 s).
        public var maxJitter: Duration { min(refreshAhead / 5, .seconds(30)) }
    }

    /// Where the lifecycle is; see the type's documentation.
    public enum Phase: Sendable, Equatable {
        case missing
        case fetching
        case valid(ManagedToken)
        case refreshing(ManagedToken, stale: Bool)
        case stale(ManagedToken)
        case failed
    }

    /// The last failed refresh, cleared by any new token.
    public struct Failure: Sendable, Equatable {
        public var at: Double
        public var final: Bool

        public init(at: Double, final: Bool) {
            self.at = at
            self.final = final
        }
    }

    public let configuration: Configuration
    public private(set) var phase: Phase = .missing
    public private(set) var lastFailure: Failure?
    /// When the current token enters its proactive window (nil when it has no expiry).
    public private(set) var proactiveRefreshAt: Double?

    /// The least time from a token's arrival to its proactive refresh.
    public static let minimumProactiveInterval: Duration = .seconds(1)
    private var lastGeneration: UInt64 = 0

    public init(configuration: Configuration = Configuration()) {
        self.configuration = configuration
    }

    /// The token the state holds (usable or not), for comparisons and diagnostics.
    public var currentToken: ManagedToken? {
        switch phase {
        case .valid(let token), .refreshing(let token, _), .stale(let token): token
        case .missing, .fetching, .failed: nil
        }
    }

    /// Whether a refresh is running (the owner has a refresh in flight whose result it must report).
    public var isRefreshing: Bool {
        switch phase {
        case .fetching, .refreshing: true
        case .missing, .valid, .stale, .failed: false
        }
    }

    // MARK: Requests

    /// A request needs a token.
    public mutating func tokenForRequest(now: Double) -> TokenAction {
        switch phase {
        case .missing, .failed:
            return beginFetch(now: now)
        case .fetching:
            return .waitForRefresh
        case .valid(let token):
            if token.isExpired(now: now) { return beginFetch(now: now) }
            if shouldRefreshProactively(now: now) {
                phase = .refreshing(token, stale: false)
                return .useAndStartRefresh(token)
            }
            return .use(token)
        case .refreshing(let token, let stale):
            return stale || token.isExpired(now: now) ? .waitForRefresh : .use(token)
        case .stale(let token):
            guard refreshAllowed(now: now) else { return .fail }
            phase = .refreshing(token, stale: true)
            return .startRefresh
        }
    }

    /// A response whose status is in `refresh_on` came back for a request sent with `token`.
    ///
    /// Only the current token can be marked; for an older one the answer is what a new request would get.
    public mutating func markStale(token: ManagedToken, now: Double) -> TokenAction {
        guard let current = currentToken, current.generation == token.generation else {
            return tokenForRequest(now: now)
        }
        switch phase {
        case .valid:
            guard refreshAllowed(now: now) else {
                phase = .stale(current)
                return .fail
            }
            phase = .refreshing(current, stale: true)
            return .startRefresh
        case .refreshing:
            phase = .refreshing(current, stale: true)
            return .waitForRefresh
        case .stale, .missing, .fetching, .failed:
            return tokenForRequest(now: now)
        }
    }

    // MARK: Refresh results

    /// A refresh produced a token (from the token endpoint, or found in the keychain where another process had
    /// already refreshed). Returns the new token for the waiters. `expiry` is absolute; see `TokenResponse.expiry`.
    @discardableResult
    public mutating func refreshSucceeded(
        token value: String, expiry: Double?, now: Double, using rng: inout some RandomNumberGenerator
    ) -> ManagedToken {
        install(value: value, expiry: expiry, now: now, using: &rng)
    }

    /// The running refresh failed. `final`: the token endpoint answered 400/401 (e.g. `invalid_grant`), or no
    /// refresh token exists; such a failure also stops proactive refreshes until a new token arrives.
    /// The owner fails all waiters; whoever asks next gets `.fail` until the cooldown has passed.
    public mutating func refreshFailed(final: Bool, now: Double) {
        lastFailure = Failure(at: now, final: final)
        switch phase {
        case .fetching:
            phase = .failed
        case .refreshing(let token, let stale):
            if stale {
                phase = .stale(token)
            } else {
                phase = token.isExpired(now: now) ? .failed : .valid(token)
            }
        case .missing, .valid, .stale, .failed:
            break
        }
    }

    /// A token read from the keychain (at startup, or because it changed on disk). Ignored while a refresh is
    /// running (its result wins), when empty, or when already expired (the state stays as it was, so the next
    /// request fetches). Returns the installed token.
    @discardableResult
    public mutating func loaded(
        token value: String, expiry: Double?, now: Double, using rng: inout some RandomNumberGenerator
    ) -> ManagedToken? {
        guard !isRefreshing, !value.isEmpty else { return nil }
        if let expiry, now >= expiry { return nil }
        return install(value: value, expiry: expiry, now: now, using: &rng)
    }

    /// The keychain changed since the last failed refresh (an operator stored a new refresh token): the failure
    /// hold-down ends at once, so the next request tries the new grant instead of waiting for the cooldown.
    public mutating func failureHoldDownLifted() {
        guard lastFailure != nil else { return }
        lastFailure = nil
        if case .failed = phase { phase = .missing }
    }

    // MARK: Proactive refresh

    /// Whether the valid token is in its proactive window and a refresh may start now.
    public func shouldRefreshProactively(now: Double) -> Bool {
        guard case .valid = phase, let at = nextProactiveRefreshTime else { return false }
        return now >= at
    }

    /// When `shouldRefreshProactively` becomes true (for an owner that schedules a timer); nil when it never will
    /// for the current token (no token, no expiry, a refresh running, or after a final failure).
    public var nextProactiveRefreshTime: Double? {
        guard case .valid = phase, let at = proactiveRefreshAt else { return nil }
        guard let lastFailure else { return at }
        if lastFailure.final { return nil }
        return max(at, lastFailure.at + configuration.failureCooldown.seconds)
    }

    /// Until when (wall-clock seconds, exclusive) the current token may be handed out without asking the state: its
    /// proactive refresh time, and never past its expiry, which a failed refresh's cooldown can outlast (an expired
    /// token is never sent: docs/reference/behaviour.md#oauth2). Nil when no token is to be handed out so.
    public var handOutUntil: Double? {
        guard case .valid(let token) = phase else { return nil }
        return min(nextProactiveRefreshTime ?? .infinity, token.expiry ?? .infinity)
    }

    /// What the owner's proactive-refresh timer does next; see the type's documentation. `lastUsed` is when a
    /// request last took the token (wall-clock seconds; nil: never).
    public func proactiveTimer(now: Double, lastUsed: Double?) -> ProactiveTimer {
        guard let at = nextProactiveRefreshTime else { return .stop }
        guard let lastUsed, now - lastUsed < configuration.idleAfter.seconds else { return .idle }
        return now >= at ? .refreshNow : .wake(at: at)
    }

    /// Starts a proactive refresh if one is due: the state becomes `refreshing(t, stale: false)` and the owner
    /// must run the refresh. Returns false (and changes nothing) otherwise.
    public mutating func startProactiveRefresh(now: Double) -> Bool {
        guard case .valid(let token) = phase, shouldRefreshProactively(now: now) else { return false }
        phase = .refreshing(token, stale: false)
        return true
    }

    // MARK: Internals

    private func refreshAllowed(now: Double) -> Bool {
        guard let lastFailure else { return true }
        // A wall clock stepped back past the failure (NTP, a resumed VM) cannot measure the cooldown: it is over,
        // rather than stretched by the size of the step.
        return now >= lastFailure.at + configuration.failureCooldown.seconds || now < lastFailure.at
    }

    private mutating func beginFetch(now: Double) -> TokenAction {
        guard refreshAllowed(now: now) else {
            phase = .failed
            return .fail
        }
        phase = .fetching
        return .startRefresh
    }

    private mutating func install(
        value: String, expiry: Double?, now: Double, using rng: inout some RandomNumberGenerator
    ) -> ManagedToken {
        lastGeneration &+= 1
        let token = ManagedToken(value: value, generation: lastGeneration, expiry: expiry)
        phase = .valid(token)
        lastFailure = nil
        if let expiry {
            let jitter = unitInterval(&rng) * configuration.maxJitter.seconds
            let windowStart = expiry - configuration.refreshAhead.seconds - jitter
            proactiveRefreshAt = max(
                windowStart, now + max(expiry - now, 0) / 2, now + Self.minimumProactiveInterval.seconds)
        } else {
            proactiveRefreshAt = nil
        }
        return token
    }
}

/// What a token owner's proactive-refresh timer does next (`TokenState.proactiveTimer(now:lastUsed:)`).
public enum ProactiveTimer: Sendable, Equatable {
    /// The token is due: start the refresh now (`startProactiveRefresh(now:)`).
    case refreshNow
    /// Ask again at this instant (wall-clock seconds since the epoch).
    case wake(at: Double)
    /// The upstream has not been used for `idleAfter`: no timer; ask again when a request comes.
    case idle
    /// Nothing to schedule until the state changes (a new token, a refresh ending, a failure).
    case stop
}
