import BackstopCore
import BackstopIdentity
import BackstopTransport
import NIOCore

/// The decisions of one client request, from its head to the end of its response: when to attempt, what each
/// attempt's outcome means (deliver, retry after a delay, hold it while the token refreshes, fail), and which
/// deadline comes next. Pure: time comes in as `now` readings of a `BackstopClock`, randomness from an injected
/// generator, the upstream's shared retry budget as an event answering the machine's question
/// (`.requestRetryPermit` → `retryPermit(granted:)`), and every effect goes out as one `Action`. The retry rules
/// themselves are `RetryPolicy`'s; this type sequences them (docs/reference/behaviour.md#retries). It lives inside
/// the connection's machine (`ConnectionStateMachine`), which frames what it relays and reports when the upstream
/// breaks that framing (`framingBroken`).
///
/// Attempts in flight (docs/architecture.md#attempts-in-flight). `attempting` holds a set of attempts, each with its
/// generation and deadline. A retry is "this attempt ends, later another starts", through `backingOff`; a hedged copy
/// (docs/reference/behaviour.md#hedging) joins the set while the others are still in flight, when the set's hedge
/// timer is due (`AttemptSet.nextCopy`: asked of the retry budget, then given a credential and an endpoint, as a
/// retry is). The first head that is not a `retry.on` condition wins and the others are cancelled; an attempt that
/// ends otherwise while others are in flight just leaves the set (`.attemptLeft`), and only the last one's outcome
/// is decided on (retried, refreshed, delivered or failed) as a lone attempt's is. Generations are unique on the
/// connection; an event of a generation that is not the machine's (an attempt it cancelled, abandoned or finished,
/// whose events were already queued) is stale and ignored: the action is `.none` and nothing changes.
///
/// States and their transitions (an event not listed for a state changes nothing and returns `.none`):
///
///     receivingBody        bodyReceived → storeBody | storeBodyAndBeginStreaming (then streamingBegan →
///                          acquiringCredential | attempting);  bufferDenied → beginStreaming;  bodyEnded →
///                          acquiringCredential | attempting;  too large → done (413);  total deadline → done (408)
///     acquiringCredential  credentialAcquired → attempting;  (nil) or total deadline → done (token-unavailable)
///     attempting           head → relaying | awaitingRefresh | awaitingRetryPermit;  failure or per-try deadline
///                          → awaitingRetryPermit | done;  total deadline → done (upstream-timeout);  hedge timer →
///                          attempting (a copy: permit, credential, endpoint asked in turn, then started);  with
///                          others in flight, a head that does not win, a failure or a per-try deadline → attempting
///                          (the attempt leaves the set)
///     awaitingRetryPermit  retryPermit(granted) → backingOff;  (denied) → relaying (the head) | done
///     awaitingRefresh      refreshFinished(token) → attempting (replay once);  (nil) or total deadline → relaying
///                          (the held head with token-refresh-failed, then the events held meanwhile)
///     backingOff           deadline → acquiringCredential | attempting
///     relaying             body → relaying;  end → done;  failure, idle deadline, framingBroken → done (aborted)
///     done                 terminal
///
/// In every state but `done`, `clientGone` ends the exchange and `clientStalled` ends it with 408
/// `request-timeout` before a response head, or by aborting the response after one.
struct ExchangeStateMachine: Equatable {
    /// What one exchange is about; fixed when it starts.
    struct Configuration: Equatable {
        var method: String
        /// The request has a body (a non-zero `Content-Length`, or chunked).
        var hasBody: Bool
        var declaredLength: Int?
        var retryBuffer: Int
        var maxRequestBody: Int
        var timeouts: Timeouts
        var hasIdempotencyKey: Bool
        var credential: CredentialKind
        /// nil for passthrough: one attempt, nothing retried.
        var retry: RetryPolicy?
        /// The body must be complete before the first attempt (`aws_sigv4` with `payload: signed` hashes it): one
        /// that would stream (above `retry_buffer`, or no room in `limits.buffer_memory`) gets 413 `body-too-large`.
        var bodyMustBeKept = false
        /// Each attempt asks the upstream's endpoint set where it goes (`.chooseEndpoint`): an upstream, not
        /// passthrough (docs/reference/behaviour.md#endpoints-and-ejection).
        var choosesEndpoint = false
        /// `retry.on_network_change`: a backoff after a failure for want of a usable network ends at the first
        /// network change (docs/reference/behaviour.md#the-network-coming-back).
        var networkReturn = false
        /// `hedge` of the upstream, when this request may be hedged (its method is in `hedge.methods`, and its body
        /// may be kept): nil on the usual path (docs/reference/behaviour.md#hedging).
        var hedge: HedgePlan? = nil
        /// Bodies up to this size of a response that will be retried are left to finish, so curl keeps the
        /// connection for the retry; larger or unframed ones are cut.
        static let smallResponseLimit = 64 << 10
    }

    /// When and how many hedged copies a request may get: `hedge.after` as it stood when the request was admitted
    /// (`p95` read then), and `hedge.max`.
    struct HedgePlan: Equatable {
        var after: Duration
        var max: Int
    }

    /// How the upstream is authenticated, as far as decisions go.
    enum CredentialKind: Equatable {
        case none
        /// Keychain entries read for each attempt, never refreshed: sent as is (`auth.type: static`), or the keys
        /// that sign the attempt (`aws_sigv4`, where a 403 is an answer, not a reason to refresh).
        case staticValue
        /// An OAuth2 token; a response status in `refreshOn` triggers one refresh and one replay.
        case oauth2(refreshOn: Set<Int>)
    }

    /// What an attempt carries in its auth header.
    enum Credential: Equatable {
        case none
        case value(String)
        case token(ManagedToken)
        /// The keys an `aws_sigv4` attempt is signed with (at its own time, when it starts). Boxed (`indirect`): three
        /// strings would make every `Credential` and `Action` of the plain path larger to copy.
        indirect case aws(SigV4Credentials)
    }

    /// Where the request body is, as far as decisions go (the bytes are the executor's).
    enum BodyMode: Equatable {
        case none
        /// Being kept for replay, this many bytes so far.
        case buffering(Int)
        /// Complete and kept: replayable.
        case buffered
        /// Sent as it arrives (above `retry_buffer`, or over `limits.buffer_memory`): an attempt sends it once only.
        case streaming(complete: Bool)
        /// Sent as it arrives and written to the spool meanwhile (docs/reference/behaviour.md#spooled-bodies): every
        /// attempt sends it from the first byte, even before it is complete.
        case spooled(complete: Bool)

        var replayable: Bool {
            switch self {
            case .none, .buffered, .spooled: true
            case .buffering, .streaming: false
            }
        }
    }

    /// One attempt in flight: its generation (unique on the connection) and its deadline.
    struct Attempt: Equatable {
        var generation: Int
        var deadline: Duration
        /// The deadline is what is left of `timeouts.total` rather than `per_try`.
        var deadlineIsTotal: Bool
        /// The endpoint the attempt was given, whose health its outcome is reported for.
        var endpoint: EndpointTicket? = nil
        /// A hedged copy, sent while another attempt of the request was in flight (`backstop_hedges_total`).
        var hedge = false
    }

    /// The attempts in flight, and where the next hedged copy is (docs/architecture.md#attempts-in-flight). The first
    /// is stored inline; the copies beside it and the hedge timer are out of line (copied on write) and absent for a
    /// request that is never hedged, so that the usual single attempt allocates nothing and the state that holds it
    /// is no larger to copy than before hedging.
    struct AttemptSet: Equatable {
        private(set) var first: Attempt
        private var race: RaceBox?

        init(_ first: Attempt, nextCopy: NextCopy = .none) {
            self.first = first
            if nextCopy != .none { race = RaceBox(Race(nextCopy: nextCopy)) }
        }

        /// The attempts beside `first`, oldest first.
        private(set) var others: [Attempt] {
            get { race?.value.others ?? [] }
            set { modifyRace { $0.others = newValue } }
        }

        var nextCopy: NextCopy {
            get { race?.value.nextCopy ?? .none }
            set {
                if race == nil, newValue == .none { return }
                modifyRace { $0.nextCopy = newValue }
            }
        }

        var count: Int { 1 + (race?.value.others.count ?? 0) }

        func attempt(_ generation: Int) -> Attempt? {
            if first.generation == generation { return first }
            return others.first { $0.generation == generation }
        }

        /// Every attempt in flight, oldest first.
        var all: [Attempt] { [first] + others }

        /// Every generation in flight, oldest first.
        var generations: [Int] { all.map(\.generation) }

        /// The endpoints the attempts in flight were given: a copy passes over them while another may be tried.
        var endpoints: [Int] { all.compactMap { $0.endpoint?.endpoint } }

        mutating func add(_ attempt: Attempt) { others.append(attempt) }

        /// Takes attempt `generation` out of a set that holds others too.
        mutating func remove(_ generation: Int) {
            if first.generation == generation, !others.isEmpty {
                first = others.removeFirst()
            } else if let index = others.firstIndex(where: { $0.generation == generation }) {
                others.remove(at: index)
            }
        }

        /// The first attempt whose deadline is due at `now`, if any.
        func due(at now: Duration) -> Attempt? {
            if first.deadline <= now { return first }
            return others.first { $0.deadline <= now }
        }

        /// The earliest of the attempts' deadlines and the hedge timer.
        var earliestDeadline: Duration {
            guard let race else { return first.deadline }
            return race.value.earliestDeadline(first.deadline)
        }

        static func == (lhs: AttemptSet, rhs: AttemptSet) -> Bool {
            lhs.first == rhs.first
                && (lhs.race === rhs.race || (lhs.race?.value ?? Race()) == (rhs.race?.value ?? Race()))
        }

        private mutating func modifyRace(_ change: (inout Race) -> Void) {
            if race == nil {
                race = RaceBox(Race())
            } else if !isKnownUniquelyReferenced(&race) {
                race = RaceBox(race!.value)
            }
            change(&race!.value)
        }

        private struct Race: Equatable {
            var others: [Attempt] = []
            var nextCopy = NextCopy.none

            func earliestDeadline(_ first: Duration) -> Duration {
                let attempts = others.reduce(first) { min($0, $1.deadline) }
                if case .due(let at) = nextCopy { return min(attempts, at) }
                return attempts
            }
        }

        private final class RaceBox {
            var value: Race
            init(_ value: Race) { self.value = value }
        }
    }

    /// Where the request's next hedged copy is: a copy asks what a retry asks, in the same order (the budget, a
    /// credential, an endpoint), while the attempts in flight go on.
    enum NextCopy: Equatable {
        /// None will be sent: hedging is off for the request, or no attempt, copy or time is left for one.
        case none
        /// Sent at this time unless a head wins first.
        case due(Duration)
        /// `.requestHedgePermit` is out: `retryPermit` answers.
        case askingBudget
        /// `.acquireCredential` is out: `credentialAcquired` answers.
        case acquiringCredential
        /// `.chooseEndpoint` is out with the copy's credential: `endpointChosen` answers. Boxed: a moment, once per copy.
        indirect case choosingEndpoint(Credential)
    }

    /// An attempt let go unanswered because another won or the request ended: its transfer is cancelled and its
    /// endpoint told nothing was learned (a probe permit it held is freed).
    struct LetGo: Equatable {
        var generation: Int
        var endpoint: EndpointReport? = nil
    }

    /// An attempt that ended without a head to deliver while others of its request are still in flight: it leaves
    /// the set, and no retry is decided for it (docs/reference/behaviour.md#hedging).
    struct AttemptLeft: Equatable {
        var generation: Int
        var report: AttemptReport
        var endpoint: EndpointReport?
        var disposal: Disposal
    }

    /// How a request's hedged copies ended, for `backstop_hedges_total{result}`: `won` (its head was delivered),
    /// `lost` (it ended with a `retry.on` condition or a failure), `cancelled` (let go unanswered: another attempt
    /// won, or the request ended first).
    struct HedgeTally: Equatable {
        var won: UInt8 = 0
        var lost: UInt8 = 0
        var cancelled: UInt8 = 0
    }

    /// How an attempt ended, for `backstop_upstream_attempts_total{status|outcome}`
    /// (docs/reference/operations.md#metrics): a head arrived, or it failed below HTTP or timed out.
    enum AttemptReport: Equatable {
        /// A head with this status arrived (`version`: the protocol the upstream spoke, for the attempt's span).
        case response(status: Int, version: String)
        case failed(TransportFailure)
    }

    /// What to do with the transfer of an attempt that will be retried.
    enum Disposal: Equatable {
        /// It already ended.
        case none
        case cancel
        /// Let a small response finish (connection reuse), cancelled if it takes longer than `within`.
        case abandon(within: Duration)
    }

    /// A retry the policy would make, waiting for the budget's answer (`retryPermit`).
    struct PendingRetry: Equatable {
        var generation: Int
        var delay: Duration
        var reason: RetryCondition
        var disposal: Disposal
        /// The failure below HTTP that asks for the retry (its log line and span), nil for a status.
        var failure: TransportFailure?
        /// What the client gets if the budget says no.
        var fallback: Fallback
        /// Events of the attempt that came while the permit was asked (the executor answers at once, so none do).
        var held: [TransportEvent] = []
    }

    /// The answer a refused retry leaves: the head that asked for the retry, or a Backstop error.
    enum Fallback: Equatable {
        case deliver(UpstreamResponseHead)
        case fail(ProxyErrorReason)
    }

    /// A retry the budget allowed.
    struct Retry: Equatable {
        /// The attempt that is retried (its number).
        var attempt: Int
        var after: Duration
        var reason: RetryCondition
        var generation: Int
        var disposal: Disposal
        /// The failure below HTTP that the retry is for (logged at `debug`, the attempt span's outcome).
        var failure: TransportFailure?
        /// The failure was for want of a usable network: the wait also ends at the next network change
        /// (`networkChanged`), whichever comes first.
        var wakesOnNetworkChange = false
    }

    /// An attempt to start.
    struct Start: Equatable {
        var generation: Int
        /// The attempt's number for `X-Backstop-Attempts`, logs and its span (1 for the first).
        var attempt: Int
        var credential: Credential
        /// Whether libcurl may resend the request by itself on a fresh connection (never for a request that may
        /// not reach the upstream twice).
        var mayResend: Bool
        /// The first attempt of a request with a retry policy: the budget counts it as a request.
        var countsAsRequest: Bool
        /// The attempt this one replaces (the one whose token was rejected): cancel its transfer first.
        var replacing: Int?
        /// Which of the upstream's endpoints it goes to (nil: the upstream's first, or passthrough).
        var endpoint: Int? = nil
        /// A hedged copy (its span's `backstop.hedge`).
        var hedge = false
    }

    /// An attempt waiting for the endpoint set's answer (`endpointChosen`).
    struct PendingStart: Equatable {
        var credential: Credential
        var replacing: Int?
    }

    /// How a response head goes out.
    struct Delivery: Equatable {
        var generation: Int
        /// `X-Backstop-Error` on the head (`token-refresh-failed`).
        var error: ProxyErrorReason?
        /// `X-Backstop-Attempts`.
        var attempts: Int
        /// How its attempt ended, when this head ended it (nil for a head held during a refresh, reported then).
        var report: AttemptReport?
        /// How its attempt ended for its endpoint, when this head ended it.
        var endpoint: EndpointReport? = nil
        /// Other attempts in flight, to cancel (the hedge race is over).
        var cancel: [LetGo] = []
        /// Events held meanwhile, fed back in order after the head.
        var replay: [TransportEvent] = []
    }

    /// What an ended exchange leaves for metrics, the access line, logs and its span.
    ///
    /// What only retries, failures, circuit-open answers and hedges write is kept out of line, as `Progress` keeps
    /// it, and absent on a plain request's record: the actions that carry a record (`.end`, `.endResponse`,
    /// `.requestFinished`) then stay small enough to be moved without a call to `memcpy` (docs/performance.md).
    struct Record: Equatable {
        /// The status the client got (499 when it went away first).
        var status: Int
        var attempts: Int
        /// The `X-Backstop-Error` the relayed head carried.
        var headError: ProxyErrorReason?
        /// The client's body was read to its end (else a streamed body is failed, and the rest is not read).
        var requestComplete: Bool
        /// The endpoint of the last attempt (the access line's `endpoint=`); nil when none was made.
        var endpoint: Int?
        private var rare: RareBox?

        init(
            status: Int, attempts: Int, retries: [RetryCondition], giveUp: GiveUpReason? = nil,
            giveUpCondition: RetryCondition? = nil, lastFailure: TransportFailure? = nil,
            headError: ProxyErrorReason? = nil, requestComplete: Bool, endpoint: Int? = nil, retryAfter: Int? = nil,
            hedges: HedgeTally = HedgeTally()
        ) {
            self.status = status
            self.attempts = attempts
            self.headError = headError
            self.requestComplete = requestComplete
            self.endpoint = endpoint
            let rare = Rare(
                retries: retries, giveUp: giveUp, giveUpCondition: giveUpCondition, lastFailure: lastFailure,
                retryAfter: retryAfter, hedges: hedges)
            if rare != Rare() { self.rare = RareBox(rare) }
        }

        var retries: [RetryCondition] {
            get { rare?.value.retries ?? [] }
            set { modifyRare { $0.retries = newValue } }
        }
        /// Which rule stopped the retries, and the `retry.on` condition it refused.
        var giveUp: GiveUpReason? {
            get { rare?.value.giveUp }
            set { modifyRare { $0.giveUp = newValue } }
        }
        var giveUpCondition: RetryCondition? {
            get { rare?.value.giveUpCondition }
            set { modifyRare { $0.giveUpCondition = newValue } }
        }
        /// The last attempt's failure below HTTP, if any.
        var lastFailure: TransportFailure? {
            get { rare?.value.lastFailure }
            set { modifyRare { $0.lastFailure = newValue } }
        }
        /// `Retry-After` of a 503 `circuit-open`: whole seconds until an endpoint may be probed.
        var retryAfter: Int? {
            get { rare?.value.retryAfter }
            set { modifyRare { $0.retryAfter = newValue } }
        }
        /// Attempts sent and still in flight when the exchange ended, let go without an answer: counted in
        /// `backstop_upstream_attempts_total` as their spans end (the client left, the request could not be read).
        var unanswered: UnansweredAttempts {
            get { rare?.value.unanswered ?? UnansweredAttempts() }
            set { modifyRare { $0.unanswered = newValue } }
        }
        /// The body of a local answer when the reason's own text would name the wrong limit.
        var message: String? {
            get { rare?.value.message }
            set { modifyRare { $0.message = newValue } }
        }
        /// How the request's hedged copies ended.
        var hedges: HedgeTally {
            get { rare?.value.hedges ?? HedgeTally() }
            set { modifyRare { $0.hedges = newValue } }
        }

        private mutating func modifyRare(_ change: (inout Rare) -> Void) {
            var value = rare?.value ?? Rare()
            change(&value)
            rare = RareBox(value)
        }

        static func == (lhs: Record, rhs: Record) -> Bool {
            lhs.status == rhs.status && lhs.attempts == rhs.attempts && lhs.headError == rhs.headError
                && lhs.requestComplete == rhs.requestComplete && lhs.endpoint == rhs.endpoint
                && (lhs.rare === rhs.rare || (lhs.rare?.value ?? Rare()) == (rhs.rare?.value ?? Rare()))
        }

        private struct Rare: Equatable {
            var retries: [RetryCondition] = []
            var giveUp: GiveUpReason?
            var giveUpCondition: RetryCondition?
            var lastFailure: TransportFailure?
            var retryAfter: Int?
            var hedges = HedgeTally()
            var message: String?
            var unanswered = UnansweredAttempts()
        }

        /// Immutable once made: a change makes a new box, so records that share one never see each other's.
        private final class RareBox: Sendable {
            let value: Rare
            init(_ value: Rare) { self.value = value }
        }
    }

    /// The attempts that end with an exchange that ends before a response completed: `report` is the last
    /// attempt's, when it ended here, and `endpoint` what that means for its endpoint (an attempt still in flight is
    /// reported `abandoned`); `letGo`: the other attempts still in flight (hedged copies). Out of line (immutable,
    /// shared): inline, they would make every action of every event too large to move without a call to `memcpy`.
    final class AttemptsAtEnd: Equatable, Sendable {
        let report: AttemptReport?
        let endpoint: EndpointReport?
        let letGo: [LetGo]

        private init(report: AttemptReport?, endpoint: EndpointReport?, letGo: [LetGo]) {
            self.report = report
            self.endpoint = endpoint
            self.letGo = letGo
        }

        /// nil when nothing ends with the exchange (the usual end of a relayed response).
        static func with(
            report: AttemptReport?, endpoint: EndpointReport? = nil, letGo: [LetGo] = []
        ) -> AttemptsAtEnd? {
            if report == nil, endpoint == nil, letGo.isEmpty { return nil }
            return AttemptsAtEnd(report: report, endpoint: endpoint, letGo: letGo)
        }

        static func == (lhs: AttemptsAtEnd, rhs: AttemptsAtEnd) -> Bool {
            lhs === rhs || (lhs.report == rhs.report && lhs.endpoint == rhs.endpoint && lhs.letGo == rhs.letGo)
        }
    }

    /// The attempts an exchange's end let go while they were in flight: the one it settled on (the last started),
    /// and hedged copies beside it.
    struct UnansweredAttempts: Equatable {
        var settled = false
        var copies = 0
    }

    /// How an exchange ends.
    enum Ending: Equatable {
        /// The response is complete; `requestComplete` says whether the client's body was read to its end.
        case completed(requestComplete: Bool)
        /// A response whose head went out is cut by closing the connection.
        case aborted(AbortCause)
        /// Answered with a Backstop error; an incomplete request body is not read further.
        case failedLocally(ProxyErrorReason, requestComplete: Bool)
        /// The client went away (`client-closed` on the access line).
        case clientClosed

        /// The access line's `error=`: nil for a complete response (docs/reference/operations.md#access-log).
        var note: String? {
            switch self {
            case .completed: nil
            case .aborted(let cause): cause.rawValue
            case .failedLocally(let reason, _): reason.rawValue
            case .clientClosed: "client-closed"
            }
        }
    }

    /// Why a response was cut after its head (the access line's `error=`, docs/reference/errors.md).
    enum AbortCause: String, Equatable, CaseIterable {
        case upstreamBrokeMidResponse = "upstream-broke-mid-response"
        case responseBodyIdle = "response-body-idle"
        case bodyLongerThanAnnounced = "upstream-body-longer-than-announced"
        case bodyShorterThanAnnounced = "upstream-body-shorter-than-announced"
        case requestBodyStalled = "request-body-stalled"
        case requestBodyTooLarge = "body-too-large"
        /// The client's request could not be read to its end (a bad chunk, trailers too large) after the response
        /// had begun.
        case requestUnreadable = "bad-request"
    }

    /// An effect for the executor, with what metrics and logs record of it.
    enum Action: Equatable {
        case none
        /// Keep the body part just reported: in the buffer, or in the stream once streaming.
        case storeBody
        /// Keep the part just reported, then turn the kept body into a stream and report `streamingBegan`.
        case storeBodyAndBeginStreaming
        /// Turn the kept body into a stream now and report `streamingBegan`.
        case beginStreaming
        /// The streamed body is complete.
        case finishBodyStream
        /// Get the credential for the next attempt and report `credentialAcquired`.
        case acquireCredential
        /// Ask the upstream's endpoint set for the next attempt's endpoint, passing over `avoiding` while another may
        /// be tried, and report `endpointChosen` before any other event. `copy`: for a hedged copy, which finding no
        /// endpoint does not fail the request (not counted as a fast failure).
        case chooseEndpoint(avoiding: [Int], copy: Bool = false)
        case startAttempt(Start)
        /// Refresh the rejected token (shared, single flight) and report `refreshFinished`; the rejected attempt
        /// ended as `report`.
        case refreshCredential(rejected: ManagedToken, report: AttemptReport, endpoint: EndpointReport? = nil)
        /// The policy would retry the attempt that ended as `report`: ask the upstream's retry budget and report
        /// `retryPermit` before any other event.
        case requestRetryPermit(report: AttemptReport, endpoint: EndpointReport? = nil)
        /// The budget allowed the retry: dispose of the attempt's transfer; `timerFired` comes after `after`.
        case retry(Retry)
        /// The hedge timer is due: ask the upstream's retry budget for a copy (copies draw from it as retries do) and
        /// report `retryPermit` before any other event.
        case requestHedgePermit
        /// An attempt ended while others are in flight: record it, dispose of its transfer. Boxed: rare.
        indirect case attemptLeft(AttemptLeft)
        /// Inline: the head is one reference (its fields share one box), and `Delivery` is smaller than `.end`.
        case deliverHead(UpstreamResponseHead, Delivery)
        case relayBody(ByteBuffer)
        /// The exchange is over: every transfer still held is let go (cancelled, unless the response completed);
        /// the attempts that end with it, if any, as `AttemptsAtEnd` says.
        case end(Ending, Record, AttemptsAtEnd?)
    }

    /// What every live state carries (`ExchangeStateMachine.progress`): the request body's progress and the
    /// exchange's record so far.
    struct Progress: Equatable {
        var body: BodyMode = .none
        var requestComplete = false
        var receivedBytes = 0
        /// Attempts started (`X-Backstop-Attempts`).
        var attempts = 0
        /// The generation the next attempt gets.
        var nextGeneration: Int
        /// The endpoint of the last attempt started.
        var endpoint: Int?
        /// What only retries, failures and token refreshes write: kept out of line (copied on write) and absent until
        /// first written, so that every state change of a plain exchange copies one empty reference instead.
        private var rare: RareBox?

        init(nextGeneration: Int) { self.nextGeneration = nextGeneration }

        /// The OAuth2 token the attempts carry.
        var token: ManagedToken? {
            get { rare?.value.token }
            set { modifyRare { $0.token = newValue } }
        }
        var replayedAfterRefresh: Bool {
            get { rare?.value.replayedAfterRefresh ?? false }
            set { modifyRare { $0.replayedAfterRefresh = newValue } }
        }
        var previousDelay: Duration? {
            get { rare?.value.previousDelay }
            set { modifyRare { $0.previousDelay = newValue } }
        }
        var retryReasons: [RetryCondition] {
            get { rare?.value.retryReasons ?? [] }
            set { modifyRare { $0.retryReasons = newValue } }
        }
        var giveUp: GiveUpReason? {
            get { rare?.value.giveUp }
            set { modifyRare { $0.giveUp = newValue } }
        }
        var giveUpCondition: RetryCondition? {
            get { rare?.value.giveUpCondition }
            set { modifyRare { $0.giveUpCondition = newValue } }
        }
        var lastFailure: TransportFailure? {
            get { rare?.value.lastFailure }
            set { modifyRare { $0.lastFailure = newValue } }
        }
        /// The failure of the attempt the backoff under way retries; nil when it retries a response.
        var retriedFailure: TransportFailure? {
            get { rare?.value.retriedFailure }
            set { modifyRare { $0.retriedFailure = newValue } }
        }
        /// The endpoint whose attempt failed, which the retry passes over while another may be tried.
        var avoidEndpoint: Int? {
            get { rare?.value.avoidEndpoint }
            set { modifyRare { $0.avoidEndpoint = newValue } }
        }
        var retryAfter: Int? {
            get { rare?.value.retryAfter }
            set { modifyRare { $0.retryAfter = newValue } }
        }
        /// The backoff under way ends at the next network change too.
        var wakesOnNetworkChange: Bool {
            get { rare?.value.wakesOnNetworkChange ?? false }
            set { modifyRare { $0.wakesOnNetworkChange = newValue } }
        }
        var hedges: HedgeTally {
            get { rare?.value.hedges ?? HedgeTally() }
            set { modifyRare { $0.hedges = newValue } }
        }
        /// A copy was refused (the retry budget, or no endpoint open for it), or the upstream refused the token the
        /// copies carry: no further copy is asked for this request (docs/reference/behaviour.md#hedging).
        var copyRefused: Bool {
            get { rare?.value.copyRefused ?? false }
            set { modifyRare { $0.copyRefused = newValue } }
        }

        private mutating func modifyRare(_ change: (inout Rare) -> Void) {
            if rare == nil {
                rare = RareBox(Rare())
            } else if !isKnownUniquelyReferenced(&rare) {
                rare = RareBox(rare!.value)
            }
            change(&rare!.value)
        }

        static func == (lhs: Progress, rhs: Progress) -> Bool {
            lhs.body == rhs.body && lhs.requestComplete == rhs.requestComplete
                && lhs.receivedBytes == rhs.receivedBytes && lhs.attempts == rhs.attempts
                && lhs.nextGeneration == rhs.nextGeneration && lhs.endpoint == rhs.endpoint
                && (lhs.rare === rhs.rare || (lhs.rare?.value ?? Rare()) == (rhs.rare?.value ?? Rare()))
        }

        private struct Rare: Equatable {
            var token: ManagedToken?
            var replayedAfterRefresh = false
            var previousDelay: Duration?
            var retryReasons: [RetryCondition] = []
            var giveUp: GiveUpReason?
            var giveUpCondition: RetryCondition?
            var lastFailure: TransportFailure?
            var retriedFailure: TransportFailure?
            var avoidEndpoint: Int?
            var retryAfter: Int?
            var wakesOnNetworkChange = false
            var hedges = HedgeTally()
            var copyRefused = false
        }

        private final class RareBox {
            var value: Rare
            init(_ value: Rare) { self.value = value }
        }
    }

    /// The response being relayed: attempt `generation`'s, whose head had `status` (when it last made progress is
    /// `relayedAt`).
    struct Relaying: Equatable {
        var generation: Int
        var status: Int
        var error: ProxyErrorReason?
    }

    /// The upstream rejected the token of `attempt`; its head (and any events after it) wait for the refresh.
    struct Refresh: Equatable {
        var attempt: Attempt
        var held: UpstreamResponseHead
        var events: [TransportEvent] = []
    }

    /// Where the exchange is. What every live state carries besides (the body's progress, the record so far) is
    /// `progress`, beside the state.
    enum State: Equatable {
        case receivingBody
        case acquiringCredential
        case attempting(AttemptSet)
        /// Boxed (`indirect`): rare, and large enough to make every other state copy cost more.
        indirect case awaitingRetryPermit(PendingRetry)
        /// Inline: once per attempt of every upstream (each chooses an endpoint), and no larger than `.attempting`.
        case awaitingEndpoint(PendingStart)
        indirect case awaitingRefresh(Refresh)
        case backingOff(until: Duration)
        case relaying(Relaying)
        case done
    }

    /// Inline: the connection's machine changes its exchange in place and never copies it
    /// (`ConnectionStateMachine.Active.withExchange`).
    let configuration: Configuration
    let startedAt: Duration
    private(set) var state: State
    /// The request body's progress and the record so far, in every live state; left as it was once `done`. Beside
    /// the state rather than in each of its cases, so that an event changes the fields it changes in place instead of
    /// copying the whole state out and back (docs/performance.md#the-request-cores-values).
    private(set) var progress: Progress
    /// While `.relaying`: when the response last made progress (its head, a body part, the client draining), which
    /// `timeouts.idle` runs from. Beside the state rather than in `Relaying`, so that each body part writes one field
    /// instead of copying the state out and back (docs/performance.md#smaller-per-request-costs).
    private(set) var relayedAt: Duration = .zero

    /// `firstGeneration`: the generation of this exchange's first attempt, above every earlier one on the
    /// connection (so that a late event of an earlier request's attempt is stale here too).
    init(configuration: Configuration, now: Duration, firstGeneration: Int = 1) {
        self.configuration = configuration
        self.startedAt = now
        self.state = .receivingBody
        self.progress = Progress(nextGeneration: firstGeneration)
    }

    var isDone: Bool { if case .done = state { true } else { false } }

    /// `body` on this machine in place: what `ConnectionStateMachine` reaches its optional exchange through.
    mutating func applying<R>(_ body: (inout Self) -> R) -> R { body(&self) }

    /// The generation whose response is being relayed, if any.
    var relayingGeneration: Int? { if case .relaying(let relaying) = state { relaying.generation } else { nil } }

    /// The generation the next attempt gets (every earlier one has been handed out); 0 once done.
    var nextGeneration: Int { isDone ? 0 : progress.nextGeneration }

    /// When `timerFired` must be called next, or nil when no deadline is pending.
    var nextDeadline: Duration? {
        switch state {
        case .done, .awaitingRetryPermit, .awaitingEndpoint: nil
        // `timeouts.total` runs from the head: a kept body trickled in slower than that is answered 408.
        case .receivingBody, .acquiringCredential, .awaitingRefresh: totalDeadline
        case .attempting(let attempts): attempts.earliestDeadline
        case .backingOff(let until): until
        case .relaying: relayedAt + configuration.timeouts.idle
        }
    }

    private var totalDeadline: Duration { startedAt + configuration.timeouts.total }

    // Every path below that changes `progress` either sets the state it goes on in or ends the exchange: no event
    // leaves a change to `progress` behind without one to `state`, except where the state's case stays the same.

    // MARK: the request

    /// The head arrived and was routed. Called once, first.
    mutating func start(now: Duration) -> Action {
        guard case .receivingBody = state, progress.body == .none, progress.receivedBytes == 0,
            !progress.requestComplete
        else { preconditionFailure("an exchange starts once, before any other event") }
        guard configuration.hasBody else {
            progress.requestComplete = true
            return prepareAttempt(now: now)
        }
        if let length = configuration.declaredLength, length > configuration.retryBuffer {
            if configuration.bodyMustBeKept {
                return endLocally(.bodyTooLarge, message: Self.signedBodyPastRetryBuffer)
            }
            progress.body = .streaming(complete: false)
            return .beginStreaming
        }
        progress.body = .buffering(0)
        return .none
    }

    /// A body part of `count` bytes arrived.
    mutating func bodyReceived(count: Int, now: Duration) -> Action {
        guard !isDone else { return .none }
        progress.receivedBytes += count
        if progress.receivedBytes > configuration.maxRequestBody { return endLocally(.bodyTooLarge) }
        switch progress.body {
        case .none, .buffered:
            return .none
        case .buffering(let buffered):
            let total = buffered + count
            if total <= configuration.retryBuffer {
                progress.body = .buffering(total)
                return .storeBody
            }
            if configuration.bodyMustBeKept {
                return endLocally(.bodyTooLarge, message: Self.signedBodyPastRetryBuffer)
            }
            progress.body = .streaming(complete: false)
            return .storeBodyAndBeginStreaming
        case .streaming, .spooled:
            return .storeBody
        }
    }

    /// The part just reported does not fit `limits.buffer_memory`: the body is sent as it arrives instead of being
    /// kept (not retryable), as a body above `retry_buffer` is.
    mutating func bufferDenied(now: Duration) -> Action {
        guard !isDone, case .buffering = progress.body else { return .none }
        if configuration.bodyMustBeKept {
            return endLocally(.bodyTooLarge, message: Self.signedBodyWithoutRoom)
        }
        progress.body = .streaming(complete: false)
        return .beginStreaming
    }

    /// The executor turned the body into a stream (`spooled`: kept in the spool as it streams): the attempt starts
    /// now, while the body keeps arriving.
    mutating func streamingBegan(now: Duration, spooled: Bool = false) -> Action {
        guard case .receivingBody = state else { return .none }
        if spooled, case .streaming(let complete) = progress.body { progress.body = .spooled(complete: complete) }
        return prepareAttempt(now: now)
    }

    /// The spool could not write the body (its filesystem is full): it cannot be sent whole, so the request ends
    /// with 507 `spool-full`, attempts in flight let go; a response already under way is cut instead (the executor
    /// failed the body its attempt was reading).
    mutating func spoolFailed(now: Duration) -> Action {
        guard !isDone, case .spooled(let complete) = progress.body else { return .none }
        progress.body = .streaming(complete: complete)
        if case .relaying = state { return .none }
        return endLocally(.spoolFull)
    }

    /// The request's last body byte arrived.
    mutating func bodyEnded(now: Duration) -> Action {
        guard !isDone else { return .none }
        progress.requestComplete = true
        switch progress.body {
        case .none, .buffered:
            return .none
        case .buffering:
            progress.body = .buffered
            return prepareAttempt(now: now)
        case .streaming:
            progress.body = .streaming(complete: true)
            return .finishBodyStream
        case .spooled:
            progress.body = .spooled(complete: true)
            return .finishBodyStream
        }
    }

    // MARK: credentials and attempts

    /// Gets a credential when the upstream needs one, then starts the attempt.
    private mutating func prepareAttempt(now: Duration) -> Action {
        if case .none = configuration.credential { return startAttempt(credential: .none, now: now) }
        state = .acquiringCredential
        return .acquireCredential
    }

    /// The credential for the next attempt, or nil when none can be had.
    mutating func credentialAcquired(_ credential: Credential?, now: Duration) -> Action {
        guard case .acquiringCredential = state else {
            guard case .attempting(let attempts) = state, case .acquiringCredential = attempts.nextCopy else {
                return .none
            }
            return copyCredential(credential, attempts, now: now)
        }
        guard let credential else { return endLocally(.tokenUnavailable) }
        return startAttempt(credential: credential, now: now)
    }

    /// Asks for the endpoint first when the upstream has them (`.chooseEndpoint`), then starts the attempt.
    private mutating func startAttempt(credential: Credential, replacing: Int? = nil, now: Duration) -> Action {
        guard configuration.choosesEndpoint else {
            return beginAttempt(credential: credential, replacing: replacing, endpoint: nil, now: now)
        }
        state = .awaitingEndpoint(PendingStart(credential: credential, replacing: replacing))
        return .chooseEndpoint(avoiding: progress.avoidEndpoint.map { [$0] } ?? [])
    }

    /// The upstream's endpoint set answered `.chooseEndpoint`: start the attempt there, or, with every endpoint
    /// ejected, answer 503 `circuit-open` at once (not an attempt). Stale when the exchange ended meanwhile.
    mutating func endpointChosen(_ verdict: EndpointVerdict, now: Duration) -> Action {
        guard case .awaitingEndpoint(let pending) = state else {
            guard case .attempting(var attempts) = state, case .choosingEndpoint(let credential) = attempts.nextCopy
            else { return .none }
            guard case .attempt(let ticket) = verdict else {
                // No endpoint for a copy: the attempts in flight go on alone.
                attempts.nextCopy = .none
                state = .attempting(attempts)
                return .none
            }
            return startCopy(attempts, credential: credential, endpoint: ticket, now: now)
        }
        switch verdict {
        case .attempt(let ticket):
            if progress.avoidEndpoint != nil { progress.avoidEndpoint = nil }
            return beginAttempt(
                credential: pending.credential, replacing: pending.replacing, endpoint: ticket, now: now)
        case .circuitOpen(let retryAfter):
            // A retry whose endpoints were all ejected during its backoff ends as the attempt it retries failed, when
            // that failed without a response (a response retried is gone by now: `circuit-open` then).
            if progress.attempts > 0, let failure = progress.retriedFailure {
                progress.giveUp = .circuitOpen
                progress.giveUpCondition = progress.retryReasons.last
                return endLocally(Self.classify(failure).1)
            }
            progress.retryAfter = retryAfter
            return endLocally(.circuitOpen)
        }
    }

    private mutating func beginAttempt(
        credential: Credential, replacing: Int?, endpoint: EndpointTicket?, now: Duration
    ) -> Action {
        let attempt = newAttempt(credential: credential, endpoint: endpoint, hedge: false, now: now)
        state = .attempting(AttemptSet(attempt, nextCopy: nextCopy(inFlight: 1, now: now)))
        return .startAttempt(
            Start(
                generation: attempt.generation, attempt: progress.attempts, credential: credential,
                mayResend: mayResend(), countsAsRequest: progress.attempts == 1 && configuration.retry != nil,
                replacing: replacing, endpoint: endpoint?.endpoint))
    }

    /// Counts an attempt and gives it the next generation and its deadline: `per_try`, or what is left of `total`.
    private mutating func newAttempt(
        credential: Credential, endpoint: EndpointTicket?, hedge: Bool, now: Duration
    ) -> Attempt {
        progress.attempts += 1
        let generation = progress.nextGeneration
        progress.nextGeneration += 1
        if case .token(let managed) = credential { progress.token = managed }
        if let endpoint { progress.endpoint = endpoint.endpoint }
        let remaining = totalDeadline - now
        let isTotal = remaining <= configuration.timeouts.perTry
        let deadline = now + (isTotal ? max(remaining, .zero) : configuration.timeouts.perTry)
        return Attempt(
            generation: generation, deadline: deadline, deadlineIsTotal: isTotal, endpoint: endpoint, hedge: hedge)
    }

    // MARK: hedged copies (docs/reference/behaviour.md#hedging)

    /// Whether a copy may be sent now beside `inFlight` attempts: the request may be hedged and its body is replayable
    /// (none, or kept whole), fewer than `hedge.max` copies are in flight, and attempts and time are left.
    private func mayCopy(inFlight: Int, now: Duration) -> Bool {
        guard let plan = configuration.hedge, let retry = configuration.retry else { return false }
        // A spooled body is replayable too, but only a body sent whole at once is copied: one still streaming in
        // would be read by two attempts at once from a file still being written.
        let whole: Bool =
            switch progress.body {
            case .none, .buffered: true
            case .buffering, .streaming, .spooled: false
            }
        return whole && inFlight <= plan.max && progress.attempts < retry.config.attempts && now < totalDeadline
    }

    /// The hedge timer for a set of `inFlight` attempts, one of them sent `now`.
    private func nextCopy(inFlight: Int, now: Duration) -> NextCopy {
        guard let plan = configuration.hedge, !progress.copyRefused, mayCopy(inFlight: inFlight, now: now + plan.after)
        else { return .none }
        return .due(now + plan.after)
    }

    /// The hedge timer is due: the copy asks the budget first, as a retry does.
    private mutating func hedgeDue(_ attempts: AttemptSet, now: Duration) -> Action {
        var attempts = attempts
        guard mayCopy(inFlight: attempts.count, now: now) else {
            attempts.nextCopy = .none
            state = .attempting(attempts)
            return .none
        }
        attempts.nextCopy = .askingBudget
        state = .attempting(attempts)
        return .requestHedgePermit
    }

    /// The budget allowed a copy: its credential next, when the upstream needs one, then its endpoint.
    private mutating func copyPermitted(_ granted: Bool, _ attempts: AttemptSet, now: Duration) -> Action {
        var attempts = attempts
        guard granted else {
            attempts.nextCopy = .none
            progress.copyRefused = true
            state = .attempting(attempts)
            return .none
        }
        if case .none = configuration.credential {
            return copyCredential(Credential.none, attempts, now: now)
        }
        attempts.nextCopy = .acquiringCredential
        state = .attempting(attempts)
        return .acquireCredential
    }

    /// The copy's credential (nil: none to be had: no copy); its endpoint next, passing over those in flight.
    private mutating func copyCredential(_ credential: Credential?, _ attempts: AttemptSet, now: Duration) -> Action {
        var attempts = attempts
        guard let credential else {
            attempts.nextCopy = .none
            state = .attempting(attempts)
            return .none
        }
        guard configuration.choosesEndpoint else {
            return startCopy(attempts, credential: credential, endpoint: nil, now: now)
        }
        attempts.nextCopy = .choosingEndpoint(credential)
        state = .attempting(attempts)
        return .chooseEndpoint(avoiding: attempts.endpoints, copy: true)
    }

    /// Sends the copy beside the attempts in flight; the timer is set for the one after it, if any may follow.
    private mutating func startCopy(
        _ attempts: AttemptSet, credential: Credential, endpoint: EndpointTicket?, now: Duration
    ) -> Action {
        var attempts = attempts
        let attempt = newAttempt(credential: credential, endpoint: endpoint, hedge: true, now: now)
        attempts.add(attempt)
        attempts.nextCopy = nextCopy(inFlight: attempts.count, now: now)
        state = .attempting(attempts)
        return .startAttempt(
            Start(
                generation: attempt.generation, attempt: progress.attempts, credential: credential,
                mayResend: mayResend(), countsAsRequest: false, replacing: nil, endpoint: endpoint?.endpoint,
                hedge: true))
    }

    /// Attempt `attempt` ended without a head to deliver while others are in flight: it leaves the set, and no retry
    /// is decided until the last one ends. A place for a copy opens: the timer is set again when none is due.
    private mutating func leave(
        _ attempt: Attempt, report: AttemptReport, outcome: AttemptOutcome?, failure: TransportFailure?,
        disposal: Disposal, _ attempts: AttemptSet, now: Duration
    ) -> Action {
        var attempts = attempts
        attempts.remove(attempt.generation)
        if let failure { progress.lastFailure = failure }
        if let ticket = attempt.endpoint { progress.endpoint = ticket.endpoint }
        if attempt.hedge { progress.hedges.lost &+= 1 }
        if case .none = attempts.nextCopy { attempts.nextCopy = nextCopy(inFlight: attempts.count, now: now) }
        state = .attempting(attempts)
        return .attemptLeft(
            AttemptLeft(
                generation: attempt.generation, report: report, endpoint: endpointReport(attempt, outcome),
                disposal: disposal))
    }

    private func mayResend() -> Bool {
        if let retry = configuration.retry { return retry.mayRepeat(retryRequest()) }
        return RetryConfig.defaultMethods.contains(configuration.method)
    }

    /// What attempt `attempt`'s end (as `outcome`; nil: it was let go unanswered) means for its endpoint; nil when
    /// it was given none.
    private func endpointReport(_ attempt: Attempt?, _ outcome: AttemptOutcome?) -> EndpointReport? {
        guard let ticket = attempt?.endpoint else { return nil }
        return EndpointReport(
            ticket: ticket, outcome: EndpointOutcome(outcome, retryOn: configuration.retry?.config.on ?? []))
    }

    private func retryRequest() -> RetryRequestInfo {
        RetryRequestInfo(
            method: configuration.method, hasIdempotencyKey: configuration.hasIdempotencyKey,
            bodyReplayable: progress.body.replayable)
    }

    // MARK: transport events

    /// A response head of attempt `generation` arrived.
    mutating func responseHead(
        _ head: UpstreamResponseHead, generation: Int, now: Duration, wall: Double,
        random: inout some RandomNumberGenerator
    ) -> Action {
        switch state {
        case .attempting(let attempts):
            guard let attempt = attempts.attempt(generation) else { return .none }
            let report = AttemptReport.response(status: head.status, version: head.version)
            let outcome = AttemptOutcome.response(
                status: head.status, retryAfter: head.retryAfter, rateLimitReset: head.rateLimitReset)
            let alone = attempts.count == 1
            // The access line names the endpoint of the attempt that ended last (the one that answered).
            if let ticket = attempt.endpoint { progress.endpoint = ticket.endpoint }
            let small = head.contentLength.map { $0 <= Configuration.smallResponseLimit } ?? false
            let disposal: Disposal = small ? .abandon(within: configuration.timeouts.idle) : .cancel
            // Backstop forwards no `Upgrade` (a hop-by-hop field), so a 101 answers a question nobody asked: what
            // follows it is not HTTP, and relaying it would hand the client a foreign protocol.
            if head.status == 101 {
                let failure = TransportFailure.badResponse(
                    detail: "101 Switching Protocols to a request that asked for no upgrade")
                guard alone else {
                    return leave(
                        attempt, report: report, outcome: Self.classify(failure).0, failure: failure,
                        disposal: .cancel, attempts, now: now)
                }
                return attemptFailed(
                    failure, generation: generation, report: report, disposal: .cancel, now: now, wall: wall,
                    random: &random)
            }
            if case .oauth2(let refreshOn) = configuration.credential, refreshOn.contains(head.status),
                !progress.replayedAfterRefresh, progress.body.replayable, let rejected = progress.token
            {
                guard alone else {
                    // The token the copies carry was refused: no further copy goes out with it (one already
                    // past the budget goes on); the last attempt in flight to be refused refreshes it.
                    progress.copyRefused = true
                    var attempts = attempts
                    if case .due = attempts.nextCopy { attempts.nextCopy = .none }
                    return leave(
                        attempt, report: report, outcome: outcome, failure: nil, disposal: .cancel, attempts, now: now)
                }
                if attempt.hedge { progress.hedges.lost &+= 1 }
                state = .awaitingRefresh(Refresh(attempt: attempt, held: head))
                return .refreshCredential(
                    rejected: rejected, report: report, endpoint: endpointReport(attempt, outcome))
            }
            // Scanned, not hashed (as `EndpointOutcome` does): a handful of conditions, checked for every head.
            let retryable = configuration.retry?.config.on.contains(where: { $0 == .status(head.status) }) ?? false
            if retryable {
                // A `retry.on` status does not win a hedge race: the attempts still in flight may.
                guard alone else {
                    return leave(
                        attempt, report: report, outcome: outcome, failure: nil, disposal: disposal, attempts, now: now)
                }
                // A copy that got one lost, even when its head is the answer (no retry is left).
                if attempt.hedge { progress.hedges.lost &+= 1 }
                switch considerRetry(outcome, now: now, wall: wall, random: &random) {
                case .retry(let delay, let reason):
                    if let ticket = attempt.endpoint { progress.avoidEndpoint = ticket.endpoint }
                    state = .awaitingRetryPermit(
                        PendingRetry(
                            generation: generation, delay: delay, reason: reason, disposal: disposal, failure: nil,
                            fallback: .deliver(head)))
                    return .requestRetryPermit(report: report, endpoint: endpointReport(attempt, outcome))
                case .giveUp:
                    break
                }
            }
            // The head wins: the other attempts in flight, if any, are let go.
            if attempt.hedge, !retryable { progress.hedges.won &+= 1 }
            var cancel: [LetGo] = []
            if !alone {
                var hedges = progress.hedges
                cancel = letGo(attempts, except: generation, &hedges)
                progress.hedges = hedges
            }
            return deliver(
                head, generation: generation, error: nil, report: report, now: now,
                endpoint: endpointReport(attempt, outcome), cancel: cancel)
        case .awaitingRetryPermit(var pending) where pending.generation == generation:
            pending.held.append(.head(head))
            state = .awaitingRetryPermit(pending)
            return .none
        default:
            return .none
        }
    }

    private mutating func deliver(
        _ head: UpstreamResponseHead, generation: Int, error: ProxyErrorReason?, report: AttemptReport?,
        now: Duration, replay: [TransportEvent] = [], endpoint: EndpointReport? = nil, cancel: [LetGo] = []
    ) -> Action {
        state = .relaying(Relaying(generation: generation, status: head.status, error: error))
        relayedAt = now
        return .deliverHead(
            head,
            Delivery(
                generation: generation, error: error, attempts: progress.attempts, report: report, endpoint: endpoint,
                cancel: cancel, replay: replay))
    }

    /// The attempts of `attempts` other than `generation`, let go unanswered (copies among them counted as
    /// cancelled).
    private func letGo(_ attempts: AttemptSet, except generation: Int?, _ hedges: inout HedgeTally) -> [LetGo] {
        var letGo: [LetGo] = []
        for other in attempts.all where other.generation != generation {
            if other.hedge { hedges.cancelled &+= 1 }
            letGo.append(LetGo(generation: other.generation, endpoint: endpointReport(other, nil)))
        }
        return letGo
    }

    /// Body bytes of attempt `generation`.
    mutating func responseBody(_ buffer: ByteBuffer, generation: Int, now: Duration) -> Action {
        switch state {
        case .relaying(let relaying) where relaying.generation == generation:
            relayedAt = now
            return .relayBody(buffer)
        case .awaitingRefresh(var refresh) where refresh.attempt.generation == generation:
            refresh.events.append(.body(buffer))
            state = .awaitingRefresh(refresh)
            return .none
        case .awaitingRetryPermit(var pending) where pending.generation == generation:
            pending.held.append(.body(buffer))
            state = .awaitingRetryPermit(pending)
            return .none
        default:
            return .none
        }
    }

    /// Attempt `generation` ended normally.
    mutating func responseEnded(generation: Int) -> Action {
        switch state {
        case .relaying(let relaying) where relaying.generation == generation:
            return end(.completed(requestComplete: progress.requestComplete), status: relaying.status)
        case .awaitingRefresh(var refresh) where refresh.attempt.generation == generation:
            refresh.events.append(.end)
            state = .awaitingRefresh(refresh)
            return .none
        case .awaitingRetryPermit(var pending) where pending.generation == generation:
            pending.held.append(.end)
            state = .awaitingRetryPermit(pending)
            return .none
        default:
            return .none
        }
    }

    /// Attempt `generation` failed below HTTP.
    mutating func transportFailed(
        _ failure: TransportFailure, generation: Int, now: Duration, wall: Double,
        random: inout some RandomNumberGenerator
    ) -> Action {
        switch state {
        case .relaying(let relaying) where relaying.generation == generation:
            progress.lastFailure = failure
            return end(.aborted(.upstreamBrokeMidResponse), status: relaying.status)
        case .awaitingRefresh(var refresh) where refresh.attempt.generation == generation:
            refresh.events.append(.failure(failure))
            state = .awaitingRefresh(refresh)
            return .none
        case .awaitingRetryPermit(var pending) where pending.generation == generation:
            pending.held.append(.failure(failure))
            state = .awaitingRetryPermit(pending)
            return .none
        case .attempting(let attempts):
            guard let attempt = attempts.attempt(generation) else { return .none }
            guard attempts.count == 1 else {
                return leave(
                    attempt, report: .failed(failure), outcome: Self.classify(failure).0, failure: failure,
                    disposal: .none, attempts, now: now)
            }
            return attemptFailed(
                failure, generation: generation, report: .failed(failure), disposal: .none, now: now, wall: wall,
                random: &random)
        default:
            return .none
        }
    }

    private mutating func attemptFailed(
        _ failure: TransportFailure, generation: Int, report: AttemptReport, disposal: Disposal, now: Duration,
        wall: Double, random: inout some RandomNumberGenerator
    ) -> Action {
        progress.lastFailure = failure
        let (outcome, reason) = Self.classify(failure)
        let attempt: Attempt? =
            if case .attempting(let attempts) = state { attempts.attempt(generation) } else { nil }
        if attempt?.hedge == true { progress.hedges.lost &+= 1 }
        if let ticket = attempt?.endpoint { progress.endpoint = ticket.endpoint }
        let endpoint = endpointReport(attempt, outcome)
        if let outcome,
            case .retry(let delay, let condition) = considerRetry(outcome, now: now, wall: wall, random: &random)
        {
            if let ticket = attempt?.endpoint { progress.avoidEndpoint = ticket.endpoint }
            state = .awaitingRetryPermit(
                PendingRetry(
                    generation: generation, delay: delay, reason: condition, disposal: disposal, failure: failure,
                    fallback: .fail(reason)))
            return .requestRetryPermit(report: report, endpoint: endpoint)
        }
        return endLocally(reason, report: report, endpoint: endpoint)
    }

    /// A failure's retry condition (nil: never retried) and the error the client gets if it is the last.
    static func classify(_ failure: TransportFailure) -> (AttemptOutcome?, ProxyErrorReason) {
        switch failure {
        case .connectFailure: (.connectFailure, .upstreamUnreachable)
        case .tlsVerificationFailed: (nil, .upstreamUnreachable)
        case .reset: (.reset, .upstreamUnreachable)
        case .badResponse: (.reset, .badUpstreamResponse)
        case .timeout: (.timeout, .upstreamTimeout)
        case .cancelled: (nil, .upstreamUnreachable)
        case .shutDown: (nil, .shuttingDown)
        case .requestBodyFailed: (nil, .badRequest)
        case .loopDetected: (nil, .loopDetected)
        case .destinationDenied: (nil, .destinationDenied)
        }
    }

    /// The policy's answer before the budget; a refusal is noted in `progress` for the logs.
    private mutating func considerRetry(
        _ outcome: AttemptOutcome, now: Duration, wall: Double, random: inout some RandomNumberGenerator
    ) -> RetryDecision {
        let decision: RetryDecision
        if let policy = configuration.retry {
            decision = policy.decideBeforeBudget(
                attempt: progress.attempts, outcome: outcome, request: retryRequest(),
                elapsed: now - startedAt, previousDelay: progress.previousDelay, nowWall: wall, random: &random)
        } else {
            decision = .giveUp(.notRetryableCondition)
        }
        if case .giveUp(let reason) = decision {
            progress.giveUp = reason
            progress.giveUpCondition = outcome.condition
        }
        return decision
    }

    /// The answer to `.requestRetryPermit`: whether an endpoint may take the retry now (`endpointOpen`: false when
    /// every endpoint is ejected, this attempt's failure perhaps the one that ejected the last) and whether the
    /// upstream's retry budget granted it. Without either the request ends as its last attempt did — the upstream's
    /// response, or the failure's 502/504 — not with `circuit-open`: something was sent
    /// (docs/reference/behaviour.md#failing-fast). Stale (ignored) when the exchange ended meanwhile.
    mutating func retryPermit(granted: Bool, endpointOpen: Bool = true, now: Duration) -> Action {
        guard case .awaitingRetryPermit(let pending) = state else {
            guard case .attempting(let attempts) = state, case .askingBudget = attempts.nextCopy else {
                return .none
            }
            return copyPermitted(granted, attempts, now: now)
        }
        guard granted, endpointOpen else {
            progress.giveUp = endpointOpen ? .budgetExhausted : .circuitOpen
            progress.giveUpCondition = pending.reason
            switch pending.fallback {
            case .deliver(let head):
                return deliver(
                    head, generation: pending.generation, error: nil, report: nil, now: now, replay: pending.held)
            case .fail(let reason):
                return endLocally(reason, report: nil)
            }
        }
        progress.previousDelay = pending.delay
        progress.retryReasons.append(pending.reason)
        if pending.failure != progress.retriedFailure { progress.retriedFailure = pending.failure }
        var wakes = false
        if configuration.networkReturn, case .connectFailure(_, _?) = pending.failure { wakes = true }
        if wakes != progress.wakesOnNetworkChange { progress.wakesOnNetworkChange = wakes }
        state = .backingOff(until: now + pending.delay)
        return .retry(
            Retry(
                attempt: progress.attempts, after: pending.delay, reason: pending.reason,
                generation: pending.generation,
                disposal: pending.disposal, failure: pending.failure, wakesOnNetworkChange: wakes))
    }

    /// The host's network changed (a link up, an address or a route added): a backoff after a failure for want of
    /// a usable network ends now (docs/reference/behaviour.md#the-network-coming-back); anything else goes on.
    mutating func networkChanged(now: Duration) -> Action {
        guard case .backingOff = state, progress.wakesOnNetworkChange else { return .none }
        progress.wakesOnNetworkChange = false
        return prepareAttempt(now: now)
    }

    // MARK: token refresh

    /// The refresh asked for by `.refreshCredential` ended: replay once with `replacement`, or deliver the held
    /// response with `token-refresh-failed`.
    mutating func refreshFinished(_ replacement: ManagedToken?, now: Duration) -> Action {
        guard case .awaitingRefresh(let refresh) = state else { return .none }
        guard let replacement else {
            return deliver(
                refresh.held, generation: refresh.attempt.generation, error: .tokenRefreshFailed, report: nil,
                now: now, replay: refresh.events)
        }
        progress.replayedAfterRefresh = true
        // The replay follows a response, not the failure an earlier retry was for.
        if progress.retriedFailure != nil { progress.retriedFailure = nil }
        return startAttempt(credential: .token(replacement), replacing: refresh.attempt.generation, now: now)
    }

    // MARK: time

    /// The connection's timer fired: handle whichever deadline passed.
    mutating func timerFired(now: Duration, wall: Double, random: inout some RandomNumberGenerator) -> Action {
        guard let deadline = nextDeadline, now >= deadline else { return .none }
        switch state {
        case .done, .awaitingRetryPermit, .awaitingEndpoint:
            return .none
        case .receivingBody:
            return endLocally(.requestTimeout)
        case .acquiringCredential:
            return endLocally(.tokenUnavailable)
        case .attempting(let attempts):
            guard let due = attempts.due(at: now) else {
                if case .due(let at) = attempts.nextCopy, at <= now { return hedgeDue(attempts, now: now) }
                return .none
            }
            if due.deadlineIsTotal {
                return endLocally(
                    .upstreamTimeout, report: .failed(.timeout(detail: "total timeout")),
                    endpoint: endpointReport(due, .timeout), settled: due.generation)
            }
            let failure = TransportFailure.timeout(detail: "per_try timeout")
            guard attempts.count == 1 else {
                return leave(
                    due, report: .failed(failure), outcome: .timeout, failure: failure, disposal: .cancel, attempts,
                    now: now)
            }
            return attemptFailed(
                failure, generation: due.generation, report: .failed(failure), disposal: .cancel, now: now,
                wall: wall, random: &random)
        case .awaitingRefresh(let refresh):
            // The refresh outlived the request's budget: answer with what the upstream said.
            return deliver(
                refresh.held, generation: refresh.attempt.generation, error: .tokenRefreshFailed, report: nil,
                now: now, replay: refresh.events)
        case .backingOff:
            return prepareAttempt(now: now)
        case .relaying(let relaying):
            return end(.aborted(.responseBodyIdle), status: relaying.status)
        }
    }

    // MARK: the client

    /// The client took bytes of the response (its socket drained, or a batch written under backpressure went into
    /// it): the response is making progress.
    mutating func clientTookBytes(now: Duration) {
        guard case .relaying = state else { return }
        relayedAt = now
    }

    /// The connection's framing counter found the upstream's body longer or shorter than the `Content-Length` the
    /// client was told: the response ends by closing the connection.
    mutating func framingBroken(_ cause: AbortCause) -> Action {
        guard case .relaying(let relaying) = state else { return .none }
        return end(.aborted(cause), status: relaying.status)
    }

    /// The client stopped sending its body for `client_idle_timeout`.
    mutating func clientStalled() -> Action {
        switch state {
        case .done:
            return .none
        case .relaying(let relaying):
            return end(.aborted(.requestBodyStalled), status: relaying.status)
        case .attempting(let attempts):
            return endLocally(
                .requestTimeout, endpoint: endpointReport(attempts.first, nil), settled: attempts.first.generation)
        case .receivingBody, .acquiringCredential, .awaitingRetryPermit, .awaitingRefresh, .backingOff,
            .awaitingEndpoint:
            return endLocally(.requestTimeout)
        }
    }

    /// The client disconnected: everything stops, pending retries included.
    /// The rest of the client's request could not be read (a malformed chunk, trailers too large: `reason`): the
    /// request ends with that answer of its own, or, once its response is under way, by cutting it. It is not
    /// complete, so nothing more of it is read and the connection closes.
    mutating func requestUnreadable(_ reason: ProxyErrorReason) -> Action {
        guard !isDone else { return .none }
        progress.requestComplete = false
        return endLocally(reason, unreadable: true)
    }

    mutating func clientGone() -> Action {
        switch state {
        case .done:
            return .none
        case .attempting(let attempts):
            // An attempt in flight is let go unanswered: it tells nothing about its endpoint (its probe permit is
            // freed).
            return end(
                .clientClosed, status: 499, endpoint: endpointReport(attempts.first, nil),
                settled: attempts.first.generation)
        default:
            return end(.clientClosed, status: 499)
        }
    }

    // MARK: ending

    /// Ends with a Backstop error, or, once a head went out, by aborting the response.
    /// `settled`: the attempt in flight whose end `report` and `endpoint` describe; the others still in flight are
    /// let go.
    /// The 413 of a signed body that cannot be kept (docs/reference/aws-sigv4.md): `max_request_body` is not the
    /// limit to raise.
    static let signedBodyPastRetryBuffer =
        "the request body must be kept whole to be signed (aws_sigv4 payload: signed) and is larger than "
        + "limits.retry_buffer"
    static let signedBodyWithoutRoom =
        "the request body must be kept whole to be signed (aws_sigv4 payload: signed) and limits.buffer_memory has "
        + "no room for it now"

    /// `message`: the answer's body when the reason's own text would mislead.
    private mutating func endLocally(
        _ reason: ProxyErrorReason, message: String? = nil, unreadable: Bool = false, report: AttemptReport? = nil,
        endpoint: EndpointReport? = nil, settled: Int? = nil
    ) -> Action {
        if case .relaying(let relaying) = state {
            // Only the request can fail once the response is under way: its body grew past `max_request_body`, or
            // the rest of it could not be read.
            assert(unreadable || reason == .bodyTooLarge, "\(reason) while relaying")
            return end(
                .aborted(unreadable ? .requestUnreadable : .requestBodyTooLarge), status: relaying.status,
                report: report, endpoint: endpoint)
        }
        // The request body grew too large while an attempt was in flight: that attempt is let go unanswered.
        var endpoint = endpoint
        var settled = settled
        if endpoint == nil, report == nil, case .attempting(let attempts) = state {
            endpoint = endpointReport(attempts.first, nil)
            settled = attempts.first.generation
        }
        return end(
            .failedLocally(reason, requestComplete: progress.requestComplete), status: reason.status,
            report: report, endpoint: endpoint, settled: settled, message: message)
    }

    /// `settled`: as for `endLocally`. Copies still in flight count as cancelled, the settled one too unless it
    /// failed (`report`).
    private mutating func end(
        _ ending: Ending, status: Int, report: AttemptReport? = nil, endpoint: EndpointReport? = nil,
        settled: Int? = nil, message: String? = nil
    ) -> Action {
        let headError: ProxyErrorReason? = if case .relaying(let relaying) = state { relaying.error } else { nil }
        var hedges = progress.hedges
        var others: [LetGo] = []
        if let settled, case .attempting(let attempts) = state {
            if attempts.attempt(settled)?.hedge == true {
                if report == nil { hedges.cancelled &+= 1 } else { hedges.lost &+= 1 }
            }
            if attempts.count > 1 { others = letGo(attempts, except: settled, &hedges) }
        }
        state = .done
        var record = Record(
            status: status, attempts: progress.attempts, retries: progress.retryReasons, giveUp: progress.giveUp,
            giveUpCondition: progress.giveUpCondition, lastFailure: progress.lastFailure, headError: headError,
            requestComplete: progress.requestComplete, endpoint: progress.endpoint, retryAfter: progress.retryAfter,
            hedges: hedges)
        if let message { record.message = message }
        // The attempt settled on without a report was still in flight: let go unanswered, as are the others.
        let unanswered = UnansweredAttempts(settled: settled != nil && report == nil, copies: others.count)
        if unanswered != UnansweredAttempts() { record.unanswered = unanswered }
        return .end(ending, record, .with(report: report, endpoint: endpoint, letGo: others))
    }
}
