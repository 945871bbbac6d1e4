import NIOConcurrencyHelpers

/// Token store operations by store, operation and result, their time, and the time refreshes waited for the
/// store's lock: `backstop_token_store_*` (docs/reference/operations.md#metrics). Recorded by the stores, a few
/// times per refresh, never per request.
public final class TokenStoreMetrics: Sendable {
    private struct Key: Hashable {
        var store: String
        var operation: String
        var ok: Bool
    }

    private struct State {
        var counts: [Key: Int] = [:]
        var seconds: [Key: Double] = [:]
        var lockWaits: [String: (count: Int, seconds: Double)] = [:]
    }

    private let state = NIOLockedValueBox(State())

    public init() {}

    public func record(store: String, operation: String, ok: Bool, seconds: Duration) {
        let key = Key(store: store, operation: operation, ok: ok)
        let value = seconds.seconds
        state.withLockedValue {
            $0.counts[key, default: 0] += 1
            $0.seconds[key, default: 0] += value
        }
    }

    public func recordLockWait(store: String, seconds: Duration) {
        let value = seconds.seconds
        state.withLockedValue {
            let current = $0.lockWaits[store] ?? (0, 0)
            $0.lockWaits[store] = (current.count + 1, current.seconds + value)
        }
    }

    /// Prometheus text for the three families (empty families are still described).
    public func render() -> String {
        let snapshot = state.withLockedValue { $0 }
        var out = PrometheusText()
        out.family(
            "backstop_token_store_operations_total", .counter, "Token store operations, by store, operation and result."
        )
        let keys = snapshot.counts.keys.sorted {
            ($0.store, $0.operation, $0.ok ? 1 : 0) < ($1.store, $1.operation, $1.ok ? 1 : 0)
        }
        for key in keys {
            out.sample(
                "backstop_token_store_operations_total",
                ["store": key.store, "operation": key.operation, "result": key.ok ? "ok" : "error"],
                snapshot.counts[key] ?? 0)
        }
        out.family("backstop_token_store_operation_seconds", .summary, "Time token store operations took.")
        for key in keys {
            let labels: KeyValuePairs = [
                "store": key.store, "operation": key.operation, "result": key.ok ? "ok" : "error",
            ]
            out.sample("backstop_token_store_operation_seconds_sum", labels, snapshot.seconds[key] ?? 0)
            out.sample("backstop_token_store_operation_seconds_count", labels, snapshot.counts[key] ?? 0)
        }
        out.family(
            "backstop_token_store_lock_wait_seconds", .summary, "Time refreshes waited for the store's refresh lock.")
        for store in snapshot.lockWaits.keys.sorted() {
            let wait = snapshot.lockWaits[store]!
            out.sample("backstop_token_store_lock_wait_seconds_sum", ["store": store], wait.seconds)
            out.sample("backstop_token_store_lock_wait_seconds_count", ["store": store], wait.count)
        }
        return out.text
    }
}
