/// Which of curl's sockets the transport's epoll instance watches, and for which events: the decisions behind
/// curl's socket callback, without the `epoll_ctl` calls themselves.
///
/// curl reports interest per transfer, so a keep-alive connection is "removed" when one response ends and
/// "added" again by the next request on it; passed straight to epoll, that would be several `epoll_ctl` calls per
/// request (docs/performance.md has the measurement). Instead, a
/// socket curl stops watching stays registered for input ("parked") when the transport opened it itself: curl
/// closes such sockets only through the transport's close-socket callback, so a parked entry can never outlive its
/// socket and be mistaken for a new one under the same number. Watching it again costs nothing; an event on it
/// while parked (the upstream closed the idle connection) unregisters it then. A socket curl opened some other way
/// (the threaded resolver's socketpair) may be closed without notice, so it is unregistered at once.
///
/// Interest values are curl's `CURL_POLL_*`: 1 input, 2 output, 3 both, 4 remove.
struct SocketInterest {
    static let input: Int32 = 1
    static let output: Int32 = 2
    static let remove: Int32 = 4

    /// The `epoll_ctl` call to make, if any.
    enum Action: Equatable {
        case none
        case add(Int32)
        case modify(Int32)
        case delete
    }

    private struct Entry {
        /// What epoll watches the socket for (0: not registered).
        var registered: Int32 = 0
        /// Whether curl wants the socket's events now (false while parked).
        var wanted = false
        /// Whether the transport opened the socket, so that its close is reported to `closed(_:)`.
        var owned = false
        /// Whose multi handle asked for it (`DrivenMulti.index`): the transport's own, or a connection group's.
        var group = DrivenMulti.transportIndex
    }

    private var entries: [Entry] = []

    /// The transport's open-socket callback created `fd`. Any earlier registration under this number belonged to a
    /// closed socket, which epoll dropped by itself.
    mutating func opened(_ fd: Int32) {
        self[fd] = Entry(owned: true)
    }

    /// The transport's close-socket callback is closing `fd`, which removes it from epoll.
    mutating func closed(_ fd: Int32) {
        self[fd] = Entry()
    }

    /// curl's socket callback asked for `what` on `fd`, from the multi handle of `group` (`DrivenMulti.index`).
    mutating func curlWants(_ fd: Int32, _ what: Int32, group: Int = DrivenMulti.transportIndex) -> Action {
        var entry = self[fd]
        defer { self[fd] = entry }
        entry.group = group
        if what == Self.remove {
            entry.wanted = false
            if entry.registered == 0 { return .none }
            guard entry.owned else {
                entry.registered = 0
                return .delete
            }
            if entry.registered == Self.input { return .none }
            // Parked for input only: a writable socket would report output continuously.
            entry.registered = Self.input
            return .modify(Self.input)
        }
        entry.wanted = true
        if entry.registered == what { return .none }
        let action: Action = entry.registered == 0 ? .add(what) : .modify(what)
        entry.registered = what
        return action
    }

    /// A raw connection (`CurlConnection`) took `fd` over from curl and wants `what` (0: nothing). curl no longer
    /// watches it; events on it go to the connection, which the transport finds by socket before asking here.
    mutating func relayWants(_ fd: Int32, _ what: Int32) -> Action {
        var entry = self[fd]
        defer { self[fd] = entry }
        entry.wanted = false
        if entry.registered == what { return .none }
        let previous = entry.registered
        entry.registered = what
        if what == 0 { return .delete }
        return previous == 0 ? .add(what) : .modify(what)
    }

    /// epoll reported `fd` ready. Returns true when curl wants the event; false when the socket is parked, in
    /// which case it is now unregistered and the caller deletes it from epoll.
    mutating func eventArrived(_ fd: Int32) -> Bool {
        var entry = self[fd]
        if entry.wanted { return true }
        entry.registered = 0
        self[fd] = entry
        return false
    }

    /// The multi handle whose socket callback last asked for `fd` (`DrivenMulti.index`): the transport's own (also
    /// for a socket no callback asked for), or a connection group's. A socket the transport opened forgets its group
    /// when it is opened or closed; one curl opened itself (the threaded resolver's socketpair) is closed without
    /// notice, but curl's callback removes it first and epoll reports only sockets a callback asked for, whose
    /// owner's callback named its own group. (An event for a socket a multi handle does not know is ignored by curl.)
    func group(of fd: Int32) -> Int { self[fd].group }

    /// An `epoll_ctl` for `fd` failed: epoll does not watch it, whatever was recorded.
    mutating func registrationFailed(_ fd: Int32) {
        self[fd].registered = 0
    }

    private subscript(fd: Int32) -> Entry {
        get { Int(fd) < entries.count && fd >= 0 ? entries[Int(fd)] : Entry() }
        set {
            guard fd >= 0 else { return }
            if Int(fd) >= entries.count {
                entries.append(contentsOf: repeatElement(Entry(), count: Int(fd) + 1 - entries.count))
            }
            entries[Int(fd)] = newValue
        }
    }
}
