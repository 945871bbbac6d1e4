import Foundation

/// The decisions of `InterceptAuthority` about leaves (docs/reference/https-clients.md#the-local-ca), with no I/O and
/// no clock of its own: which leaf is cached and still fresh, which name is being minted, who waits for it, and
/// which leaf goes when the cache is full. One minting serves every handshake that asks for its name meanwhile,
/// whatever event loop each runs on. Generic over what a leaf is (`NIOSSLContext` in the daemon) and over what
/// waits (a promise), so it is tested with plain values.
struct LeafMinting<Leaf, Waiter> {
    /// What to do for a handshake that wants the leaf of a name.
    enum Lookup {
        /// A fresh leaf is cached: use it.
        case cached(Leaf)
        /// No one is minting this name: the caller mints it, and then reports with `minted`.
        case mint
        /// The name is being minted: the waiter is kept and handed back by `minted`.
        case wait
    }

    let capacity: Int
    /// Each leaf with the time after which it is minted again (three quarters of its lifetime), so a client never
    /// gets a leaf about to expire.
    private var leaves: [String: (leaf: Leaf, renewAfter: Date)] = [:]
    private var waiting: [String: [Waiter]] = [:]

    init(capacity: Int) {
        precondition(capacity > 0, "a leaf cache holds at least one leaf")
        self.capacity = capacity
    }

    /// Leaves cached now.
    var cachedCount: Int { leaves.count }
    /// Names being minted now.
    var mintingCount: Int { waiting.count }

    /// A handshake for `host` at `now`, on behalf of `waiter`.
    mutating func lookup(_ host: String, now: Date, waiter: Waiter) -> Lookup {
        if let cached = leaves[host], cached.renewAfter > now { return .cached(cached.leaf) }
        if waiting[host] != nil {
            waiting[host]!.append(waiter)
            return .wait
        }
        waiting[host] = [waiter]
        return .mint
    }

    /// The minting of `host` ended: a leaf to cache until `renewAfter`, or nil when it failed (nothing is cached,
    /// and the next handshake mints again). Returns every waiter, the one that minted included, to be answered.
    mutating func minted(_ host: String, leaf: Leaf?, renewAfter: Date) -> [Waiter] {
        guard let waiters = waiting.removeValue(forKey: host) else {
            preconditionFailure("a minting of \(host) ended that was never started")
        }
        if let leaf {
            if leaves[host] == nil, leaves.count >= capacity,
                let soonest = leaves.min(by: { $0.value.renewAfter < $1.value.renewAfter })
            {
                leaves[soonest.key] = nil
            }
            leaves[host] = (leaf, renewAfter)
        }
        return waiters
    }

    /// A new intermediate signs from now on: every cached leaf goes. Mintings under way finish and are cached (their
    /// leaves carry the chain they were signed with, which is as valid).
    mutating func dropLeaves() {
        leaves.removeAll()
    }
}

extension LeafMinting.Lookup: Equatable where Leaf: Equatable {}

extension LeafMinting: Sendable where Leaf: Sendable, Waiter: Sendable {}
