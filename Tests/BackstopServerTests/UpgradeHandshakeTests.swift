import BackstopCore
import BackstopTransport
import Testing

@testable import BackstopServer

/// Every way an upgrade handshake ends, driven by hand: time is a `Duration` the test moves, randomness scripted.
@Suite("Upgrade handshake")
struct UpgradeHandshakeTests {
    typealias Machine = UpgradeHandshake
    static let t0 = Duration.seconds(100)
    static let timeouts = Timeouts(connect: .seconds(1), perTry: .seconds(2), total: .seconds(10), idle: .seconds(5))

    static let key = Machine.Credential.value("static-key")
    static let token1 = ManagedToken(value: "t1", generation: 1, expiry: nil)
    static let token2 = ManagedToken(value: "t2", generation: 2, expiry: nil)

    /// Retries 503, resets, timeouts and connect failures, three attempts, 100 ms constant backoff; `credential` as
    /// the upstream's `auth` makes it.
    static func machine(
        attempts: Int = 3, retryable: Bool = true, budget: BudgetConfig? = nil,
        credential: ExchangeStateMachine.CredentialKind = .staticValue
    ) -> Machine {
        let retry = RetryConfig(
            attempts: attempts,
            backoff: BackoffConfig(strategy: .constant, base: .milliseconds(100), max: .seconds(1), jitter: .none))
        return Machine(
            policy: retryable ? RetryPolicy(config: retry, timeouts: timeouts) : nil,
            budget: retryable ? SharedRetryBudget(budget ?? BudgetConfig(ratio: 1, minPerSecond: 100)) : nil,
            timeouts: timeouts, credentialKind: credential, now: t0)
    }

    var random = ScriptedRandom(ScriptedRandom.half)

    @Test mutating func aCredentialStartsTheFirstAttemptAnd101SwitchesWithoutRetry() {
        var m = Self.machine()
        #expect(m.credentialAcquired(Self.key, now: Self.t0) == .attempt(number: 1, credential: Self.key))
        #expect(m.deadline == Self.t0 + .seconds(2))
        #expect(
            m.responseHead(status: 101, retryAfter: nil, rateLimitReset: nil, now: Self.t0, wall: 0, random: &random)
                == .switchProtocols(attempts: 1))
        #expect(m.state == .ended)
        #expect(m.deadline == nil)
        // Nothing after the switch is an attempt's event any more.
        #expect(m.attemptFailed(.reset(detail: "x"), now: Self.t0, wall: 0, random: &random) == .none)
    }

    @Test func noCredentialIsTokenUnavailableWithoutAnAttempt() {
        var m = Self.machine()
        #expect(m.credentialAcquired(nil, now: Self.t0) == .failLocally(.tokenUnavailable, attempts: 0))
        #expect(m.credentialAcquired(Self.key, now: Self.t0) == .none)
    }

    @Test mutating func a503IsRetriedAfterTheBackoffThenAnotherStatusIsRelayed() {
        var m = Self.machine()
        _ = m.credentialAcquired(Self.key, now: Self.t0)
        #expect(
            m.responseHead(status: 503, retryAfter: nil, rateLimitReset: nil, now: Self.t0, wall: 0, random: &random)
                == .retry(after: .milliseconds(100), reason: .status(503)))
        #expect(m.deadline == Self.t0 + .milliseconds(100))
        #expect(m.timerFired(now: Self.t0 + .milliseconds(99), wall: 0, random: &random) == .none)
        #expect(
            m.timerFired(now: Self.t0 + .milliseconds(100), wall: 0, random: &random)
                == .attempt(number: 2, credential: Self.key))
        #expect(
            m.responseHead(status: 403, retryAfter: nil, rateLimitReset: nil, now: Self.t0, wall: 0, random: &random)
                == .relayResponse(attempts: 2))
        #expect(m.retryReasons == [.status(503)])
    }

    @Test mutating func failuresAreRetriedUntilTheAttemptsAreSpentThenAnsweredLocally() {
        var m = Self.machine(attempts: 2)
        _ = m.credentialAcquired(Self.key, now: Self.t0)
        #expect(
            m.attemptFailed(.connectFailure(detail: "refused"), now: Self.t0, wall: 0, random: &random)
                == .retry(
                    after: .milliseconds(100), reason: .connectFailure, failed: .connectFailure(detail: "refused")))
        _ = m.timerFired(now: Self.t0 + .seconds(1), wall: 0, random: &random)
        #expect(
            m.attemptFailed(.connectFailure(detail: "refused"), now: Self.t0 + .seconds(1), wall: 0, random: &random)
                == .failLocally(.upstreamUnreachable, attempts: 2, failed: .connectFailure(detail: "refused")))
        #expect(m.lastFailure == .connectFailure(detail: "refused"))
    }

    @Test mutating func theAttemptDeadlineIsATimeoutAndTheTotalBoundsIt() {
        var m = Self.machine(attempts: 1)
        _ = m.credentialAcquired(Self.key, now: Self.t0)
        #expect(m.timerFired(now: Self.t0 + .seconds(1), wall: 0, random: &random) == .none)
        #expect(
            m.timerFired(now: Self.t0 + .seconds(2), wall: 0, random: &random)
                == .failLocally(
                    .upstreamTimeout, attempts: 1,
                    failed: .timeout(detail: "no response head within the attempt's deadline")))
        // An attempt starting late gets only what `total` leaves.
        var late = Self.machine()
        _ = late.attemptFailed(.reset(detail: ""), now: Self.t0, wall: 0, random: &random)
        _ = late.credentialAcquired(Self.key, now: Self.t0 + .seconds(9))
        #expect(late.deadline == Self.t0 + .seconds(10))
    }

    @Test mutating func whatIsNeverRetriedMapsToItsLocalError() {
        let cases: [(TransportFailure, ProxyErrorReason)] = [
            (.tlsVerificationFailed(detail: ""), .upstreamUnreachable),
            (.loopDetected(detail: ""), .loopDetected),
            (.destinationDenied(detail: ""), .destinationDenied),
            (.cancelled, .upstreamUnreachable),
        ]
        for (failure, reason) in cases {
            var m = Self.machine()
            _ = m.credentialAcquired(Self.key, now: Self.t0)
            #expect(
                m.attemptFailed(failure, now: Self.t0, wall: 0, random: &random)
                    == .failLocally(reason, attempts: 1, failed: failure))
        }
        var bad = Self.machine(retryable: false)
        _ = bad.credentialAcquired(Self.key, now: Self.t0)
        #expect(
            bad.attemptFailed(.badResponse(detail: ""), now: Self.t0, wall: 0, random: &random)
                == .failLocally(.badUpstreamResponse, attempts: 1, failed: .badResponse(detail: "")))
    }

    @Test mutating func anExhaustedBudgetStopsRetries() {
        var m = Self.machine(budget: BudgetConfig(ratio: 0, minPerSecond: 0))
        _ = m.credentialAcquired(Self.key, now: Self.t0)
        #expect(
            m.responseHead(status: 503, retryAfter: nil, rateLimitReset: nil, now: Self.t0, wall: 0, random: &random)
                == .relayResponse(attempts: 1))
    }

    /// Answers attempt-in-hand's head with `status` at `now`.
    mutating func head(_ m: inout Machine, _ status: Int, at now: Duration = t0) -> Machine.Action {
        m.responseHead(status: status, retryAfter: nil, rateLimitReset: nil, now: now, wall: 0, random: &random)
    }

    @Test mutating func a401RefreshesTheTokenOnceAndReplaysTheHandshakeWithTheNewOne() {
        var m = Self.machine(credential: .oauth2(refreshOn: [401]))
        #expect(
            m.credentialAcquired(.token(Self.token1), now: Self.t0)
                == .attempt(number: 1, credential: .token(Self.token1)))
        #expect(head(&m, 401, at: Self.t0 + .milliseconds(10)) == .refreshCredential(rejected: Self.token1))
        // The refused answer is held at most until the request's total deadline.
        #expect(m.state == .awaitingRefresh(number: 1, deadline: Self.t0 + .seconds(10)))
        #expect(m.timerFired(now: Self.t0 + .seconds(9), wall: 0, random: &random) == .none)
        #expect(
            m.refreshFinished(Self.token2, now: Self.t0 + .seconds(1))
                == .attempt(number: 2, credential: .token(Self.token2)))
        #expect(m.state == .attempting(number: 2, deadline: Self.t0 + .seconds(3)))
        #expect(m.credential == .token(Self.token2))
        #expect(head(&m, 101, at: Self.t0 + .seconds(1)) == .switchProtocols(attempts: 2))
        // A refresh is not a retry: the access line lists none.
        #expect(m.retryReasons == [])
        #expect(m.refreshFinished(Self.token1, now: Self.t0 + .seconds(2)) == .none)
    }

    @Test mutating func aSecond401AfterTheReplayGoesToTheClient() {
        var m = Self.machine(credential: .oauth2(refreshOn: [401]))
        _ = m.credentialAcquired(.token(Self.token1), now: Self.t0)
        #expect(head(&m, 401) == .refreshCredential(rejected: Self.token1))
        _ = m.refreshFinished(Self.token2, now: Self.t0)
        #expect(head(&m, 401) == .relayResponse(attempts: 2))
        #expect(m.state == .ended)
    }

    @Test mutating func aFailedRefreshRelaysTheHeldAnswerWithTokenRefreshFailed() {
        var m = Self.machine(credential: .oauth2(refreshOn: [401]))
        _ = m.credentialAcquired(.token(Self.token1), now: Self.t0)
        _ = head(&m, 401)
        #expect(m.refreshFinished(nil, now: Self.t0) == .relayResponse(attempts: 1, error: .tokenRefreshFailed))
        #expect(m.deadline == nil)
    }

    @Test mutating func aTokenFetchThatOutlivesTheTotalTimeoutIsTokenUnavailable() {
        var m = Self.machine(credential: .oauth2(refreshOn: [401]))
        #expect(m.deadline == Self.t0 + .seconds(10))
        #expect(m.timerFired(now: Self.t0 + .seconds(9), wall: 0, random: &random) == .none)
        #expect(
            m.timerFired(now: Self.t0 + .seconds(10), wall: 0, random: &random)
                == .failLocally(.tokenUnavailable, attempts: 0))
        #expect(m.state == .ended && m.deadline == nil)
        // The token arriving later changes nothing.
        #expect(m.credentialAcquired(.token(Self.token1), now: Self.t0 + .seconds(11)) == .none)
    }

    @Test mutating func aRefreshThatOutlivesTheTotalTimeoutRelaysTheHeldAnswer() {
        var m = Self.machine(credential: .oauth2(refreshOn: [401]))
        _ = m.credentialAcquired(.token(Self.token1), now: Self.t0)
        _ = head(&m, 401, at: Self.t0 + .seconds(1))
        #expect(m.deadline == Self.t0 + .seconds(10))
        #expect(
            m.timerFired(now: Self.t0 + .seconds(10), wall: 0, random: &random)
                == .relayResponse(attempts: 1, error: .tokenRefreshFailed))
        // The refresh ending later changes nothing.
        #expect(m.refreshFinished(Self.token2, now: Self.t0 + .seconds(11)) == .none)
    }

    @Test mutating func onlyAnOAuth2TokenIsRefreshedAndOnlyOnItsRefreshOnStatuses() {
        // A static value or SigV4 keys: a 401 is the upstream's answer.
        var fixed = Self.machine(credential: .staticValue)
        _ = fixed.credentialAcquired(Self.key, now: Self.t0)
        #expect(head(&fixed, 401) == .relayResponse(attempts: 1))
        // `refresh_on: [401, 403]`: a 403 refreshes; a 401 is then an answer like any other.
        var custom = Self.machine(credential: .oauth2(refreshOn: [401, 403]))
        _ = custom.credentialAcquired(.token(Self.token1), now: Self.t0)
        #expect(head(&custom, 403) == .refreshCredential(rejected: Self.token1))
        _ = custom.refreshFinished(Self.token2, now: Self.t0)
        #expect(head(&custom, 401) == .relayResponse(attempts: 2))
        // A refresh_on status that is also in retry.on refreshes first; after the replay it is retried.
        var both = Self.machine(credential: .oauth2(refreshOn: [503]))
        _ = both.credentialAcquired(.token(Self.token1), now: Self.t0)
        #expect(head(&both, 503) == .refreshCredential(rejected: Self.token1))
        _ = both.refreshFinished(Self.token2, now: Self.t0)
        #expect(head(&both, 503) == .retry(after: .milliseconds(100), reason: .status(503)))
        #expect(
            both.timerFired(now: Self.t0 + .milliseconds(100), wall: 0, random: &random)
                == .attempt(number: 3, credential: .token(Self.token2)))
    }

    @Test mutating func theClientLeavingDuringARefreshEndsIt() {
        var m = Self.machine(credential: .oauth2(refreshOn: [401]))
        _ = m.credentialAcquired(.token(Self.token1), now: Self.t0)
        _ = head(&m, 401)
        m.clientGone()
        #expect(m.refreshFinished(Self.token2, now: Self.t0) == .none)
        #expect(m.deadline == nil)
    }

    @Test func theClientLeavingEndsEverything() {
        var m = Self.machine()
        var random = self.random
        _ = m.credentialAcquired(Self.key, now: Self.t0)
        m.clientGone()
        #expect(m.deadline == nil)
        #expect(m.timerFired(now: Self.t0 + .seconds(5), wall: 0, random: &random) == .none)
    }
}

/// Which `101` answers may be relayed: the upstream must switch to a protocol the client offered.
@Suite("Upgrade protocol offered")
struct UpgradeOfferedTests {
    @Test(
        "the upstream's Upgrade names only offered protocols (case aside; a version only when it gives one)",
        arguments: [
            ("websocket", "websocket", true), ("WebSocket", "websocket", true), ("websocket", "h2c, websocket", true),
            ("websocket/13", "websocket/13", true), ("websocket", "websocket/13", true),
            ("websocket/14", "websocket/13", false), ("h2c", "websocket", false),
            ("websocket, h2c", "websocket", false),
            ("", "websocket", false), (" , ", "websocket", false), ("websocketx", "websocket", false),
        ])
    func offered(chosen: String, offer: String, expected: Bool) {
        #expect(UpgradeResponseReader.isOffered(chosen, in: offer) == expected)
    }
}
