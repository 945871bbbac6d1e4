/// Idle upstream connections kept for the next request to the same endpoint (docs/performance.md#libcurl-as-the-connection),
/// newest first, as curl's connection cache keeps them: at most `capacity` in all, none older than `maxAgeMS`
/// (curl's `CURLOPT_MAXAGE_CONN` default, 118 s). Pure: the transport closes what it is handed back.
struct IdleConnectionPool<Key: Hashable, Connection: AnyObject> {
    let capacity: Int
    let maxAgeMS: Int64

    /// The idle connections of one key, newest last. A class, so that the last key's list is changed in place
    /// without a dictionary lookup.
    private final class Bucket {
        var list: [(connection: Connection, since: Int64)] = []
    }

    /// An emptied bucket stays, so the next `put` for the endpoint allocates nothing, until the owner forgets the
    /// key (`removeEmptyBucket`).
    private var idle: [Key: Bucket] = [:]
    /// The key used last and its bucket: requests to one endpoint follow one another, and comparing a key costs
    /// far less than hashing it (its origin's bytes) for a lookup, twice per request (take, then put).
    private var last: (key: Key, bucket: Bucket)?
    private(set) var count = 0
    /// The keys with a bucket, emptied or not.
    var bucketCount: Int { idle.count }

    init(capacity: Int, maxAgeMS: Int64 = 118_000) {
        self.capacity = capacity
        self.maxAgeMS = maxAgeMS
    }

    /// Makes `key`'s bucket the last one (`last`), creating it when asked; false when it has none. The callers
    /// then use `last!.bucket` in place: binding the bucket to a local (as a returned reference) cost a retain and
    /// a release per take and put (docs/performance.md#reference-counting-per-request).
    private mutating func select(_ key: Key, creating: Bool) -> Bool {
        if last?.key == key { return true }
        var found = idle[key]
        if found == nil, creating {
            found = Bucket()
            idle[key] = found
        }
        guard let found else { return false }
        last = (key, found)
        return true
    }

    /// The newest idle connection for `key` at `now` (nil: none), and those too old to be used (to be closed).
    mutating func take(_ key: Key, now: Int64) -> (connection: Connection?, expired: [Connection]) {
        guard select(key, creating: false), let newest = last!.bucket.list.popLast() else { return (nil, []) }
        count -= 1
        guard now - newest.since < maxAgeMS else {
            // Older ones were parked earlier still: all of them are too old.
            let older = last!.bucket.list
            idle.removeValue(forKey: key)
            last = nil
            count -= older.count
            return (nil, [newest.connection] + older.map(\.connection))
        }
        return (newest.connection, [])
    }

    /// Keeps `connection` for `key` from `now`; false when the pool is full (the caller closes it).
    mutating func put(_ connection: Connection, _ key: Key, now: Int64) -> Bool {
        guard count < capacity, select(key, creating: true) else { return false }
        last!.bucket.list.append((connection, now))
        count += 1
        return true
    }

    /// Takes `connection` out (it went bad while idle); false when it was not in the pool.
    mutating func remove(_ connection: Connection, _ key: Key) -> Bool {
        guard select(key, creating: false),
            let index = last!.bucket.list.firstIndex(where: { $0.connection === connection })
        else { return false }
        last!.bucket.list.remove(at: index)
        count -= 1
        return true
    }

    /// Drops `key`'s bucket: the owner forgets the key for good (a raw endpoint no connection uses any more,
    /// `HTTP1Connections`). True when `key` has no bucket now; false when its bucket still holds connections (it
    /// stays, and the caller broke its own rule).
    mutating func removeEmptyBucket(_ key: Key) -> Bool {
        guard let bucket = idle[key] else { return true }
        guard bucket.list.isEmpty else { return false }
        idle.removeValue(forKey: key)
        if last?.key == key { last = nil }
        return true
    }

    /// Takes out every connection too old to be used at `now` (to be closed): without it a connection parked after a
    /// burst to an endpoint nobody asks again stayed open, its descriptor and the upstream's slot held, until that
    /// endpoint's next request. Emptied buckets stay, as after `take`.
    mutating func expire(now: Int64) -> [Connection] {
        var expired: [Connection] = []
        for bucket in idle.values {
            // Oldest first: the expired ones are a prefix.
            let old = bucket.list.prefix { now - $0.since >= maxAgeMS }
            guard !old.isEmpty else { continue }
            expired += old.map(\.connection)
            bucket.list.removeFirst(old.count)
        }
        count -= expired.count
        return expired
    }

    /// Every idle connection, emptying the pool.
    mutating func removeAll() -> [Connection] {
        let all = idle.values.flatMap { $0.list.map(\.connection) }
        idle = [:]
        last = nil
        count = 0
        return all
    }
}
