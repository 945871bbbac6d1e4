import BackstopCore
import BackstopTransport
import NIOCore
import Testing

@testable import BackstopServer

/// Every transition of `ExchangeStateMachine`, driven by hand: no sockets, no transport, no sleeps. Time is a
/// `Duration` the test moves; randomness is `ScriptedRandom`.
@Suite("Exchange state machine")
struct ExchangeStateMachineTests {
    typealias Machine = ExchangeStateMachine
    static let t0 = Duration.seconds(100)

    /// GET without a body to an upstream retrying 503/reset/timeout/connect failures, backoff constant 100 ms
    /// without jitter, so every wait is exact.
    static func configuration(
        method: String = "GET", hasBody: Bool = false, declaredLength: Int? = nil, retryBuffer: Int = 1024,
        maxRequestBody: Int = 1 << 20,
        timeouts: Timeouts = Timeouts(
            connect: .seconds(1), perTry: .seconds(2),
            total: .seconds(10), idle: .seconds(5)),
        credential: Machine.CredentialKind = .none, attempts: Int = 3, retryable: Bool = true,
        budget: BudgetConfig = BudgetConfig(ratio: 1, minPerSecond: 100), idempotencyKey: Bool = false,
        bodyMustBeKept: Bool = false
    ) -> Machine.Configuration {
        let retry = RetryConfig(
            attempts: attempts,
            backoff: BackoffConfig(
                strategy: .constant, base: .milliseconds(100), max: .seconds(1),
                jitter: .none))
        return Machine.Configuration(
            method: method, hasBody: hasBody, declaredLength: declaredLength, retryBuffer: retryBuffer,
            maxRequestBody: maxRequestBody, timeouts: timeouts, hasIdempotencyKey: idempotencyKey,
            credential: credential,
            retry: retryable ? RetryPolicy(config: retry, timeouts: timeouts) : nil,
            budget: retryable ? SharedRetryBudget(budget) : nil, bodyMustBeKept: bodyMustBeKept)
    }

    static func head(_ status: Int, contentLength: Int? = 2, retryAfter: String? = nil) -> UpstreamResponseHead {
        UpstreamResponseHead(status: status, contentLength: contentLength, retryAfter: retryAfter)
    }

    var random = ScriptedRandom(ScriptedRandom.half)

    // MARK: the happy path

    @Test func withoutABodyTheAttemptStartsAtOnceAndTheResponseIsRelayed() {
        var m = Machine(configuration: Self.configuration(), now: Self.t0)
        var random = self.random
        guard case .startAttempt(1, .none, mayResend: true) = m.start(now: Self.t0) else { Issue.record(); return }
        #expect(m.nextDeadline == Self.t0 + .seconds(2))
        guard
            case .deliverHead(error: nil) = m.responseHead(
                Self.head(200), generation: 1, now: Self.t0 + .milliseconds(5), wall: 0, random: &random)
        else { Issue.record(); return }
        #expect(m.finalStatus == 200)
        #expect(m.nextDeadline == Self.t0 + .milliseconds(5) + .seconds(5), "the idle deadline while relaying")
        guard
            case .relayBody(let body) = m.responseBody(
                ByteBuffer(string: "ok"), generation: 1,
                now: Self.t0 + .milliseconds(6))
        else { Issue.record(); return }
        #expect(body.readableBytes == 2)
        guard case .completeResponse(requestComplete: true) = m.responseEnded(generation: 1) else {
            Issue.record(); return
        }
        #expect(m.isDone)
        #expect(m.attempts == 1)
        #expect(m.finalStatus == 200)
        #expect(m.nextDeadline == nil)
    }

    @Test func eventsOfAnotherGenerationAreIgnored() {
        var m = Machine(configuration: Self.configuration(), now: Self.t0)
        var random = self.random
        _ = m.start(now: Self.t0)
        guard case .none = m.responseHead(Self.head(200), generation: 7, now: Self.t0, wall: 0, random: &random) else {
            Issue.record(); return
        }
        guard case .none = m.responseBody(ByteBuffer(), generation: 7, now: Self.t0) else { Issue.record(); return }
        guard case .none = m.responseEnded(generation: 7) else { Issue.record(); return }
        guard case .attempting = m.state else { Issue.record(); return }
    }

    // MARK: retries

    @Test func a503IsRetriedAfterTheBackoffAndTheSmallBodyIsLeftToFinish() {
        var m = Machine(configuration: Self.configuration(), now: Self.t0)
        var random = self.random
        _ = m.start(now: Self.t0)
        let at = Self.t0 + .milliseconds(10)
        guard
            case .retry(let delay, .status(503), .abandon(within: .seconds(5))) = m.responseHead(
                Self.head(503), generation: 1, now: at, wall: 0, random: &random)
        else { Issue.record(); return }
        #expect(delay == .milliseconds(100))
        #expect(m.nextDeadline == at + .milliseconds(100))
        guard case .none = m.timerFired(now: at + .milliseconds(99), wall: 0, random: &random) else {
            Issue.record(); return
        }
        guard case .startAttempt(2, .none, _) = m.timerFired(now: at + .milliseconds(100), wall: 0, random: &random)
        else { Issue.record(); return }
        guard
            case .deliverHead = m.responseHead(
                Self.head(200), generation: 2, now: at + .milliseconds(120), wall: 0,
                random: &random)
        else { Issue.record(); return }
        #expect(m.attempts == 2)
        #expect(m.retryReasons == [.status(503)])
    }

    @Test func aLargeOrUnframedRetriedResponseIsCancelled() {
        for head in [Self.head(503, contentLength: 1 << 20), Self.head(503, contentLength: nil)] {
            var m = Machine(configuration: Self.configuration(), now: Self.t0)
            var random = self.random
            _ = m.start(now: Self.t0)
            guard
                case .retry(_, _, .cancel) = m.responseHead(head, generation: 1, now: Self.t0, wall: 0, random: &random)
            else { Issue.record("\(head)"); return }
        }
    }

    @Test func theLastAttemptsResponseIsDeliveredAsItIs() {
        var m = Machine(configuration: Self.configuration(attempts: 2), now: Self.t0)
        var random = self.random
        _ = m.start(now: Self.t0)
        _ = m.responseHead(Self.head(503), generation: 1, now: Self.t0, wall: 0, random: &random)
        _ = m.timerFired(now: Self.t0 + .seconds(1), wall: 0, random: &random)
        guard
            case .deliverHead(error: nil) = m.responseHead(
                Self.head(503), generation: 2, now: Self.t0 + .seconds(1), wall: 0, random: &random)
        else { Issue.record(); return }
        #expect(m.finalStatus == 503)
        #expect(m.lastGiveUp == .attemptsExhausted)
    }

    @Test func aResetAfterAReplayableBodyIsRetried_aStreamedOneIsNot() {
        // Buffered (replayable) body: the reset is retried.
        var buffered = Machine(
            configuration: Self.configuration(method: "PUT", hasBody: true, declaredLength: 10),
            now: Self.t0)
        var random = self.random
        guard case .none = buffered.start(now: Self.t0) else { Issue.record(); return }
        guard case .storeBody = buffered.bodyReceived(count: 10, now: Self.t0) else { Issue.record(); return }
        guard case .startAttempt(1, _, _) = buffered.bodyEnded(now: Self.t0) else { Issue.record(); return }
        guard
            case .retry(_, .reset, .none) = buffered.transportFailed(
                .reset(detail: "x"), generation: 1, now: Self.t0, wall: 0, random: &random)
        else { Issue.record(); return }

        // Streamed body (declared larger than retry_buffer), reset mid-upload: not replayable.
        var streamed = Machine(
            configuration: Self.configuration(
                method: "PUT", hasBody: true, declaredLength: 4096, retryBuffer: 1024), now: Self.t0)
        guard case .beginStreaming = streamed.start(now: Self.t0) else { Issue.record(); return }
        guard case .startAttempt(1, _, _) = streamed.streamingBegan(now: Self.t0) else { Issue.record(); return }
        guard case .storeBody = streamed.bodyReceived(count: 2048, now: Self.t0) else { Issue.record(); return }
        guard
            case .failLocally(.upstreamUnreachable, requestComplete: false) = streamed.transportFailed(
                .reset(detail: "x"), generation: 1, now: Self.t0, wall: 0, random: &random)
        else { Issue.record(); return }
        #expect(streamed.lastGiveUp == .bodyNotReplayable)
    }

    @Test func aConnectFailureIsRetriedForAnyMethod_aResetOfAPostIsNot() {
        var random = self.random
        var connect = Machine(configuration: Self.configuration(method: "POST"), now: Self.t0)
        guard case .startAttempt(1, _, mayResend: false) = connect.start(now: Self.t0) else { Issue.record(); return }
        guard
            case .retry(_, .connectFailure, .none) = connect.transportFailed(
                .connectFailure(detail: "x"), generation: 1, now: Self.t0, wall: 0, random: &random)
        else { Issue.record(); return }
        var reset = Machine(configuration: Self.configuration(method: "POST"), now: Self.t0)
        _ = reset.start(now: Self.t0)
        guard
            case .failLocally(.upstreamUnreachable, _) = reset.transportFailed(
                .reset(detail: "x"), generation: 1, now: Self.t0, wall: 0, random: &random)
        else { Issue.record(); return }
        #expect(reset.lastGiveUp == .methodNotRetryable)
        var keyed = Machine(configuration: Self.configuration(method: "POST", idempotencyKey: true), now: Self.t0)
        guard case .startAttempt(_, _, mayResend: true) = keyed.start(now: Self.t0) else { Issue.record(); return }
    }

    @Test func failuresMapToTheirLocalErrors() {
        let cases: [(TransportFailure, ProxyErrorReason)] = [
            (.badResponse(detail: "x"), .badUpstreamResponse), (.loopDetected(detail: "x"), .loopDetected),
            (.destinationDenied(detail: "x"), .destinationDenied), (.requestBodyFailed, .badRequest),
            (.timeout(detail: "x"), .upstreamTimeout), (.connectFailure(detail: "x"), .upstreamUnreachable),
            (.tlsVerificationFailed(detail: "x"), .upstreamUnreachable),
        ]
        for (failure, reason) in cases {
            var m = Machine(configuration: Self.configuration(attempts: 1), now: Self.t0)
            var random = self.random
            _ = m.start(now: Self.t0)
            guard
                case .failLocally(let got, _) = m.transportFailed(
                    failure, generation: 1, now: Self.t0, wall: 0,
                    random: &random)
            else { Issue.record("\(failure)"); return }
            #expect(got == reason, "\(failure)")
            #expect(m.finalStatus == reason.status)
        }
    }

    @Test func theBudgetRefusingIsRemembered() {
        var m = Machine(
            configuration: Self.configuration(budget: BudgetConfig(ratio: 0, minPerSecond: 0)), now: Self.t0)
        var random = self.random
        _ = m.start(now: Self.t0)
        guard case .deliverHead = m.responseHead(Self.head(503), generation: 1, now: Self.t0, wall: 0, random: &random)
        else { Issue.record(); return }
        #expect(m.lastGiveUp == .budgetExhausted)
    }

    @Test func retryAfterLongerThanItsMaxEndsTheRetries() {
        var m = Machine(configuration: Self.configuration(), now: Self.t0)
        var random = self.random
        _ = m.start(now: Self.t0)
        guard
            case .deliverHead = m.responseHead(
                Self.head(503, retryAfter: "120"), generation: 1, now: Self.t0,
                wall: 1_800_000_000, random: &random)
        else { Issue.record(); return }
        #expect(m.lastGiveUp == .retryAfterTooLong)
    }

    // MARK: deadlines

    @Test func perTryThenTotal() {
        // per_try 2 s, total 5 s: attempts at 0 and 2.1 s end on per_try; the third has only what is left of total.
        let timeouts = Timeouts(connect: .seconds(1), perTry: .seconds(2), total: .seconds(5), idle: .seconds(5))
        var m = Machine(configuration: Self.configuration(timeouts: timeouts), now: Self.t0)
        var random = self.random
        _ = m.start(now: Self.t0)
        guard case .retry(_, .timeout, .cancel) = m.timerFired(now: Self.t0 + .seconds(2), wall: 0, random: &random)
        else { Issue.record(); return }
        guard case .startAttempt(2, _, _) = m.timerFired(now: Self.t0 + .milliseconds(2100), wall: 0, random: &random)
        else { Issue.record(); return }
        #expect(m.nextDeadline == Self.t0 + .milliseconds(4100))
        guard
            case .retry(_, .timeout, .cancel) = m.timerFired(
                now: Self.t0 + .milliseconds(4100), wall: 0,
                random: &random)
        else { Issue.record(); return }
        guard case .startAttempt(3, _, _) = m.timerFired(now: Self.t0 + .milliseconds(4200), wall: 0, random: &random)
        else { Issue.record(); return }
        guard case .attempting(let attempt) = m.state else { Issue.record(); return }
        #expect(attempt.deadlineIsTotal)
        #expect(attempt.deadline == Self.t0 + .seconds(5))
        guard
            case .failLocally(.upstreamTimeout, _) = m.timerFired(now: Self.t0 + .seconds(5), wall: 0, random: &random)
        else { Issue.record(); return }
    }

    @Test func aStalledResponseBodyIsAbortedAfterIdle_clientProgressCounts() {
        var m = Machine(configuration: Self.configuration(), now: Self.t0)
        var random = self.random
        _ = m.start(now: Self.t0)
        _ = m.responseHead(Self.head(200, contentLength: 10), generation: 1, now: Self.t0, wall: 0, random: &random)
        // The client drains slowly: its progress moves the idle deadline.
        m.clientWritable(now: Self.t0 + .seconds(4))
        guard case .none = m.timerFired(now: Self.t0 + .seconds(5), wall: 0, random: &random) else {
            Issue.record(); return
        }
        #expect(m.nextDeadline == Self.t0 + .seconds(9))
        guard
            case .abortResponse(note: "response-body-idle") = m.timerFired(
                now: Self.t0 + .seconds(9), wall: 0,
                random: &random)
        else { Issue.record(); return }
    }

    // MARK: the request body

    @Test func aBodyPastTheRetryBufferIsStreamedAndItsAttemptStartsAtOnce() {
        var m = Machine(configuration: Self.configuration(method: "PUT", hasBody: true, retryBuffer: 100), now: Self.t0)
        guard case .none = m.start(now: Self.t0) else { Issue.record(); return }
        guard case .storeBody = m.bodyReceived(count: 60, now: Self.t0) else { Issue.record(); return }
        guard case .storeBodyAndBeginStreaming = m.bodyReceived(count: 60, now: Self.t0) else { Issue.record(); return }
        #expect(!m.bodyReplayable)
        guard case .startAttempt(1, _, _) = m.streamingBegan(now: Self.t0) else { Issue.record(); return }
        guard case .storeBody = m.bodyReceived(count: 60, now: Self.t0) else { Issue.record(); return }
        guard case .finishBodyStream = m.bodyEnded(now: Self.t0) else { Issue.record(); return }
        #expect(m.requestComplete)
    }

    @Test func aBodyOverTheLimitFailsWith413() {
        var m = Machine(
            configuration: Self.configuration(method: "PUT", hasBody: true, maxRequestBody: 100), now: Self.t0)
        _ = m.start(now: Self.t0)
        guard case .failLocally(.bodyTooLarge, requestComplete: false) = m.bodyReceived(count: 101, now: Self.t0)
        else { Issue.record(); return }
        guard case .none = m.bodyReceived(count: 1, now: Self.t0) else { Issue.record(); return }
    }

    /// `aws_sigv4` with `payload: signed`: the body's hash is signed, so a body that cannot be kept whole is refused
    /// with 413 before any attempt, whichever way it turns out too large.
    @Test func aBodyThatMustBeKeptIsRefused413InsteadOfStreamed() {
        func machine(declaredLength: Int?) -> Machine {
            Machine(
                configuration: Self.configuration(
                    method: "PUT", hasBody: true, declaredLength: declaredLength, retryBuffer: 100,
                    credential: .staticValue, bodyMustBeKept: true), now: Self.t0)
        }
        var declared = machine(declaredLength: 101)
        guard case .failLocally(.bodyTooLarge, requestComplete: false) = declared.start(now: Self.t0)
        else { Issue.record(); return }
        #expect(declared.attempts == 0)

        var chunked = machine(declaredLength: nil)
        guard case .none = chunked.start(now: Self.t0) else { Issue.record(); return }
        guard case .storeBody = chunked.bodyReceived(count: 60, now: Self.t0) else { Issue.record(); return }
        guard case .failLocally(.bodyTooLarge, requestComplete: false) = chunked.bodyReceived(count: 60, now: Self.t0)
        else { Issue.record(); return }
        #expect(chunked.attempts == 0)

        var denied = machine(declaredLength: 50)
        guard case .none = denied.start(now: Self.t0) else { Issue.record(); return }
        guard case .storeBody = denied.bodyReceived(count: 50, now: Self.t0) else { Issue.record(); return }
        guard case .failLocally(.bodyTooLarge, requestComplete: false) = denied.bufferDenied(now: Self.t0)
        else { Issue.record(); return }

        // Within the buffer: kept, then one attempt with the credential.
        var kept = machine(declaredLength: 100)
        guard case .none = kept.start(now: Self.t0) else { Issue.record(); return }
        guard case .storeBody = kept.bodyReceived(count: 100, now: Self.t0) else { Issue.record(); return }
        guard case .acquireCredential = kept.bodyEnded(now: Self.t0) else { Issue.record(); return }
        #expect(kept.bodyReplayable)
    }

    // MARK: credentials and refresh

    static let token1 = ManagedToken(value: "t1", generation: 1, expiry: nil)
    static let token2 = ManagedToken(value: "t2", generation: 2, expiry: nil)

    @Test func a401IsHeldWhileTheTokenRefreshes_replayedOnce_aSecond401IsDelivered() {
        var m = Machine(configuration: Self.configuration(credential: .oauth2(refreshOn: [401])), now: Self.t0)
        var random = self.random
        guard case .acquireCredential = m.start(now: Self.t0) else { Issue.record(); return }
        guard case .startAttempt(1, .token(Self.token1), _) = m.credentialAcquired(.token(Self.token1), now: Self.t0)
        else { Issue.record(); return }
        guard
            case .refreshCredential(rejected: Self.token1) = m.responseHead(
                Self.head(401), generation: 1, now: Self.t0, wall: 0, random: &random)
        else { Issue.record(); return }
        // The rejected response's events wait; nothing reaches the client.
        guard case .none = m.responseBody(ByteBuffer(string: "no"), generation: 1, now: Self.t0) else {
            Issue.record(); return
        }
        guard case .none = m.responseEnded(generation: 1) else { Issue.record(); return }
        #expect(m.nextDeadline == Self.t0 + .seconds(10), "the total deadline bounds the refresh")
        guard case .startAttempt(2, .token(Self.token2), _) = m.refreshFinished(Self.token2, now: Self.t0)
        else { Issue.record(); return }
        guard
            case .deliverHead(error: nil) = m.responseHead(
                Self.head(401), generation: 2, now: Self.t0, wall: 0, random: &random)
        else { Issue.record(); return }
        #expect(m.finalStatus == 401)
        #expect(m.attempts == 2)
    }

    @Test func aFailedRefreshDeliversTheHeldResponseWithItsBody() {
        var m = Machine(configuration: Self.configuration(credential: .oauth2(refreshOn: [401])), now: Self.t0)
        var random = self.random
        _ = m.start(now: Self.t0)
        _ = m.credentialAcquired(.token(Self.token1), now: Self.t0)
        _ = m.responseHead(Self.head(401), generation: 1, now: Self.t0, wall: 0, random: &random)
        _ = m.responseBody(ByteBuffer(string: "no"), generation: 1, now: Self.t0)
        _ = m.responseEnded(generation: 1)
        guard case .deliverHeldHead(let held, .tokenRefreshFailed, let replay) = m.refreshFinished(nil, now: Self.t0)
        else { Issue.record(); return }
        #expect(held.status == 401)
        #expect(replay.count == 2)
        // Fed back in, the held events are relayed and end the response.
        guard case .relayBody = m.responseBody(ByteBuffer(string: "no"), generation: 1, now: Self.t0) else {
            Issue.record(); return
        }
        guard case .completeResponse = m.responseEnded(generation: 1) else { Issue.record(); return }
    }

    @Test func aRefreshOutlivingTheTotalDeadlineDeliversTheHeldResponse() {
        var m = Machine(configuration: Self.configuration(credential: .oauth2(refreshOn: [401])), now: Self.t0)
        var random = self.random
        _ = m.start(now: Self.t0)
        _ = m.credentialAcquired(.token(Self.token1), now: Self.t0)
        _ = m.responseHead(Self.head(401), generation: 1, now: Self.t0, wall: 0, random: &random)
        guard
            case .deliverHeldHead(_, .tokenRefreshFailed, _) = m.timerFired(
                now: Self.t0 + .seconds(10), wall: 0,
                random: &random)
        else { Issue.record(); return }
    }

    @Test func aCancelledWaiterIgnoresTheRefreshResult() {
        var m = Machine(configuration: Self.configuration(credential: .oauth2(refreshOn: [401])), now: Self.t0)
        var random = self.random
        _ = m.start(now: Self.t0)
        _ = m.credentialAcquired(.token(Self.token1), now: Self.t0)
        _ = m.responseHead(Self.head(401), generation: 1, now: Self.t0, wall: 0, random: &random)
        guard case .cancel = m.clientGone() else { Issue.record(); return }
        #expect(m.finalStatus == 499)
        guard case .none = m.refreshFinished(Self.token2, now: Self.t0) else { Issue.record(); return }
    }

    @Test func noTokenMeans502TokenUnavailable_alsoWhenTheFetchOutlivesTotal() {
        var m = Machine(configuration: Self.configuration(credential: .staticValue), now: Self.t0)
        _ = m.start(now: Self.t0)
        guard case .failLocally(.tokenUnavailable, _) = m.credentialAcquired(nil, now: Self.t0) else {
            Issue.record(); return
        }
        var slow = Machine(configuration: Self.configuration(credential: .oauth2(refreshOn: [401])), now: Self.t0)
        var random = self.random
        _ = slow.start(now: Self.t0)
        guard
            case .failLocally(.tokenUnavailable, _) = slow.timerFired(
                now: Self.t0 + .seconds(10), wall: 0,
                random: &random)
        else { Issue.record(); return }
        guard case .none = slow.credentialAcquired(.token(Self.token1), now: Self.t0 + .seconds(11)) else {
            Issue.record(); return
        }
    }

    // MARK: the client

    @Test func aDisconnectDuringBackoffCancelsThePendingRetry() {
        var m = Machine(configuration: Self.configuration(), now: Self.t0)
        var random = self.random
        _ = m.start(now: Self.t0)
        _ = m.responseHead(Self.head(503), generation: 1, now: Self.t0, wall: 0, random: &random)
        guard case .cancel = m.clientGone() else { Issue.record(); return }
        guard case .none = m.timerFired(now: Self.t0 + .seconds(1), wall: 0, random: &random) else {
            Issue.record(); return
        }
        #expect(m.attempts == 1)
    }

    @Test func aStalledClientGets408BeforeAHead_aClosedConnectionAfter() {
        var before = Machine(configuration: Self.configuration(method: "PUT", hasBody: true), now: Self.t0)
        _ = before.start(now: Self.t0)
        guard case .failLocally(.requestTimeout, requestComplete: false) = before.clientStalled() else {
            Issue.record(); return
        }
        var after = Machine(
            configuration: Self.configuration(
                method: "PUT", hasBody: true, declaredLength: 4096,
                retryBuffer: 100), now: Self.t0)
        var random = self.random
        _ = after.start(now: Self.t0)
        _ = after.streamingBegan(now: Self.t0)
        _ = after.responseHead(Self.head(200), generation: 1, now: Self.t0, wall: 0, random: &random)
        guard case .abortResponse(note: "request-body-stalled") = after.clientStalled() else { Issue.record(); return }
    }

    @Test func anOverrunOrAShortBodyEndsTheResponseByClosing() {
        var m = Machine(configuration: Self.configuration(), now: Self.t0)
        var random = self.random
        _ = m.start(now: Self.t0)
        _ = m.responseHead(Self.head(200), generation: 1, now: Self.t0, wall: 0, random: &random)
        guard case .abortResponse(note: "upstream-body-longer-than-announced") = m.responseOverran() else {
            Issue.record(); return
        }
        #expect(m.isDone)
    }
}
