/// The lifecycle of every transfer the transport holds, as one state per transfer, driven by the transport's
/// commands and curl's events and answering with the actions to perform. Pure: no curl, no clock (the caller passes
/// the time), no I/O; `CurlMultiTransport` performs the actions. `ID` is the transfer itself there (identity) and a
/// number in the tests.
///
/// A transfer is queued (its start command was taken; its handle is being configured and added to curl), active
/// (curl runs it), abandoned (curl runs it, nobody waits for its events, and it is cancelled at a deadline) or
/// finished (gone from the table). Every transfer the table sees ends with exactly one `.finish`, after which no
/// action names it again; `.resend` happens at most once per transfer.
struct TransferTable<ID: Hashable> {
    /// Where a transfer the table holds stands. A finished transfer is not in the table.
    enum Phase: Equatable {
        case queued
        /// `resent`: it was sent once more on a new connection (`StaleConnection`).
        case active(resent: Bool)
        case abandoned(deadline: Int64, resent: Bool)
    }

    /// How a transfer ends: its last event.
    enum Ending: Equatable {
        case end
        case failure(TransportFailure)
    }

    /// What the transport must do.
    enum Action: Equatable {
        /// Take a handle, configure it and add it to curl; report `began` or `couldNotBegin`.
        case begin(ID)
        /// Take it out of curl (when it was added), recycle its handle, and deliver `Ending` as its last event.
        case finish(ID, Ending)
        /// `curl_easy_pause(CONT)`: the client caught up, or the request body has more.
        case unpause(ID)
        /// Send it again on a new connection; when curl refuses, report `resendFailed` with the failure carried
        /// here (the one the resend was to get past).
        case resend(ID, TransportFailure)
    }

    typealias Completion = TransferCompletion

    private var phases: [ID: Phase] = [:]
    /// Abandoned transfers and their deadlines (monotonic ms), in the order they were abandoned. May hold
    /// transfers that have finished since: `expire` drops those.
    private var deadlines: [(id: ID, deadline: Int64)] = []
    /// After `stop`, every start finishes at once as cancelled.
    private(set) var stopping = false

    /// The phase of `id`, nil when it is finished (or never started).
    func phase(of id: ID) -> Phase? { phases[id] }

    /// Whether an abandoned transfer may be waiting for its deadline (`expire` has something to look at).
    var hasDeadlines: Bool { !deadlines.isEmpty }

    /// How many transfers are queued, active or abandoned.
    var count: Int { phases.count }

    /// The start command of `id` was taken from the queue; `cancelRequested` when its requester cancelled since.
    mutating func start(_ id: ID, cancelRequested: Bool) -> Action {
        if stopping || cancelRequested {
            precondition(phases[id] == nil, "a transfer starts once")
            return .finish(id, .failure(cancelRequested ? .cancelled : .shutDown))
        }
        // One hash per event on the common path: `updateValue` and `removeValue` return what was there.
        let previous = phases.updateValue(.queued, forKey: id)
        precondition(previous == nil, "a transfer starts once")
        return .begin(id)
    }

    /// curl took the queued transfer.
    mutating func began(_ id: ID) {
        let previous = phases.updateValue(.active(resent: false), forKey: id)
        precondition(previous == .queued, "began while \(String(describing: previous))")
    }

    /// The queued transfer could not be handed to curl (no handle, an option refused, the multi handle refused it).
    mutating func couldNotBegin(_ id: ID, _ failure: TransportFailure) -> Action {
        guard phases[id] == .queued else {
            preconditionFailure("couldNotBegin(\(id)) while \(String(describing: phases[id]))")
        }
        return finished(id, .failure(failure))
    }

    /// The requester cancelled: a transfer still held ends as cancelled; a finished one has sent its last event.
    mutating func cancel(_ id: ID) -> Action? {
        guard phases.removeValue(forKey: id) != nil else { return nil }
        return .finish(id, .failure(.cancelled))
    }

    /// The requester's side has room again (body consumed, or more request body): unpause a running transfer.
    func resume(_ id: ID) -> Action? {
        switch phases[id] {
        case .active?, .abandoned?: .unpause(id)
        case .queued?, nil: nil
        }
    }

    /// Nobody waits for the events any more; the transfer may finish (so curl keeps its connection) until
    /// `deadline`. Abandoning twice keeps the first deadline.
    mutating func abandon(_ id: ID, deadline: Int64) {
        guard case .active(let resent)? = phases[id] else { return }
        phases[id] = .abandoned(deadline: deadline, resent: resent)
        deadlines.append((id, deadline))
    }

    /// curl reported the transfer done.
    mutating func completed(_ id: ID, _ completion: Completion) -> Action? {
        // Taken out first (one hash for the common case, a finish); put back only for a resend.
        let phase = phases.removeValue(forKey: id)
        let resent: Bool
        switch phase {
        case .active(let r)?, .abandoned(_, let r)?: resent = r
        case .queued?:
            // curl knows only added transfers: a queued one cannot complete.
            preconditionFailure("completed while queued")
        case nil:
            return nil  // finished already: nothing to finish twice
        }
        switch completion {
        case .refused(let why):
            return .finish(id, .failure(why))
        case .succeeded(headDelivered: true):
            return .finish(id, .end)
        case .succeeded(headDelivered: false):
            return .finish(id, .failure(.reset(detail: "upstream closed without a response")))
        case .failed(let failure, resendable: true) where !resent:
            if case .abandoned(let deadline, _)? = phase {
                phases[id] = .abandoned(deadline: deadline, resent: true)
            } else {
                phases[id] = .active(resent: true)
            }
            return .resend(id, failure)
        case .failed(let failure, _):
            return .finish(id, .failure(failure))
        }
    }

    /// curl refused the resend (`curl_multi_add_handle` failed): the transfer ends with the failure it had.
    mutating func resendFailed(_ id: ID, _ failure: TransportFailure) -> Action? {
        guard phases.removeValue(forKey: id) != nil else { return nil }
        return .finish(id, .failure(failure))
    }

    /// Abandoned transfers past their deadline at `now` are cancelled as timed out. Returns them and the next
    /// deadline still pending (nil: none).
    mutating func expire(now: Int64) -> (actions: [Action], next: Int64?) {
        guard !deadlines.isEmpty else { return ([], nil) }
        var actions: [Action] = []
        var next: Int64?
        var kept: [(id: ID, deadline: Int64)] = []
        for entry in deadlines {
            guard case .abandoned? = phases[entry.id] else { continue }  // finished since
            if now >= entry.deadline {
                actions.append(
                    finished(entry.id, .failure(.timeout(detail: "abandoned response did not finish in time"))))
            } else {
                next = min(next ?? entry.deadline, entry.deadline)
                kept.append(entry)
            }
        }
        deadlines = kept
        return (actions, next)
    }

    /// The transport stops: every transfer it holds ends as shut down, and later starts end at once.
    mutating func stop() -> [Action] {
        stopping = true
        return cutAll()
    }

    /// Every transfer held ends as shut down (a drain that gives up on what is in flight); new ones may start.
    mutating func cutAll() -> [Action] {
        let actions = phases.keys.map { Action.finish($0, .failure(.shutDown)) }
        phases.removeAll()
        deadlines.removeAll()
        return actions
    }

    private mutating func finished(_ id: ID, _ ending: Ending) -> Action {
        phases[id] = nil
        return .finish(id, ending)
    }
}

extension TransferTable.Phase: Sendable {}
extension TransferTable.Ending: Sendable {}
extension TransferTable.Action: Sendable where ID: Sendable {}

/// How a transfer ended below its requester (curl's `curl_multi_info_read`, or the raw HTTP/1.1 path's
/// `HTTP1ConnectionMachine`), with the facts `TransferTable` decides on.
enum TransferCompletion: Equatable, Sendable {
    /// One of the transfer's own callbacks stopped it (a refused head or destination): this is why, in place
    /// of the error curl returns for the abort.
    case refused(TransportFailure)
    /// The transfer finished without error; `headDelivered` is false when the upstream closed without a response.
    case succeeded(headDelivered: Bool)
    /// The transfer failed: `failure` is the classified error, `resendable` whether `StaleConnection` would send it
    /// again (not counting an earlier resend, which the table knows) and its body can be rewound.
    case failed(TransportFailure, resendable: Bool)
}
