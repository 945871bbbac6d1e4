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
    private var groups: [TransportTLSOptions: [Handle]] = [:]
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
        guard let other = groups.first(where: { !$0.value.isEmpty })?.key, let handle = pop(other) else { return nil }
        return .needsReset(handle)
    }

    /// Keeps `handle`, last configured for `options`; false when the pool is full (the caller frees it).
    mutating func put(_ handle: Handle, options: TransportTLSOptions) -> Bool {
        guard count < capacity else { return false }
        if options.isDefault { plain.append(handle) } else { groups[options, default: []].append(handle) }
        count += 1
        return true
    }

    /// Every idle handle, emptying the pool.
    mutating func removeAll() -> [Handle] {
        let all = plain + groups.values.flatMap { $0 }
        plain = []
        groups = [:]
        count = 0
        return all
    }

    private mutating func pop(_ options: TransportTLSOptions) -> Handle? {
        guard let handle = groups[options]?.popLast() else { return nil }
        count -= 1
        return handle
    }
}
