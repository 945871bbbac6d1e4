import CCurl
import Foundation
import NIOConcurrencyHelpers
import NIOCore
import Synchronization

/// What other threads ask of the transport thread.
enum TransportCommand {
    case start(CurlTransfer)
    case cancel(CurlTransfer)
    case resumeReceive(CurlTransfer)
    case resumeSend(CurlTransfer)
    case abandon(CurlTransfer, deadlineMS: Int64)
    /// A raw connection's command (`ConnectionDriver`).
    case connection(ConnectionCommand)
    case stop
}

/// The locked queue through which other threads hand commands to the transport thread, and the eventfd that
/// wakes it: written only when the thread says it is about to sleep, so a busy thread finds the next batch waiting
/// without a wake-up, and, for commands from an event loop's own thread, at most once per loop turn as `WakeRule`
/// decides (docs/performance.md#threads-and-hops).
///
/// Why no command is lost (the transport thread never sleeps with a command in the queue for longer than one turn
/// of the loop that queued it). The thread, before it sleeps: (T1) `sleeping = true`; (T2) under the lock, looks at
/// the queue, and does not block if it is not empty; (T3) `epoll_wait`; (T4) `sleeping = false`; (T5) under the
/// lock, takes the queue. A submitter: (S1) under the lock, appends its command, reads `sleeping` and asks the rule;
/// (S2) for `.wake`, `sleeping.exchange(false)` and, if that was true, writes the eventfd. A flush at the end of a
/// loop's turn: (F1) under the lock, asks the rule whether commands wait; (F2) then as S2. Only T5 empties the queue.
/// - If S1 comes before a T2 in the lock's order, that T2 sees the command and the thread does not block.
/// - If the thread blocks for good after a T2 that came before S1: T1 happened before that T2's unlock, so before
///   S1, and S1 reads true (a later false is only written by T4 — the thread woke — or by an S2/F2 that then wrote
///   the eventfd, which wakes it). So the rule answers `.wake`, and S2's exchange reads true and writes the
///   eventfd; or the loop has a flush scheduled that has not yet run its F1 (the rule keeps the loop in its list
///   until F1), and F1 comes after S1, finds the command still queued (no T5 since), and F2 wakes the thread.
/// - The flush is a task on the loop, queued from the loop's own thread: NIO runs the tasks queued in a turn,
///   including during its task phase, before it next blocks. If the loop is shutting down and drops the task, the
///   thread still wakes within its 1-s idle timeout (`CurlMultiTransport.run`).
/// The lock gives the order; the atomics need no ordering of their own beyond it (sequentially consistent anyway).
/// Test: `TransportCommandsTests`.
///
/// Locks in this project are NIO's pthread-based boxes rather than `Synchronization.Mutex`: a contended `Mutex` on
/// Linux hands ownership over through `FUTEX_LOCK_PI` in the kernel, which ThreadSanitizer cannot see, so it
/// reported every hand-off through a contended lock as a race and hid the real ones.
final class TransportCommands: Sendable {
    private struct Queue {
        var commands: [TransportCommand] = []
        var rule: WakeRule
    }
    private let queue: NIOLockedValueBox<Queue>
    private let sleeping = Atomic<Bool>(false)
    /// The eventfd the transport thread's epoll instance watches.
    let wakeFD: Int32

    /// Nil when the kernel refuses an eventfd (out of descriptors).
    init?(rule: WakeRule = WakeRule()) {
        let fd = bs_wake_fd_create()
        guard fd >= 0 else { return nil }
        wakeFD = fd
        queue = NIOLockedValueBox(Queue(rule: rule))
    }

    /// Closed after the transport thread has stopped watching it (the transport outlives its loop).
    deinit { close(wakeFD) }

    /// Any thread: queues `command` and wakes the transport thread if it sleeps — at once, or, when the caller is
    /// on `loop`'s own thread, possibly at the end of that loop's turn (`WakeRule`).
    func submit(_ command: TransportCommand, from loop: (any EventLoop)? = nil) {
        let own = loop.flatMap { $0.inEventLoop ? $0 : nil }
        let now = own == nil ? 0 : DispatchTime.now().uptimeNanoseconds
        let id = own.map { ObjectIdentifier($0) }
        let action = queue.withLockedValue { queue -> WakeRule.Action in
            queue.commands.append(command)
            return queue.rule.submitted(
                transportSleeping: sleeping.load(ordering: .sequentiallyConsistent), loop: id, now: now)
        }
        switch action {
        case .none: return
        case .wake: wake()
        case .scheduleFlush:
            // `own` is set: the rule defers only commands from an event loop's own thread.
            guard let own, let id else { return wake() }
            own.execute { [self] in
                if queue.withLockedValue({ $0.rule.flushRuns(for: id) }) { wake() }
            }
        }
    }

    private func wake() {
        guard sleeping.exchange(false, ordering: .sequentiallyConsistent) else { return }
        // EAGAIN: the counter is at its maximum, so the eventfd is readable and the thread wakes all the same.
        // Nothing else can fail on a valid, non-blocking eventfd with an 8-byte write.
        let failure = bs_wake_fd_signal(wakeFD)
        assert(failure == 0 || failure == EAGAIN, "eventfd write failed: errno \(failure)")
    }

    /// Transport thread: every queued command, oldest first.
    func takeAll(into batch: inout [TransportCommand]) {
        batch.removeAll(keepingCapacity: true)
        queue.withLockedValue {
            swap(&$0.commands, &batch)
            $0.rule.taken()
        }
    }

    /// Transport thread, before `epoll_wait`: from now on a submit writes the eventfd. True when commands are
    /// already waiting (the caller must not sleep).
    func announceSleep() -> Bool {
        sleeping.store(true, ordering: .sequentiallyConsistent)
        return !queue.withLockedValue { $0.commands.isEmpty }
    }

    /// Transport thread, after `epoll_wait`: awake again.
    func announceAwake() {
        sleeping.store(false, ordering: .sequentiallyConsistent)
    }

    /// Transport thread: the eventfd was reported readable; reset it.
    func drainWake() {
        // EAGAIN: another drain got there first (nothing to reset); nothing else can fail on a valid eventfd.
        let failure = bs_wake_fd_drain(wakeFD)
        assert(failure == 0 || failure == EAGAIN, "eventfd read failed: errno \(failure)")
    }
}
