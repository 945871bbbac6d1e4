import NIOConcurrencyHelpers
import NIOCore

/// "The network may be back": fired by the `NetworkChangeMonitor` for every burst of changes, and awaited by
/// attempts that failed for want of a usable network while they wait out their backoff, whichever comes first
/// (docs/reference/behaviour.md#the-network-coming-back).
///
/// Changes are numbered (`generation`). A waiter says which generation it has seen (read when its attempt started),
/// so a change that came after the attempt started but before the wait began wakes it at once rather than being
/// missed. Each wait is woken at most once, on the event loop it named; nothing polls.
public final class NetworkReturnSignal: Sendable {
    /// One registered wait, for `cancel`.
    public struct Wait: Sendable, Hashable {
        fileprivate let id: UInt64
    }

    private struct Waiter {
        let loop: any EventLoop
        let wake: @Sendable () -> Void
    }

    private struct State {
        var generation: UInt64 = 0
        var nextID: UInt64 = 0
        var waiters: [UInt64: Waiter] = [:]
    }

    private let state = NIOLockedValueBox(State())

    public init() {}

    /// Changes signalled so far.
    public var generation: UInt64 { state.withLockedValue { $0.generation } }

    /// Waits registered and neither woken nor cancelled.
    public var waiting: Int { state.withLockedValue { $0.waiters.count } }

    /// Calls `wake` on `loop` once, at the first change after generation `seen` (at once if one already came).
    /// `cancel` the returned wait when it is no longer wanted (the backoff ended first, the client left).
    public func wait(
        after seen: UInt64, on loop: any EventLoop, _ wake: @escaping @Sendable () -> Void
    ) -> Wait {
        let (id, already) = state.withLockedValue { state -> (UInt64, Bool) in
            let id = state.nextID
            state.nextID += 1
            guard state.generation <= seen else { return (id, true) }
            state.waiters[id] = Waiter(loop: loop, wake: wake)
            return (id, false)
        }
        if already { loop.execute(wake) }
        return Wait(id: id)
    }

    /// Forgets `wait`; its `wake` is not called after this returns unless it was already scheduled.
    public func cancel(_ wait: Wait) {
        _ = state.withLockedValue { $0.waiters.removeValue(forKey: wait.id) }
    }

    /// The network changed: every wait registered is woken (each on its loop) and forgotten.
    public func signal() {
        let woken = state.withLockedValue { state -> [Waiter] in
            state.generation += 1
            defer { state.waiters = [:] }
            return Array(state.waiters.values)
        }
        for waiter in woken { waiter.loop.execute(waiter.wake) }
    }
}
