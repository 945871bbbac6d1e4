import CCurl
import Foundation
import NIOConcurrencyHelpers
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
    /// Every transfer in flight ends as shut down; the transport goes on for new ones.
    case cutAll
    case stop
}

/// The locked queue through which other threads hand commands to the transport thread, and the eventfd that
/// wakes it: written only when the thread says it is about to sleep, so a busy thread finds the next batch waiting
/// without a wake-up (docs/performance.md#threads-and-hops).
///
/// Locks in this project are NIO's pthread-based boxes rather than `Synchronization.Mutex`: a contended `Mutex` on
/// Linux hands ownership over through `FUTEX_LOCK_PI` in the kernel, which ThreadSanitizer cannot see, so it
/// reported every hand-off through a contended lock as a race and hid the real ones.
final class TransportCommands: Sendable {
    private let queue = NIOLockedValueBox<[TransportCommand]>([])
    private let sleeping = Atomic<Bool>(false)
    /// The eventfd the transport thread's epoll instance watches.
    let wakeFD: Int32

    /// Nil when the kernel refuses an eventfd (out of descriptors).
    init?() {
        let fd = bs_wake_fd_create()
        guard fd >= 0 else { return nil }
        wakeFD = fd
    }

    /// Closed after the transport thread has stopped watching it (the transport outlives its loop).
    deinit { close(wakeFD) }

    /// Any thread: queues `command` and wakes the transport thread if it sleeps. The command is moved into the
    /// queue (taken out of an optional inside the lock), not copied: a copy retained and released its transfer.
    func submit(_ command: consuming TransportCommand) {
        var command = Optional(command)
        queue.withLockedValue { $0.append(command.take()!) }
        guard sleeping.exchange(false, ordering: .sequentiallyConsistent) else { return }
        // EAGAIN: the counter is at its maximum, so the eventfd is readable and the thread wakes all the same.
        // Nothing else can fail on a valid, non-blocking eventfd with an 8-byte write.
        let failure = bs_wake_fd_signal(wakeFD)
        assert(failure == 0 || failure == EAGAIN, "eventfd write failed: errno \(failure)")
    }

    /// Transport thread: every queued command, oldest first.
    func takeAll(into batch: inout [TransportCommand]) {
        batch.removeAll(keepingCapacity: true)
        queue.withLockedValue { swap(&$0, &batch) }
    }

    /// Transport thread, before `epoll_wait`: from now on a submit writes the eventfd. True when commands are
    /// already waiting (the caller must not sleep).
    func announceSleep() -> Bool {
        sleeping.store(true, ordering: .sequentiallyConsistent)
        return !queue.withLockedValue { $0.isEmpty }
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
