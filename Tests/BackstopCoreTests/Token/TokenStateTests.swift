import BackstopCore
import Testing

@Suite("TokenState")
struct TokenStateTests {
    /// refresh_ahead 60 s → jitter in [0, 12 s); cooldown 5 s.
    static let configuration = TokenState.Configuration(refreshAhead: .seconds(60), failureCooldown: .seconds(5))

    /// A state holding a valid token (generation 1) with the given expiry, obtained at `now`, jitter 0.
    static func validState(
        expiry: Double?, now: Double = 0, configuration: TokenState.Configuration = configuration
    )
        -> (TokenState, ManagedToken)
    {
        var state = TokenState(configuration: configuration)
        var rng = ScriptedRandom(0)
        expectValue(state.tokenForRequest(now: now), .startRefresh)
        let token = state.refreshSucceeded(token: "t1", expiry: expiry, now: now, using: &rng)
        return (state, token)
    }

    // MARK: Hold-down after a failure

    @Test func aKeychainChangeLiftsTheHoldDownAtOnce() {
        var state = TokenState(configuration: Self.configuration)
        expectValue(state.tokenForRequest(now: 0), .startRefresh)
        state.refreshFailed(final: true, now: 1)
        expectValue(state.tokenForRequest(now: 2), .fail)
        state.failureHoldDownLifted()
        #expect(state.lastFailure == nil)
        expectValue(state.tokenForRequest(now: 2), .startRefresh)
        // A stale token after a failed refresh: lifted, the next report may refresh at once.
        var (stale, token) = Self.validState(expiry: 3600)
        expectValue(stale.markStale(token: token, now: 10), .startRefresh)
        stale.refreshFailed(final: false, now: 11)
        expectValue(stale.tokenForRequest(now: 12), .fail)
        stale.failureHoldDownLifted()
        expectValue(stale.tokenForRequest(now: 12), .startRefresh)
        // Without a failure it changes nothing.
        var (valid, current) = Self.validState(expiry: 3600)
        valid.failureHoldDownLifted()
        expectValue(valid.tokenForRequest(now: 5), .use(current))
    }

    @Test("a wall clock stepped back after a failure ends the cooldown instead of stretching it by the step")
    func clockSteppedBackAfterAFailure() {
        var state = TokenState(configuration: Self.configuration)
        expectValue(state.tokenForRequest(now: 10_000), .startRefresh)
        state.refreshFailed(final: false, now: 10_000)
        expectValue(state.tokenForRequest(now: 10_004), .fail)
        // An hour back: 6 s of real time later the cooldown (5 s) has passed.
        expectValue(state.tokenForRequest(now: 10_000 - 3600 + 6), .startRefresh)
        // Forward, as ever: within the cooldown no refresh, after it one.
        var forward = TokenState(configuration: Self.configuration)
        expectValue(forward.tokenForRequest(now: 100), .startRefresh)
        forward.refreshFailed(final: false, now: 100)
        expectValue(forward.tokenForRequest(now: 100), .fail)
        expectValue(forward.tokenForRequest(now: 105), .startRefresh)
    }

    // MARK: First fetch and single flight

    @Test func firstRequestFetchesAndOthersWait() {
        var state = TokenState(configuration: Self.configuration)
        var rng = ScriptedRandom(0)
        #expect(state.phase == .missing)
        expectValue(state.tokenForRequest(now: 0), .startRefresh)
        #expect(state.phase == .fetching)
        #expect(state.isRefreshing)
        let actions = (0..<50).map { _ in state.tokenForRequest(now: 1) }
        #expect(actions.allSatisfy { $0 == .waitForRefresh })

        let token = state.refreshSucceeded(token: "t1", expiry: 3600, now: 2, using: &rng)
        #expect(token.value == "t1")
        #expect(token.generation == 1)
        #expect(token.expiry == 3600)
        #expect(state.phase == .valid(token))
        #expect(!state.isRefreshing)
        expectValue(state.tokenForRequest(now: 3), .use(token))
        #expect(state.currentToken == token)
    }

    @Test func manyStaleReportsStartExactlyOneRefresh() {
        var (state, t1) = Self.validState(expiry: nil)
        var rng = ScriptedRandom(0)
        let actions = (0..<20).map { _ in state.markStale(token: t1, now: 10) }
        #expect(actions.first == .startRefresh)
        #expect(actions.filter { $0 == .startRefresh }.count == 1)
        #expect(actions.dropFirst().allSatisfy { $0 == .waitForRefresh })
        #expect(state.phase == .refreshing(t1, stale: true))
        // New requests while the stale token is being replaced wait too; none gets the rejected token.
        expectValue(state.tokenForRequest(now: 11), .waitForRefresh)

        let t2 = state.refreshSucceeded(token: "t2", expiry: nil, now: 12, using: &rng)
        #expect(t2.generation == 2)
        // A request that was still in flight with t1 reports late: it is replayed with t2, no second refresh.
        expectValue(state.markStale(token: t1, now: 13), .use(t2))
        #expect(state.phase == .valid(t2))
        // The new token being rejected is a new event.
        expectValue(state.markStale(token: t2, now: 14), .startRefresh)
    }

    @Test func staleReportForOldTokenWaitsForARunningRefresh() {
        var (state, t1) = Self.validState(expiry: nil)
        var rng = ScriptedRandom(0)
        expectValue(state.markStale(token: t1, now: 1), .startRefresh)
        let t2 = state.refreshSucceeded(token: "t2", expiry: nil, now: 2, using: &rng)
        expectValue(state.markStale(token: t2, now: 3), .startRefresh)
        expectValue(state.markStale(token: t1, now: 4), .waitForRefresh)
        #expect(state.phase == .refreshing(t2, stale: true))
    }

    @Test func staleReportComparesGenerationNotValue() {
        var (state, t1) = Self.validState(expiry: nil)
        var rng = ScriptedRandom(0)
        expectValue(state.markStale(token: t1, now: 1), .startRefresh)
        // The endpoint hands back the same string: still a new generation, the old report stays old.
        let again = state.refreshSucceeded(token: "t1", expiry: nil, now: 2, using: &rng)
        #expect(again.generation == 2)
        expectValue(state.markStale(token: t1, now: 3), .use(again))
    }

    @Test func staleReportWithNoTokenAtAllFetches() {
        var state = TokenState(configuration: Self.configuration)
        let foreign = ManagedToken(value: "x", generation: 9, expiry: nil)
        expectValue(state.markStale(token: foreign, now: 0), .startRefresh)
        #expect(state.phase == .fetching)
        expectValue(state.markStale(token: foreign, now: 0), .waitForRefresh)
    }

    // MARK: Expiry

    @Test func expiredTokenIsNeverHandedOut() {
        let noAhead = TokenState.Configuration(refreshAhead: .zero, failureCooldown: .seconds(5))
        var (state, t1) = Self.validState(expiry: 1000, configuration: noAhead)
        expectValue(state.tokenForRequest(now: 999.999), .use(t1))
        expectValue(state.tokenForRequest(now: 1000), .startRefresh)
        #expect(state.phase == .fetching)
        #expect(state.currentToken == nil)
        expectValue(state.tokenForRequest(now: 1000), .waitForRefresh)
        #expect(t1.isExpired(now: 1000))
        #expect(!t1.isExpired(now: 999.999))
    }

    @Test func tokenWithoutExpiryNeverExpiresNorRefreshesProactively() {
        var (state, t1) = Self.validState(expiry: nil)
        expectValue(state.tokenForRequest(now: 1e12), .use(t1))
        #expect(!state.shouldRefreshProactively(now: 1e12))
        #expect(state.nextProactiveRefreshTime == nil)
        expectValue(state.startProactiveRefresh(now: 1e12), false)
    }

    @Test func tokenExpiringDuringProactiveRefreshIsNotUsed() {
        var (state, t1) = Self.validState(expiry: 3600)
        expectValue(state.startProactiveRefresh(now: 3550), true)
        expectValue(state.tokenForRequest(now: 3599), .use(t1))
        expectValue(state.tokenForRequest(now: 3600), .waitForRefresh)
        state.refreshFailed(final: false, now: 3601)
        #expect(state.phase == .failed)
        expectValue(state.tokenForRequest(now: 3602), .fail)
    }

    // MARK: Proactive refresh and jitter

    @Test(arguments: [
        (UInt64(0), 3540.0),  // jitter 0
        (ScriptedRandom.half, 3534.0),  // jitter 6 s: half of min(60/5, 30) = 12 s
        (UInt64(1) << 62, 3537.0),  // jitter 3 s
    ])
    func proactiveWindowStartsAtExpiryMinusAheadMinusJitter(word: UInt64, start: Double) {
        var state = TokenState(configuration: Self.configuration)
        var rng = ScriptedRandom(word)
        _ = state.tokenForRequest(now: 0)
        state.refreshSucceeded(token: "t1", expiry: 3600, now: 0, using: &rng)
        #expect(state.proactiveRefreshAt == start)
        #expect(state.nextProactiveRefreshTime == start)
        #expect(!state.shouldRefreshProactively(now: start.nextDown))
        #expect(state.shouldRefreshProactively(now: start))
    }

    @Test func jitterStaysWithinBoundsForAnyDraw() {
        var sweep = SplitMix64(seed: 42)
        var words = (0..<2000).map { _ in sweep.next() }
        words += [0, 1, UInt64.max, UInt64.max - 1, 1 << 63]
        var seen: Set<Int> = []
        for word in words {
            var state = TokenState(configuration: Self.configuration)
            var rng = ScriptedRandom(word)
            state.refreshSucceeded(token: "t", expiry: 3600, now: 0, using: &rng)
            let start = state.proactiveRefreshAt ?? -1
            // jitter in [0, 12] (the top of [0, 12) can round to 12 in `Double`): start in [3528, 3540]
            #expect(start >= 3528 && start <= 3540)
            seen.insert(Int(3540 - start))
        }
        // The draws spread over the whole range, not a corner of it.
        #expect(seen.isSuperset(of: 0..<12) && seen.isSubset(of: 0...12))
    }

    @Test(arguments: [
        (Duration.seconds(60), Duration.seconds(12)), (.seconds(150), .seconds(30)), (.seconds(300), .seconds(30)),
        (.zero, .zero), (.milliseconds(500), .milliseconds(100)),
    ])
    func maxJitterIsAFifthOfRefreshAheadCappedAt30s(ahead: Duration, jitter: Duration) {
        #expect(TokenState.Configuration(refreshAhead: ahead).maxJitter == jitter)
    }

    @Test func configurationFromOAuth2Config() {
        let config = OAuth2Config(tokenURL: "https://a/t", keychainPrefix: "p", refreshAhead: .seconds(90))
        let configuration = TokenState.Configuration(config, failureCooldown: .seconds(7))
        #expect(configuration.refreshAhead == .seconds(90))
        #expect(configuration.failureCooldown == .seconds(7))
        #expect(TokenState.Configuration().failureCooldown == .seconds(5))
    }

    @Test func jitterIsDrawnOncePerTokenWithExpiry() {
        var state = TokenState(configuration: Self.configuration)
        var rng = ScriptedRandom(ScriptedRandom.half)
        state.refreshSucceeded(token: "t1", expiry: 3600, now: 0, using: &rng)
        #expect(rng.draws == 1)
        for now in stride(from: 0.0, to: 3600, by: 100) {
            _ = state.shouldRefreshProactively(now: now)
            _ = state.nextProactiveRefreshTime
            _ = state.tokenForRequest(now: min(now, 3000))
        }
        #expect(rng.draws == 1)
        state.refreshSucceeded(token: "t2", expiry: nil, now: 0, using: &rng)
        #expect(rng.draws == 1)
        state.loaded(token: "t3", expiry: 7200, now: 0, using: &rng)
        #expect(rng.draws == 2)
    }

    @Test func shortLivedTokenIsNotRefreshedImmediately() {
        var state = TokenState(configuration: Self.configuration)
        var rng = ScriptedRandom(UInt64.max)
        // expires_in 30 s < refresh_ahead 60 s: the window would start in the past; it starts halfway instead.
        state.refreshSucceeded(token: "t1", expiry: 1030, now: 1000, using: &rng)
        #expect(state.proactiveRefreshAt == 1015)
        #expect(!state.shouldRefreshProactively(now: 1000))
        #expect(state.shouldRefreshProactively(now: 1015))
    }

    @Test("a token living less than 2 s is refreshed proactively no sooner than 1 s after it arrived")
    func subSecondTokenIsNotRefreshedInALoop() {
        var rng = ScriptedRandom(UInt64.max)
        for (lifetime, expected) in [(0.4, 1001.0), (1.0, 1001), (2.0, 1001), (3.0, 1001.5)] {
            var state = TokenState(configuration: Self.configuration)
            state.refreshSucceeded(token: "t", expiry: 1000 + lifetime, now: 1000, using: &rng)
            #expect(state.proactiveRefreshAt == expected, "lifetime \(lifetime)")
        }
    }

    @Test func requestInWindowUsesTokenAndStartsOneBackgroundRefresh() {
        var (state, t1) = Self.validState(expiry: 3600)
        var rng = ScriptedRandom(0)
        expectValue(state.tokenForRequest(now: 3539), .use(t1))
        expectValue(state.tokenForRequest(now: 3540), .useAndStartRefresh(t1))
        #expect(state.phase == .refreshing(t1, stale: false))
        let later = (0..<10).map { _ in state.tokenForRequest(now: 3541) }
        #expect(later.allSatisfy { $0 == .use(t1) })
        #expect(!state.shouldRefreshProactively(now: 3541))
        expectValue(state.startProactiveRefresh(now: 3541), false)
        let t2 = state.refreshSucceeded(token: "t2", expiry: 7200, now: 3542, using: &rng)
        expectValue(state.tokenForRequest(now: 3543), .use(t2))
    }

    @Test func timerDrivenProactiveRefresh() {
        var (state, t1) = Self.validState(expiry: 3600)
        expectValue(state.startProactiveRefresh(now: 3539), false)
        #expect(state.phase == .valid(t1))
        expectValue(state.startProactiveRefresh(now: 3540), true)
        #expect(state.phase == .refreshing(t1, stale: false))
        #expect(state.nextProactiveRefreshTime == nil)
    }

    @Test func staleReportDuringProactiveRefreshJoinsIt() {
        var (state, t1) = Self.validState(expiry: 3600)
        expectValue(state.tokenForRequest(now: 3540), .useAndStartRefresh(t1))
        expectValue(state.markStale(token: t1, now: 3541), .waitForRefresh)
        #expect(state.phase == .refreshing(t1, stale: true))
        expectValue(state.tokenForRequest(now: 3542), .waitForRefresh)
    }

    @Test func failedProactiveRefreshKeepsTheTokenAndWaitsOutTheCooldown() {
        var (state, t1) = Self.validState(expiry: 3600)
        expectValue(state.startProactiveRefresh(now: 3540), true)
        state.refreshFailed(final: false, now: 3541)
        #expect(state.phase == .valid(t1))
        #expect(state.lastFailure == TokenState.Failure(at: 3541, final: false))
        #expect(state.nextProactiveRefreshTime == 3546)
        expectValue(state.tokenForRequest(now: 3545.9), .use(t1))
        #expect(!state.shouldRefreshProactively(now: 3545.9))
        expectValue(state.tokenForRequest(now: 3546), .useAndStartRefresh(t1))
    }

    @Test("a failed refresh's cooldown past the expiry never lets the token be handed out after it expired")
    func handOutNeverPastExpiry() {
        var (state, t1) = Self.validState(expiry: 3600)
        #expect(state.handOutUntil == 3540, "until the proactive refresh")
        expectValue(state.startProactiveRefresh(now: 3540), true)
        #expect(state.handOutUntil == nil, "refreshing: ask the state")
        state.refreshFailed(final: false, now: 3597)
        #expect(state.nextProactiveRefreshTime == 3602, "the cooldown ends after the expiry")
        #expect(state.handOutUntil == 3600, "before the fix: 3602, an expired token sent for 2 s")
        expectValue(state.tokenForRequest(now: 3599.9), .use(t1))
        #expect(state.tokenForRequest(now: 3600) != .use(t1), "expired: never handed out")
    }

    @Test func finalProactiveFailureStopsProactiveRefreshesUntilExpiry() {
        var (state, t1) = Self.validState(expiry: 3600)
        expectValue(state.startProactiveRefresh(now: 3540), true)
        state.refreshFailed(final: true, now: 3541)
        #expect(state.phase == .valid(t1))
        #expect(state.nextProactiveRefreshTime == nil)
        #expect(!state.shouldRefreshProactively(now: 3599))
        expectValue(state.tokenForRequest(now: 3599), .use(t1))
        // At expiry a request needs a token: it tries again (the cooldown is long over).
        expectValue(state.tokenForRequest(now: 3600), .startRefresh)
        #expect(state.phase == .fetching)
    }

    // MARK: Failures and cooldown

    @Test(arguments: [false, true])
    func failedFetchCoolsDown(final: Bool) {
        var state = TokenState(configuration: Self.configuration)
        var rng = ScriptedRandom(0)
        expectValue(state.tokenForRequest(now: 100), .startRefresh)
        expectValue(state.tokenForRequest(now: 100), .waitForRefresh)
        state.refreshFailed(final: final, now: 100)
        #expect(state.phase == .failed)
        #expect(state.lastFailure == TokenState.Failure(at: 100, final: final))
        expectValue(state.tokenForRequest(now: 100), .fail)
        expectValue(state.tokenForRequest(now: 104.999), .fail)
        expectValue(state.tokenForRequest(now: 105), .startRefresh)
        expectValue(state.tokenForRequest(now: 105), .waitForRefresh)
        state.refreshFailed(final: final, now: 106)
        expectValue(state.tokenForRequest(now: 110.5), .fail)
        expectValue(state.tokenForRequest(now: 111), .startRefresh)
        let token = state.refreshSucceeded(token: "t", expiry: nil, now: 112, using: &rng)
        #expect(state.lastFailure == nil)
        expectValue(state.tokenForRequest(now: 112), .use(token))
    }

    @Test func failedStaleRefreshLeavesTheTokenStale() {
        var (state, t1) = Self.validState(expiry: nil)
        expectValue(state.markStale(token: t1, now: 10), .startRefresh)
        state.refreshFailed(final: true, now: 11)
        #expect(state.phase == .stale(t1))
        expectValue(state.tokenForRequest(now: 12), .fail)
        expectValue(state.markStale(token: t1, now: 12), .fail)
        expectValue(state.tokenForRequest(now: 16), .startRefresh)
        #expect(state.phase == .refreshing(t1, stale: true))
        expectValue(state.markStale(token: t1, now: 16), .waitForRefresh)
    }

    @Test func staleReportWithinCooldownFailsWithoutRefreshing() {
        var (state, t1) = Self.validState(expiry: 3600)
        expectValue(state.startProactiveRefresh(now: 3540), true)
        state.refreshFailed(final: false, now: 3541)
        expectValue(state.markStale(token: t1, now: 3542), .fail)
        #expect(state.phase == .stale(t1))
        expectValue(state.tokenForRequest(now: 3543), .fail)
        expectValue(state.tokenForRequest(now: 3546), .startRefresh)
        #expect(state.phase == .refreshing(t1, stale: true))
    }

    @Test func expiredTokenWithinCooldownFails() {
        var (state, t1) = Self.validState(expiry: 3600)
        expectValue(state.startProactiveRefresh(now: 3598), true)
        state.refreshFailed(final: false, now: 3599)
        #expect(state.phase == .valid(t1))
        expectValue(state.tokenForRequest(now: 3600), .fail)
        #expect(state.phase == .failed)
        expectValue(state.tokenForRequest(now: 3604), .startRefresh)
    }

    @Test func refreshFailedWithoutARefreshOnlyRecordsTheFailure() {
        var (state, t1) = Self.validState(expiry: nil)
        state.refreshFailed(final: false, now: 1)
        #expect(state.phase == .valid(t1))
        expectValue(state.tokenForRequest(now: 2), .use(t1))
    }

    // MARK: Loading from the keychain

    @Test func loadedTokenBecomesValid() {
        var state = TokenState(configuration: Self.configuration)
        var rng = ScriptedRandom(0)
        let token = state.loaded(token: "k", expiry: 3600, now: 0, using: &rng)
        #expect(token?.value == "k")
        #expect(token?.generation == 1)
        #expect(state.phase == token.map(TokenState.Phase.valid))
        expectValue(state.tokenForRequest(now: 1), token.map(TokenAction.use))
        #expect(state.proactiveRefreshAt == 3540)
    }

    @Test func expiredOrEmptyLoadedTokenIsIgnored() {
        var state = TokenState(configuration: Self.configuration)
        var rng = ScriptedRandom(0)
        expectValue(state.loaded(token: "k", expiry: 100, now: 100, using: &rng), nil)
        expectValue(state.loaded(token: "", expiry: nil, now: 0, using: &rng), nil)
        #expect(state.phase == .missing)
        #expect(rng.draws == 0)
        expectValue(state.tokenForRequest(now: 100), .startRefresh)
    }

    @Test func loadWhileRefreshingIsIgnored() {
        var state = TokenState(configuration: Self.configuration)
        var rng = ScriptedRandom(0)
        _ = state.tokenForRequest(now: 0)
        expectValue(state.loaded(token: "k", expiry: nil, now: 0, using: &rng), nil)
        #expect(state.phase == .fetching)
    }

    @Test func loadAfterFailureClearsTheCooldown() {
        var state = TokenState(configuration: Self.configuration)
        var rng = ScriptedRandom(0)
        _ = state.tokenForRequest(now: 0)
        state.refreshFailed(final: true, now: 0)
        let token = state.loaded(token: "fixed-by-a-human", expiry: nil, now: 1, using: &rng)
        #expect(token != nil)
        #expect(state.lastFailure == nil)
        expectValue(state.tokenForRequest(now: 1), token.map(TokenAction.use))
    }

    @Test func generationsIncreaseAcrossRefreshesAndLoads() {
        var state = TokenState(configuration: Self.configuration)
        var rng = ScriptedRandom(0)
        let a = state.loaded(token: "a", expiry: nil, now: 0, using: &rng)
        let b = state.refreshSucceeded(token: "b", expiry: nil, now: 0, using: &rng)
        let c = state.loaded(token: "c", expiry: nil, now: 0, using: &rng)
        #expect([a?.generation, b.generation, c?.generation] == [1, 2, 3])
    }

    @Test func tokenDescriptionsHideTheSecret() {
        let token = ManagedToken(value: "SECRET", generation: 4, expiry: 10)
        for text in [String(describing: token), String(reflecting: token), tokenDumped(token), "\(token)"] {
            #expect(!text.contains("SECRET"))
        }
        #expect(String(describing: token) == "token#4(expiry: 10.0)")
        var state = TokenState(configuration: Self.configuration)
        var rng = ScriptedRandom(0)
        state.loaded(token: "SECRET", expiry: nil, now: 0, using: &rng)
        #expect(!String(describing: state).contains("SECRET"))
        #expect(!tokenDumped(state).contains("SECRET"))
        #expect(!String(describing: TokenAction.use(token)).contains("SECRET"))
    }
}
