import Testing

@testable import BackstopTransport

typealias H1Machine = HTTP1ConnectionMachine
private let refused = TransportFailure.connectFailure(detail: "refused")

/// `HTTP1ConnectionMachine`: each transition compared as whole actions, then every short sequence of events
/// checked against the machine's invariants.
@Suite("HTTP/1.1 connection machine")
struct HTTP1ConnectionMachineTests {
    /// A machine driven through `events` from a new connection, every action checked.
    private static func driven(
        mayResend: Bool = true, _ steps: [(H1Machine.Event, H1Machine.Action)], reuse: Bool = false
    ) -> H1Machine {
        var machine = H1Machine(mayResend: mayResend)
        for (event, expected) in steps {
            #expect(machine.handle(event) == expected, "\(event)")
        }
        return machine
    }

    /// A connection that served one request and is idle again.
    private static func idle() -> H1Machine {
        driven([
            (.connected, .writeRequest), (.headWritten(bodyFollows: false), .none), (.responseBytes, .none),
            (.headArrived, .none), (.responseEnded(reusable: true), .complete(.succeeded(headDelivered: true))),
            (.detached, .park),
        ])
    }

    @Test func aRequestWithoutBodyGoesThroughEveryPhaseAndParks() {
        var machine = H1Machine(mayResend: true)
        #expect(machine.phase == .connecting)
        #expect(machine.handle(.connected) == .writeRequest)
        #expect(machine.phase == .writingHead)
        #expect(machine.handle(.headWritten(bodyFollows: false)) == .none)
        #expect(machine.phase == .awaitingHead)
        #expect(machine.handle(.responseBytes) == .none)
        #expect(machine.handle(.headArrived) == .none)
        #expect(machine.phase == .readingBody)
        #expect(machine.handle(.responseEnded(reusable: true)) == .complete(.succeeded(headDelivered: true)))
        #expect(machine.phase == .done(reusable: true))
        #expect(machine.handle(.detached) == .park)
        #expect(machine.phase == .idle)
        #expect(machine.reuse(mayResend: false) == .writeRequest)
        #expect(machine.reused)
        #expect(machine.phase == .writingHead)
    }

    @Test func aBodyIsWrittenAfterTheHead() {
        var machine = Self.driven([(.connected, .writeRequest), (.headWritten(bodyFollows: true), .none)])
        #expect(machine.phase == .writingBody)
        #expect(machine.handle(.bodyWritten) == .none)
        #expect(machine.phase == .awaitingHead)
    }

    @Test func anEarlyAnswerEndsTheExchangeAndCostsTheConnection() {
        var machine = Self.driven([
            (.connected, .writeRequest), (.headWritten(bodyFollows: true), .none), (.responseBytes, .none),
            (.headArrived, .none),
        ])
        #expect(machine.phase == .writingBody)
        #expect(machine.handle(.responseEnded(reusable: true)) == .complete(.succeeded(headDelivered: true)))
        #expect(machine.phase == .done(reusable: false))
        #expect(machine.handle(.detached) == .close)
        #expect(machine.phase == .dead)
    }

    @Test func aHeadThatArrivesWhileWritingIsReadOnceTheBodyIsOut() {
        var machine = Self.driven([
            (.connected, .writeRequest), (.headWritten(bodyFollows: true), .none), (.headArrived, .none),
        ])
        #expect(machine.handle(.bodyWritten) == .none)
        #expect(machine.phase == .readingBody)
    }

    @Test func connectFailuresCompleteTheTransferUnresendable() {
        var machine = H1Machine(mayResend: true)
        #expect(machine.handle(.connectFailed(refused)) == .complete(.failed(refused, resendable: false)))
        #expect(machine.phase == .failed)
        #expect(machine.handle(.detached) == .close)
    }

    /// The keep-alive race: only a reused connection that broke before any response byte is resent, and only
    /// a request that may be repeated.
    @Test(arguments: [
        (H1Machine.Event.responseTruncated("eof"), true, true, false, true),
        (.receiveFailed("reset"), true, true, false, true),
        (.sendFailed("pipe"), true, true, false, true),
        (.responseTruncated("eof"), false, true, false, false),
        (.responseTruncated("eof"), true, false, false, false),
        (.responseTruncated("eof"), true, true, true, false),
        (.sendFailed("pipe"), true, true, true, false),
    ])
    func brokenConnectionsAreResentOnlyInTheKeepAliveRace(
        event: H1Machine.Event, reused: Bool, mayResend: Bool, sawBytes: Bool, resendable: Bool
    ) {
        var machine = reused ? Self.idle() : Self.driven(mayResend: mayResend, [(.connected, .writeRequest)])
        if reused { #expect(machine.reuse(mayResend: mayResend) == .writeRequest) }
        #expect(machine.handle(.headWritten(bodyFollows: false)) == .none)
        if sawBytes { #expect(machine.handle(.responseBytes) == .none) }
        let why: String
        switch event {
        case .responseTruncated(let w), .receiveFailed(let w), .sendFailed(let w): why = w
        default: why = ""
        }
        #expect(machine.handle(event) == .complete(.failed(.reset(detail: why), resendable: resendable)))
        #expect(machine.phase == .failed)
        #expect(machine.handle(.detached) == .close)
    }

    @Test func anInvalidResponseIsBadBeforeItsHeadAndAResetAfter() {
        var before = Self.driven([(.connected, .writeRequest), (.headWritten(bodyFollows: false), .none)])
        #expect(
            before.handle(.responseInvalid("framing"))
                == .complete(.failed(.badResponse(detail: "framing"), resendable: false)))
        var after = Self.driven([
            (.connected, .writeRequest), (.headWritten(bodyFollows: false), .none), (.headArrived, .none),
        ])
        #expect(
            after.handle(.responseInvalid("chunk")) == .complete(.failed(.reset(detail: "chunk"), resendable: false)))
    }

    @Test func aBrokenRequestBodyFailsTheTransfer() {
        var machine = Self.driven([(.connected, .writeRequest), (.headWritten(bodyFollows: true), .none)])
        #expect(machine.handle(.requestBodyFailed) == .complete(.failed(.requestBodyFailed, resendable: false)))
        #expect(machine.handle(.detached) == .close)
    }

    @Test func aTransferLettingGoMidExchangeClosesTheConnection() {
        for setup in [
            [(H1Machine.Event.connected, H1Machine.Action.writeRequest)], [],
            [(.connected, .writeRequest), (.headWritten(bodyFollows: false), .none), (.headArrived, .none)],
        ] {
            var machine = Self.driven(setup)
            #expect(machine.handle(.detached) == .close)
            #expect(machine.phase == .dead)
        }
    }

    @Test func anIdleConnectionThatBecomesReadableIsClosed() {
        var machine = Self.idle()
        #expect(machine.handle(.readableWhileIdle) == .close)
        #expect(machine.phase == .dead)
        #expect(machine.handle(.readableWhileIdle) == .none)
    }

    static let events: [H1Machine.Event] = [
        .connected, .connectFailed(refused), .headWritten(bodyFollows: true), .headWritten(bodyFollows: false),
        .bodyWritten, .responseBytes, .headArrived, .responseEnded(reusable: true), .responseEnded(reusable: false),
        .responseInvalid("x"), .responseTruncated("x"), .sendFailed("x"), .receiveFailed("x"), .requestBodyFailed,
        .detached, .readableWhileIdle,
    ]

    /// Every sequence of up to four events from a new and from a reused connection: one completion per request
    /// at most; a connection is parked only after a successful, reusable response and its transfer letting go;
    /// nothing happens to a closed connection; a resend is offered only on a reused connection.
    @Test func everyShortSequenceKeepsTheInvariants() {
        var sequences: [[H1Machine.Event]] = [[]]
        for _ in 0..<4 {
            sequences = sequences.flatMap { prefix in Self.events.map { prefix + [$0] } }
            for start in [false, true] {
                for sequence in sequences {
                    var machine: H1Machine
                    if start {
                        machine = Self.idle()
                        _ = machine.reuse(mayResend: true)
                    } else {
                        machine = H1Machine(mayResend: true)
                    }
                    var completed: TransferCompletion?
                    var closed = false
                    var parked = false
                    for event in sequence {
                        let before = machine.phase
                        let action = machine.handle(event)
                        if closed { #expect(action == .none, "after close: \(sequence)") }
                        if parked && !closed { #expect(action == .none || action == .close, "\(sequence)") }
                        switch action {
                        case .complete(let completion):
                            #expect(completed == nil, "two completions: \(sequence)")
                            completed = completion
                            if case .failed(_, resendable: true) = completion { #expect(start, "\(sequence)") }
                        case .park:
                            #expect(completed == .succeeded(headDelivered: true), "\(sequence)")
                            #expect(before == .done(reusable: true) && event == .detached, "\(sequence)")
                            parked = true
                        case .close:
                            closed = true
                            #expect(machine.phase == .dead)
                        case .writeRequest:
                            #expect(before == .connecting && event == .connected, "\(sequence)")
                        case .none:
                            break
                        }
                    }
                }
            }
        }
    }
}
