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

    /// Retries 503, resets, timeouts and connect failures, three attempts, 100 ms constant backoff.
    static func machine(attempts: Int = 3, retryable: Bool = true, budget: BudgetConfig? = nil) -> Machine {
        let retry = RetryConfig(
            attempts: attempts,
            backoff: BackoffConfig(strategy: .constant, base: .milliseconds(100), max: .seconds(1), jitter: .none))
        return Machine(
            policy: retryable ? RetryPolicy(config: retry, timeouts: timeouts) : nil,
            budget: retryable ? SharedRetryBudget(budget ?? BudgetConfig(ratio: 1, minPerSecond: 100)) : nil,
            timeouts: timeouts, now: t0)
    }

    var random = ScriptedRandom(ScriptedRandom.half)

    @Test mutating func aCredentialStartsTheFirstAttemptAnd101SwitchesWithoutRetry() {
        var m = Self.machine()
        #expect(m.credential(available: true, now: Self.t0) == .attempt(number: 1))
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
        #expect(m.credential(available: false, now: Self.t0) == .failLocally(.tokenUnavailable, attempts: 0))
        #expect(m.credential(available: true, now: Self.t0) == .none)
    }

    @Test mutating func a503IsRetriedAfterTheBackoffThenAnotherStatusIsRelayed() {
        var m = Self.machine()
        _ = m.credential(available: true, now: Self.t0)
        #expect(
            m.responseHead(status: 503, retryAfter: nil, rateLimitReset: nil, now: Self.t0, wall: 0, random: &random)
                == .retry(after: .milliseconds(100), reason: .status(503)))
        #expect(m.deadline == Self.t0 + .milliseconds(100))
        #expect(m.timerFired(now: Self.t0 + .milliseconds(99), wall: 0, random: &random) == .none)
        #expect(m.timerFired(now: Self.t0 + .milliseconds(100), wall: 0, random: &random) == .attempt(number: 2))
        #expect(
            m.responseHead(status: 403, retryAfter: nil, rateLimitReset: nil, now: Self.t0, wall: 0, random: &random)
                == .relayResponse(attempts: 2))
        #expect(m.retryReasons == [.status(503)])
    }

    @Test mutating func failuresAreRetriedUntilTheAttemptsAreSpentThenAnsweredLocally() {
        var m = Self.machine(attempts: 2)
        _ = m.credential(available: true, now: Self.t0)
        #expect(
            m.attemptFailed(.connectFailure(detail: "refused"), now: Self.t0, wall: 0, random: &random)
                == .retry(after: .milliseconds(100), reason: .connectFailure))
        _ = m.timerFired(now: Self.t0 + .seconds(1), wall: 0, random: &random)
        #expect(
            m.attemptFailed(.connectFailure(detail: "refused"), now: Self.t0 + .seconds(1), wall: 0, random: &random)
                == .failLocally(.upstreamUnreachable, attempts: 2))
        #expect(m.lastFailure == .connectFailure(detail: "refused"))
    }

    @Test mutating func theAttemptDeadlineIsATimeoutAndTheTotalBoundsIt() {
        var m = Self.machine(attempts: 1)
        _ = m.credential(available: true, now: Self.t0)
        #expect(m.timerFired(now: Self.t0 + .seconds(1), wall: 0, random: &random) == .none)
        #expect(
            m.timerFired(now: Self.t0 + .seconds(2), wall: 0, random: &random)
                == .failLocally(.upstreamTimeout, attempts: 1))
        // An attempt starting late gets only what `total` leaves.
        var late = Self.machine()
        _ = late.attemptFailed(.reset(detail: ""), now: Self.t0, wall: 0, random: &random)
        _ = late.credential(available: true, now: Self.t0 + .seconds(9))
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
            _ = m.credential(available: true, now: Self.t0)
            #expect(
                m.attemptFailed(failure, now: Self.t0, wall: 0, random: &random) == .failLocally(reason, attempts: 1))
        }
        var bad = Self.machine(retryable: false)
        _ = bad.credential(available: true, now: Self.t0)
        #expect(
            bad.attemptFailed(.badResponse(detail: ""), now: Self.t0, wall: 0, random: &random)
                == .failLocally(.badUpstreamResponse, attempts: 1))
    }

    @Test mutating func anExhaustedBudgetStopsRetries() {
        var m = Self.machine(budget: BudgetConfig(ratio: 0, minPerSecond: 0))
        _ = m.credential(available: true, now: Self.t0)
        #expect(
            m.responseHead(status: 503, retryAfter: nil, rateLimitReset: nil, now: Self.t0, wall: 0, random: &random)
                == .relayResponse(attempts: 1))
    }

    @Test func theClientLeavingEndsEverything() {
        var m = Self.machine()
        var random = self.random
        _ = m.credential(available: true, now: Self.t0)
        m.clientGone()
        #expect(m.deadline == nil)
        #expect(m.timerFired(now: Self.t0 + .seconds(5), wall: 0, random: &random) == .none)
    }
}
