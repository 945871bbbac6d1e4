import CCurl

/// Which group a new raw HTTP/1.1 connection joins (docs/performance.md#why-tls-at-c256-cost-more-than-at-c32): the
/// first with fewer than `perGroup` open connections, else a new one. Each group is a multi handle of its own
/// (`DrivenMulti`), so its connection cache holds at most `perGroup` connections, and curl 7.88 walks only those
/// to find a `CONNECT_ONLY` connection on every `curl_easy_send`/`curl_easy_recv`. Pure bookkeeping: the owner makes
/// the group a new slot stands for.
struct GroupSlots: Equatable {
    let perGroup: Int
    /// Open connections per slot; a slot is never removed (its multi handle is kept for the next connections).
    private(set) var open: [Int] = []

    init(perGroup: Int) {
        precondition(perGroup > 0, "a group holds at least one connection")
        self.perGroup = perGroup
    }

    /// The slot a new connection would take: the first with room, or `open.count` (a new one).
    var slotWithRoom: Int { open.firstIndex { $0 < perGroup } ?? open.count }

    /// A connection in `slot` (from `slotWithRoom`) is open.
    mutating func opened(_ slot: Int) {
        precondition(slot <= open.count, "slot \(slot) skips a slot")
        if slot == open.count { open.append(0) }
        open[slot] += 1
    }

    /// A connection opened in `slot` has closed.
    mutating func closed(_ slot: Int) {
        precondition(open.indices.contains(slot) && open[slot] > 0, "slot \(slot) has no open connection")
        open[slot] -= 1
    }
}

/// A curl multi handle the transport's loop drives (docs/performance.md#threads-and-hops): its sockets go into the
/// transport's epoll instance tagged with `index`, so that their events come back to this handle, and its timer is
/// `deadline`, which the loop fires. The transport's own multi handle (curl's HTTP layer, upgrades) is one, index -1;
/// each group of raw HTTP/1.1 connections (`GroupSlots`) is one, connecting them (`CONNECT_ONLY`) and keeping them
/// until they close. Every easy handle uses the transfers' share whichever handle it is in, so TLS sessions are
/// resumed across them. Transport thread only.
final class DrivenMulti {
    /// The transport's own multi handle's `index`.
    static let transportIndex = -1

    let index: Int
    let multi: CurlMulti
    unowned let sockets: SocketWatch
    /// When curl wants `curl_multi_socket_action(CURL_SOCKET_TIMEOUT)` on this handle (monotonic ms; nil: no timer).
    var deadline: Int64?

    /// Nil when curl cannot make a multi handle or refuses its callbacks.
    init?(index: Int, sockets: SocketWatch) {
        guard let multi = CurlMulti() else { return nil }
        self.index = index
        self.multi = multi
        self.sockets = sockets
        let context = Unmanaged.passUnretained(self).toOpaque()
        do throws(CurlSetupError) {
            try multi.setSocketCallback(DrivenMulti.socket, context: context)
            try multi.setTimerCallback(DrivenMulti.timer, context: context)
        } catch {
            return nil
        }
    }

    /// Its easy handles are gone: the multi handle goes now, while the object its callbacks point to is alive.
    func cleanup() { multi.cleanup() }

    // The callbacks borrow the object (no retain and release per call): sound because it outlives its multi handle
    // (`cleanup` before it is dropped) and curl calls them only inside the transport's calls on that handle.
    private static let socket: bs_curl_socket_callback = { _, fd, what, context, _ in
        guard let context else { return 0 }
        Unmanaged<DrivenMulti>.fromOpaque(context)._withUnsafeGuaranteedRef {
            $0.sockets.curlWants(fd, what, group: $0.index)
        }
        return 0
    }

    private static let timer: bs_curl_timer_callback = { _, timeoutMS, context in
        guard let context else { return 0 }
        Unmanaged<DrivenMulti>.fromOpaque(context)._withUnsafeGuaranteedRef {
            $0.deadline = timeoutMS < 0 ? nil : bs_monotonic_ms() + Int64(timeoutMS)
        }
        return 0
    }
}
