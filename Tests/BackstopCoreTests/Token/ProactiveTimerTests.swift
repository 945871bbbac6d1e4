import BackstopCore
import Testing

/// The proactive-refresh timer's decisions (`TokenState.proactiveTimer`), driven by a `ManualClock` the way
/// `TokenManager` drives them with the system clock (docs/reference/behaviour.md#oauth2).
@Suite("Proactive refresh timer")
struct ProactiveTimerTests {
    /// refresh_ahead 20 s (jitter up to 4 s, 0 with `ScriptedRandom(0)`), cooldown 5 s, idle after 600 s.
    static let configuration = TokenState.Configuration(refreshAhead: .seconds(20), failureCooldown: .seconds(5))

    /// A state holding a token that lives `lifetime` seconds from the clock's reading, jitter 0.
    static func state(clock: ManualClock, lifetime: Double?) -> (TokenState, ManagedToken) {
        var state = TokenState(configuration: configuration)
        var rng = ScriptedRandom(0)
        _ = state.tokenForRequest(now: clock.wall())
        let token = state.refreshSucceeded(
            token: "t", expiry: lifetime.map { clock.wall() + $0 }, now: clock.wall(), using: &rng)
        return (state, token)
    }

    @Test func aUsedUpstreamIsWokenAtItsProactivePointAndRefreshedThere() {
        let clock = ManualClock()
        let start = clock.wall()
        var (state, token) = Self.state(clock: clock, lifetime: 100)
        // The window starts at expiry − 20 s = start + 80.
        expectValue(state.proactiveTimer(now: clock.wall(), lastUsed: clock.wall()), .wake(at: start + 80))
        clock.advance(by: .seconds(79))
        expectValue(state.proactiveTimer(now: clock.wall(), lastUsed: start + 70), .wake(at: start + 80))
        clock.advance(by: .seconds(1))
        expectValue(state.proactiveTimer(now: clock.wall(), lastUsed: start + 70), .refreshNow)
        expectValue(state.startProactiveRefresh(now: clock.wall()), true)
        #expect(state.phase == .refreshing(token, stale: false))
        // While it runs there is nothing to schedule; its result re-arms the timer for the next token.
        expectValue(state.proactiveTimer(now: clock.wall(), lastUsed: start + 70), .stop)
        var rng = ScriptedRandom(0)
        clock.advance(by: .seconds(1))
        state.refreshSucceeded(token: "t2", expiry: clock.wall() + 100, now: clock.wall(), using: &rng)
        expectValue(state.proactiveTimer(now: clock.wall(), lastUsed: start + 70), .wake(at: start + 161))
    }

    @Test func anUpstreamUnusedFor10MinutesIsNotRefreshed() {
        let clock = ManualClock()
        let start = clock.wall()
        let (state, _) = Self.state(clock: clock, lifetime: 3600)
        // Never used: nothing to keep fresh.
        expectValue(state.proactiveTimer(now: clock.wall(), lastUsed: nil), .idle)
        // At the proactive point (start + 3580): used 599.999 s before → refresh; 600 s before → idle.
        clock.advance(by: .seconds(3580))
        expectValue(state.proactiveTimer(now: clock.wall(), lastUsed: clock.wall() - 599.999), .refreshNow)
        expectValue(state.proactiveTimer(now: clock.wall(), lastUsed: clock.wall() - 600), .idle)
        expectValue(state.proactiveTimer(now: clock.wall(), lastUsed: start), .idle)
        // Before the point, a recent use only schedules.
        let early = start + 100
        expectValue(state.proactiveTimer(now: early, lastUsed: early - 1), .wake(at: start + 3580))
    }

    @Test func idleAfterIsConfigurable() {
        var configuration = Self.configuration
        configuration.idleAfter = .seconds(30)
        #expect(TokenState.Configuration().idleAfter == .seconds(600))
        var state = TokenState(configuration: configuration)
        var rng = ScriptedRandom(0)
        state.refreshSucceeded(token: "t", expiry: 100, now: 0, using: &rng)
        expectValue(state.proactiveTimer(now: 80, lastUsed: 50.5), .refreshNow)
        expectValue(state.proactiveTimer(now: 80, lastUsed: 50), .idle)
    }

    @Test func nothingIsScheduledWithoutAProactivePoint() {
        let clock = ManualClock()
        let now = clock.wall()
        // No token, a fetch running, a token without expiry.
        var empty = TokenState(configuration: Self.configuration)
        expectValue(empty.proactiveTimer(now: now, lastUsed: now), .stop)
        _ = empty.tokenForRequest(now: now)
        expectValue(empty.proactiveTimer(now: now, lastUsed: now), .stop)
        let (forever, _) = Self.state(clock: clock, lifetime: nil)
        expectValue(forever.proactiveTimer(now: now, lastUsed: now), .stop)
        // After a final failure (a refused grant) no proactive refresh until a new token arrives.
        var (refused, _) = Self.state(clock: clock, lifetime: 100)
        clock.advance(by: .seconds(80))
        expectValue(refused.startProactiveRefresh(now: clock.wall()), true)
        refused.refreshFailed(final: true, now: clock.wall())
        expectValue(refused.proactiveTimer(now: clock.wall(), lastUsed: clock.wall()), .stop)
    }

    @Test func aFailedRefreshIsTriedAgainAfterTheCooldownWhileInUse() {
        let clock = ManualClock()
        var (state, _) = Self.state(clock: clock, lifetime: 100)
        clock.advance(by: .seconds(80))
        expectValue(state.startProactiveRefresh(now: clock.wall()), true)
        clock.advance(by: .seconds(2))
        state.refreshFailed(final: false, now: clock.wall())
        let failedAt = clock.wall()
        expectValue(state.proactiveTimer(now: clock.wall(), lastUsed: clock.wall()), .wake(at: failedAt + 5))
        clock.advance(by: .seconds(5))
        expectValue(state.proactiveTimer(now: clock.wall(), lastUsed: failedAt), .refreshNow)
    }

    /// The whole loop as `TokenManager` runs it, on a manual clock: tokens living 100 s, a request every 30 s for
    /// the first 5 minutes, then none. Refreshes happen at each proactive point (80 s into each token, the refresh
    /// taking 1 s) while the upstream was used in the last 10 minutes, and stop after that.
    @Test func aSessionRefreshesWhileUsedAndStopsWhenIdle() {
        let clock = ManualClock()
        let start = clock.wall()
        var (state, _) = Self.state(clock: clock, lifetime: 100)
        var rng = ScriptedRandom(0)
        var lastUsed: Double? = start
        var refreshes: [Double] = []
        var requests = stride(from: 30.0, through: 300, by: 30).map { start + $0 }
        var ended: ProactiveTimer?
        while ended == nil {
            switch state.proactiveTimer(now: clock.wall(), lastUsed: lastUsed) {
            case .refreshNow:
                expectValue(state.startProactiveRefresh(now: clock.wall()), true)
                refreshes.append(clock.wall() - start)
                clock.advance(by: .seconds(1))
                state.refreshSucceeded(token: "t", expiry: clock.wall() + 100, now: clock.wall(), using: &rng)
            case .wake(let at):
                // Requests before the wake-up are served from the valid token and recorded as uses.
                while let next = requests.first, next <= at {
                    requests.removeFirst()
                    lastUsed = next
                }
                clock.advance(by: .seconds(at - clock.wall()))
            case .idle, .stop:
                ended = state.proactiveTimer(now: clock.wall(), lastUsed: lastUsed)
            }
        }
        // Points at 80, then every 81 s (80 s into each token obtained 1 s after the previous point); the last use at
        // 300 keeps them going until 900 (exclusive).
        #expect(refreshes == [80, 161, 242, 323, 404, 485, 566, 647, 728, 809, 890])
        #expect(ended == .idle)
        #expect(clock.wall() - start == 971)
        // The next request starts it again: the timer then names the next point at once.
        expectValue(state.proactiveTimer(now: clock.wall(), lastUsed: clock.wall()), .refreshNow)
    }
}
