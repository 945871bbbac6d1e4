import CCurl
import Foundation

/// The transport thread's epoll instance: curl's sockets, watched as `SocketInterest` decides, and the command
/// queue's eventfd. Performs the `epoll_ctl` calls; the decisions are `SocketInterest`'s. Transport thread only.
final class SocketWatch {
    private let epollFD: Int32
    private var interest = SocketInterest()
    /// `epoll_ctl` failures that were not expected, for the transport's log (it reads and resets them).
    private(set) var unexpectedFailures: [(fd: Int32, errno: Int32)] = []

    /// Nil when the kernel refuses an epoll instance or to watch `wakeFD` (out of descriptors or memory).
    init?(wakeFD: Int32) {
        epollFD = epoll_create1(Int32(EPOLL_CLOEXEC))
        guard epollFD >= 0 else { return nil }
        guard bs_epoll_watch(epollFD, wakeFD, CURL_POLL_IN, 1) == 0 else {
            _ = Glibc.close(epollFD)
            return nil
        }
    }

    deinit { _ = Glibc.close(epollFD) }

    /// curl's socket callback: watch `fd` as `what` says, or stop watching it; `group` is the `DrivenMulti.index` of
    /// the multi handle that asked, which `group(of:)` tells the loop.
    func curlWants(_ fd: Int32, _ what: Int32, group: Int) {
        let failed: Bool
        switch interest.curlWants(fd, what, group: group) {
        case .none: return
        case .add(let events): failed = bs_epoll_watch(epollFD, fd, events, 1) != 0
        case .modify(let events): failed = bs_epoll_watch(epollFD, fd, events, 0) != 0
        case .delete:
            unwatch(fd)
            return
        }
        if failed {
            // Not watchable (ENOMEM, ENOSPC: the kernel's watch limit): the transfer fails through curl's own
            // timeout rather than hanging silently, and the next request on the socket tries again.
            noteFailure(fd)
            unwatch(fd)
            interest.registrationFailed(fd)
        }
    }

    /// A raw connection's interest in its socket (`SocketInterest.relayWants`).
    func relayWants(_ fd: Int32, _ what: Int32) {
        switch interest.relayWants(fd, what) {
        case .none: return
        case .delete: unwatch(fd)
        case .add(let events), .modify(let events):
            if bs_epoll_watch(epollFD, fd, events, 0) != 0 {
                noteFailure(fd)
                interest.registrationFailed(fd)
            }
        }
    }

    /// Which multi handle `fd`'s events go to (`DrivenMulti.index`): the transport's own, or a connection group's.
    func group(of fd: Int32) -> Int { interest.group(of: fd) }

    /// The transport opened `fd` for curl (`CURLOPT_OPENSOCKETFUNCTION`).
    func opened(_ fd: Int32) { interest.opened(fd) }

    /// curl's close-socket callback (`CURLOPT_CLOSESOCKETFUNCTION`): closes `fd`, which removes it from epoll.
    /// curl ignores the result; a failed close leaves nothing to retry (after EINTR the socket is closed too).
    func close(_ fd: Int32) -> Int32 {
        interest.closed(fd)
        return Glibc.close(fd)
    }

    /// epoll reported `fd` ready: true when curl wants to hear of it; false for a parked keep-alive socket, which is
    /// unwatched now (the upstream closed it or sent something unasked; curl finds out when it next uses it).
    func eventArrived(_ fd: Int32) -> Bool {
        if interest.eventArrived(fd) { return true }
        unwatch(fd)
        return false
    }

    /// Waits up to `timeoutMS` (-1: forever) and fills `fds` and curl's `CURL_CSELECT_*` `masks`; returns how
    /// many are ready. EINTR (a signal handled by this thread) counts as none ready; the loop goes round again.
    func wait(fds: inout [Int32], masks: inout [Int32], timeoutMS: Int32) -> Int {
        let capacity = Int32(min(fds.count, masks.count))
        let ready = fds.withUnsafeMutableBufferPointer { f in
            masks.withUnsafeMutableBufferPointer { m in
                bs_epoll_wait(epollFD, f.baseAddress, m.baseAddress, capacity, timeoutMS)
            }
        }
        if ready < 0 {
            // EINTR is the only error a valid epoll descriptor and buffer can give.
            let failure = errno
            assert(failure == EINTR, "epoll_wait failed: errno \(failure)")
            return 0
        }
        return Int(ready)
    }

    /// Whether `takeFailures` has anything.
    var hasFailures: Bool { !unexpectedFailures.isEmpty }

    /// Takes the unexpected `epoll_ctl` failures noted since the last call.
    func takeFailures() -> [(fd: Int32, errno: Int32)] {
        guard !unexpectedFailures.isEmpty else { return [] }
        defer { unexpectedFailures.removeAll() }
        return unexpectedFailures
    }

    private func unwatch(_ fd: Int32) {
        // ENOENT/EBADF: curl already closed the socket, or epoll dropped it (a closed socket leaves epoll by
        // itself): nothing to undo. Anything else is noted.
        if bs_epoll_unwatch(epollFD, fd) != 0, errno != ENOENT, errno != EBADF { noteFailure(fd) }
    }

    private func noteFailure(_ fd: Int32) {
        unexpectedFailures.append((fd, errno))
    }
}
