/// Idle upstream connections kept for the next request to the same endpoint (docs/performance.md#libcurl-as-the-connection),
/// newest first, as curl's connection cache keeps them: at most `capacity` in all, none older than `maxAgeMS`
/// (curl's `CURLOPT_MAXAGE_CONN` default, 118 s). Pure: the transport closes what it is handed back.
struct IdleConnectionPool<Key: Hashable, Connection: AnyObject> {
    let capacity: Int
    let maxAgeMS: Int64
    private var idle: [Key: [(connection: Connection, since: Int64)]] = [:]
    private(set) var count = 0

    init(capacity: Int, maxAgeMS: Int64 = 118_000) {
        self.capacity = capacity
        self.maxAgeMS = maxAgeMS
    }

    /// The newest idle connection for `key` at `now` (nil: none), and those too old to be used (to be closed).
    mutating func take(_ key: Key, now: Int64) -> (connection: Connection?, expired: [Connection]) {
        // In place: a copy of the list taken out and written back would copy the array on every request. An
        // emptied list stays, so the next `put` for the endpoint allocates nothing.
        guard let newest = idle[key]?.popLast() else { return (nil, []) }
        count -= 1
        guard now - newest.since < maxAgeMS else {
            // Older ones were parked earlier still: all of them are too old.
            let older = idle.removeValue(forKey: key) ?? []
            count -= older.count
            return (nil, [newest.connection] + older.map(\.connection))
        }
        return (newest.connection, [])
    }

    /// Keeps `connection` for `key` from `now`; false when the pool is full (the caller closes it).
    mutating func put(_ connection: Connection, _ key: Key, now: Int64) -> Bool {
        guard count < capacity else { return false }
        idle[key, default: []].append((connection, now))
        count += 1
        return true
    }

    /// Takes `connection` out (it went bad while idle); false when it was not in the pool.
    mutating func remove(_ connection: Connection, _ key: Key) -> Bool {
        guard let index = idle[key]?.firstIndex(where: { $0.connection === connection }) else { return false }
        idle[key]?.remove(at: index)
        count -= 1
        return true
    }

    /// Every idle connection, emptying the pool.
    mutating func removeAll() -> [Connection] {
        let all = idle.values.flatMap { $0.map(\.connection) }
        idle = [:]
        count = 0
        return all
    }
}
