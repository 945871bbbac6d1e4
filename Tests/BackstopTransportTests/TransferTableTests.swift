import Testing

@testable import BackstopTransport

typealias IntTransferTable = TransferTable<Int>
private let refused = TransportFailure.connectFailure(detail: "refused")
private let broke = TransportFailure.reset(detail: "curl=55")

/// `TransferTable`: each transition compared as whole actions, then every short sequence of events checked
/// against the table's invariants.
@Suite("Transfer table")
struct TransferTableTests {
    private func started(_ ids: Int...) -> IntTransferTable {
        var table = IntTransferTable()
        for id in ids {
            #expect(table.start(id, cancelRequested: false) == .begin(id))
            table.began(id)
        }
        return table
    }

    @Test func startBeginsUnlessCancelledOrStopping() {
        var table = IntTransferTable()
        #expect(table.start(1, cancelRequested: false) == .begin(1))
        #expect(table.phase(of: 1) == .queued)
        table.began(1)
        #expect(table.phase(of: 1) == .active(resent: false))
        #expect(table.start(2, cancelRequested: true) == .finish(2, .failure(.cancelled)))
        #expect(table.phase(of: 2) == nil)
        #expect(table.stop() == [.finish(1, .failure(.shutDown))])
        #expect(table.start(3, cancelRequested: false) == .finish(3, .failure(.shutDown)))
        #expect(table.start(4, cancelRequested: true) == .finish(4, .failure(.cancelled)))
        #expect(table.count == 0)
    }

    @Test func aTransferCurlCouldNotTakeFinishesWithWhy() {
        var table = IntTransferTable()
        _ = table.start(1, cancelRequested: false)
        #expect(table.couldNotBegin(1, refused) == .finish(1, .failure(refused)))
        #expect(table.phase(of: 1) == nil)
        #expect(table.cancel(1) == nil)
    }

    /// IntTransferTable-driven: one completion of an active, not yet resent transfer, and what it leads to.
    @Test(arguments: [
        (
            IntTransferTable.Completion.succeeded(headDelivered: true), IntTransferTable.Action.finish(1, .end),
            nil as IntTransferTable.Phase?
        ),
        (
            .succeeded(headDelivered: false),
            .finish(1, .failure(.reset(detail: "upstream closed without a response"))), nil
        ),
        (.refused(.loopDetected(detail: "own")), .finish(1, .failure(.loopDetected(detail: "own"))), nil),
        (.failed(broke, resendable: false), .finish(1, .failure(broke)), nil),
        (.failed(broke, resendable: true), .resend(1, broke), .active(resent: true)),
    ])
    func completion(
        _ completion: IntTransferTable.Completion, _ action: IntTransferTable.Action, _ after: IntTransferTable.Phase?
    ) {
        var table = started(1)
        #expect(table.completed(1, completion) == action)
        #expect(table.phase(of: 1) == after)
    }

    @Test func resentOnceOnly() {
        var table = started(1)
        #expect(table.completed(1, .failed(broke, resendable: true)) == .resend(1, broke))
        #expect(table.completed(1, .failed(broke, resendable: true)) == .finish(1, .failure(broke)))
        var other = started(2)
        #expect(other.completed(2, .failed(broke, resendable: true)) == .resend(2, broke))
        #expect(other.resendFailed(2, broke) == .finish(2, .failure(broke)))
        #expect(other.resendFailed(2, broke) == nil)
    }

    @Test func cancelAndResumeOnlyWhileHeld() {
        var table = started(1)
        #expect(table.resume(1) == .unpause(1))
        #expect(table.cancel(1) == .finish(1, .failure(.cancelled)))
        #expect(table.cancel(1) == nil)
        #expect(table.resume(1) == nil)
        #expect(table.completed(1, .succeeded(headDelivered: true)) == nil)
        _ = table.start(2, cancelRequested: false)
        #expect(table.resume(2) == nil)  // queued: not in curl yet
    }

    @Test func abandonedTransfersFinishOrExpireAtTheirDeadline() {
        var table = started(1, 2, 3)
        table.abandon(1, deadline: 100)
        table.abandon(2, deadline: 50)
        table.abandon(2, deadline: 500)  // the first deadline holds
        #expect(table.phase(of: 2) == .abandoned(deadline: 50, resent: false))
        #expect(table.resume(1) == .unpause(1))
        let early = table.expire(now: 49)
        #expect(early.actions == [] && early.next == 50)
        let timedOut = TransportFailure.timeout(detail: "abandoned response did not finish in time")
        let due = table.expire(now: 50)
        #expect(due.actions == [.finish(2, .failure(timedOut))] && due.next == 100)
        // One that finishes by itself is forgotten, and nothing is left to wait for.
        #expect(table.completed(1, .succeeded(headDelivered: true)) == .finish(1, .end))
        let after = table.expire(now: 60)
        #expect(after.actions == [] && after.next == nil)
        #expect(table.phase(of: 3) == .active(resent: false))
        table.abandon(9, deadline: 1)  // finished or unknown: nothing
        let unknown = table.expire(now: 1_000)
        #expect(unknown.actions == [] && unknown.next == nil)
    }

    @Test func aResentTransferAbandonedKeepsItsResend() {
        var table = started(1)
        #expect(table.completed(1, .failed(broke, resendable: true)) == .resend(1, broke))
        table.abandon(1, deadline: 10)
        #expect(table.phase(of: 1) == .abandoned(deadline: 10, resent: true))
        #expect(table.completed(1, .failed(broke, resendable: true)) == .finish(1, .failure(broke)))
    }

    /// Every sequence of up to four events over two transfers (both started and taken by curl first): each
    /// transfer finishes exactly once and no action names it afterwards, a resend happens at most once per
    /// transfer, an unpause or resend names only a held transfer, and after `stop` nothing is held.
    @Test func everyShortSequenceKeepsTheInvariants() {
        enum Event {
            case cancel(Int), resume(Int), abandon(Int, Int64), completed(Int, IntTransferTable.Completion),
                resendFailed(Int)
            case expire(Int64), stop, start(Int)
        }
        var events: [Event] = [.stop, .start(3), .expire(10), .expire(100)]
        for id in [1, 2] {
            events += [
                .cancel(id), .resume(id), .abandon(id, 10), .resendFailed(id),
                .completed(id, .succeeded(headDelivered: true)), .completed(id, .failed(broke, resendable: true)),
                .completed(id, .failed(broke, resendable: false)),
            ]
        }
        var sequences: [[Event]] = [[]]
        for _ in 0..<4 { sequences = sequences.flatMap { s in events.map { s + [$0] } } }
        #expect(sequences.count == 18 * 18 * 18 * 18)
        for sequence in sequences {
            var table = started(1, 2)
            var finishes: [Int: Int] = [:]
            var resends: [Int: Int] = [:]
            var resendPending: Set<Int> = []
            func record(_ action: IntTransferTable.Action?) {
                switch action {
                case .finish(let id, _)?:
                    finishes[id, default: 0] += 1
                    #expect(finishes[id] == 1, "\(sequence): \(id) finished twice")
                    #expect(table.phase(of: id) == nil, "\(sequence): \(id) finished but held")
                case .resend(let id, _)?:
                    resends[id, default: 0] += 1
                    resendPending.insert(id)
                    #expect(resends[id] == 1, "\(sequence): \(id) resent twice")
                    #expect(finishes[id] == nil && table.phase(of: id) != nil, "\(sequence): resend of a finished one")
                case .unpause(let id)?:
                    #expect(finishes[id] == nil && table.phase(of: id) != nil, "\(sequence): unpause of a finished one")
                case .begin(let id)?:
                    #expect(finishes[id] == nil, "\(sequence): begin after finish")
                    table.began(id)
                case nil:
                    break
                }
            }
            for event in sequence {
                switch event {
                case .cancel(let id): record(table.cancel(id))
                case .resume(let id): record(table.resume(id))
                case .abandon(let id, let deadline): table.abandon(id, deadline: deadline)
                case .completed(let id, let completion): record(table.completed(id, completion))
                case .resendFailed(let id):
                    // Only after a resend the executor could not perform.
                    guard resendPending.remove(id) != nil else { continue }
                    record(table.resendFailed(id, broke))
                case .expire(let now):
                    let (actions, next) = table.expire(now: now)
                    actions.forEach(record)
                    if let next { #expect(next > now, "\(sequence): a past deadline left pending") }
                case .stop:
                    table.stop().forEach(record)
                    #expect(table.count == 0, "\(sequence): held after stop")
                case .start(let id):
                    guard finishes[id] == nil, table.phase(of: id) == nil else { continue }
                    record(table.start(id, cancelRequested: false))
                }
            }
            for id in [1, 2] where finishes[id] == nil {
                #expect(table.phase(of: id) != nil, "\(sequence): \(id) neither finished nor held")
            }
            if table.stopping { #expect(table.count == 0, "\(sequence): held after stop") }
        }
    }
}
