/// Idle easy handles kept for reuse, grouped by the TLS options they were last configured with
/// (docs/performance.md#choices-that-keep-a-request-cheap). A handle whose CA file or disabled verification has no "default" to set back
/// would need `curl_easy_reset` (and every fixed option again) before serving another kind of request; kept in its
/// own group, it serves the next request of its kind as it is. A handle offering HTTP/2 (`tls.http2: true`) is
/// grouped the same way, so the default path never sets the HTTP version. Pure: the transport owns the handles.
struct IdleHandlePool<Handle> {
    /// What `take` found.
    enum Taken {
        /// Configured for these options (or the defaults, to which `configure` adds them): use as it is.
        case ready(Handle)
        /// Configured for other non-default options: reset it and set the fixed options before use.
        case needsReset(Handle)
    }

    let capacity: Int
    /// Handles with the default options, apart: the common case costs no hashing.
    private var plain: [Handle] = []
    /// The other groups, found by `==`: there are as many as distinct upstream `tls` settings (a few), and
    /// comparing options that share their strings is cheaper than hashing them twice per transfer, as a dictionary
    /// keyed by them did (~2k instructions per request on an h2 upstream; docs/performance.md).
    private var groups: [(options: TransportTLSOptions, handles: [Handle])] = []
    private(set) var count = 0

    init(capacity: Int) { self.capacity = capacity }

    /// A handle for a request with `options`: one of its own group, else a default one, else any (to be reset);
    /// nil when none is idle.
    mutating func take(for options: TransportTLSOptions) -> Taken? {
        if !options.isDefault, let handle = pop(options) { return .ready(handle) }
        if let handle = plain.popLast() {
            count -= 1
            return .ready(handle)
        }
        guard let index = groups.firstIndex(where: { !$0.handles.isEmpty }), let handle = pop(at: index) else {
            return nil
        }
        return .needsReset(handle)
    }

    /// Keeps `handle`, last configured for `options`; false when the pool is full (the caller frees it).
    mutating func put(_ handle: Handle, options: TransportTLSOptions) -> Bool {
        guard count < capacity else { return false }
        if options.isDefault {
            plain.append(handle)
        } else if let index = groups.firstIndex(where: { $0.options == options }) {
            groups[index].handles.append(handle)
        } else {
            groups.append((options, [handle]))
        }
        count += 1
        return true
    }

    /// Every idle handle, emptying the pool.
    mutating func removeAll() -> [Handle] {
        let all = plain + groups.flatMap(\.handles)
        plain = []
        groups = []
        count = 0
        return all
    }

    private mutating func pop(_ options: TransportTLSOptions) -> Handle? {
        guard let index = groups.firstIndex(where: { $0.options == options }) else { return nil }
        return pop(at: index)
    }

    private mutating func pop(at index: Int) -> Handle? {
        guard let handle = groups[index].handles.popLast() else { return nil }
        count -= 1
        return handle
    }
}
