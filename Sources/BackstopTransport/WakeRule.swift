/// When a command queued for the transport thread writes the thread's eventfd (docs/performance.md#threads-and-hops).
///
/// A command submitted while the transport thread is awake needs no wake-up: the thread looks at the queue again
/// before it sleeps (`TransportCommands` proves that no command is lost). A command submitted while it sleeps from
/// an event loop's own thread (a request read from a client, a cancel, a resume) may wait for the end of that
/// loop's turn, so that one wake-up carries every command the turn queued — but no longer than `wakeAtPending`
/// commands or `maxDeferralNanoseconds` since the first deferred one: with many clients a turn reads many requests,
/// and the transport should send the first ones while the loop parses the rest. A command from any other thread
/// wakes the transport at once.
///
/// Pure: the caller holds the queue's lock around every call, reads the clock, and performs the actions.
struct WakeRule: Sendable, Equatable {
    /// Wake at once when this many commands wait (1: every command submitted while the thread sleeps wakes it).
    let wakeAtPending: Int
    /// Wake at once when the oldest deferred command has waited this long.
    let maxDeferralNanoseconds: UInt64

    /// Commands queued and not yet taken by the transport thread.
    private(set) var pending = 0
    /// When the first command deferred since the transport last took the queue was submitted.
    private(set) var deferredSince: UInt64?
    /// Event loops with an end-of-turn flush scheduled and not yet run (usually one: the default is one loop).
    private(set) var flushesScheduled: [ObjectIdentifier] = []

    /// The defaults: measured in docs/performance.md#syscalls-and-wake-ups-per-request.
    static let defaultWakeAtPending = 8
    static let defaultMaxDeferralNanoseconds: UInt64 = 50_000

    init(
        wakeAtPending: Int = Self.defaultWakeAtPending,
        maxDeferralNanoseconds: UInt64 = Self.defaultMaxDeferralNanoseconds
    ) {
        self.wakeAtPending = max(1, wakeAtPending)
        self.maxDeferralNanoseconds = maxDeferralNanoseconds
    }

    enum Action: Equatable {
        /// Nothing to do: the transport is awake, or a flush already scheduled on this loop will wake it.
        case none
        /// Wake the transport now if it still sleeps.
        case wake
        /// Schedule a flush at the end of the submitting loop's turn (then call `flushRuns`).
        case scheduleFlush
    }

    /// A command was queued. `transportSleeping`: the thread's announcement, read after the command was queued.
    /// `loop`: the submitting thread's event loop, when the command comes from an event loop's own thread.
    /// `now`: monotonic nanoseconds (read only when `loop` is set).
    mutating func submitted(transportSleeping: Bool, loop: ObjectIdentifier?, now: UInt64) -> Action {
        pending += 1
        guard transportSleeping else { return .none }
        guard let loop else { return .wake }
        if pending >= wakeAtPending { return .wake }
        if let since = deferredSince {
            if now &- since >= maxDeferralNanoseconds { return .wake }
        } else {
            deferredSince = now
        }
        if flushesScheduled.contains(loop) { return .none }
        flushesScheduled.append(loop)
        return .scheduleFlush
    }

    /// The transport thread took every queued command.
    mutating func taken() {
        pending = 0
        deferredSince = nil
    }

    /// The flush scheduled for `loop` runs: true when commands still wait (wake the transport if it sleeps).
    mutating func flushRuns(for loop: ObjectIdentifier) -> Bool {
        if let index = flushesScheduled.firstIndex(of: loop) { flushesScheduled.remove(at: index) }
        return pending > 0
    }
}
