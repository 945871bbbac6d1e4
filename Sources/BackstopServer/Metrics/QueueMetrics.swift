import BackstopCore
import BackstopQueue
import NIOConcurrencyHelpers

/// The metrics of spooled bodies and queued delivery (docs/reference/operations.md#metrics): deliveries finished,
/// counted by the deliverer as they happen, and the spool's bytes and each queue's depth and oldest entry, read
/// from the budget and the store's snapshot when `/metrics` is rendered.
public final class QueueMetrics: Sendable {
    /// How a queued delivery finished, for `backstop_deliveries_total{result}`.
    public enum Result: String, CaseIterable, Sendable {
        case delivered
        /// Made a dead letter: a non-retryable answer, `max_age` run out, or an entry that does not open.
        case dead
    }

    private let finished = NIOLockedValueBox([String: [Int]]())

    public init() {}

    /// Counts `count` deliveries to `upstream` that finished with `result`.
    public func record(upstream: String, _ result: Result, count: Int = 1) {
        guard count > 0 else { return }
        let index = Result.allCases.firstIndex(of: result)!
        finished.withLockedValue { table in
            table[upstream, default: [Int](repeating: 0, count: Result.allCases.count)][index] += count
        }
    }

    /// The four families. `queueUpstreams`: the upstreams with `delivery: queue`, shown at 0 when empty (a gauge that
    /// vanishes when a queue drains would read as "no data" on a dashboard). `now`: wall-clock seconds.
    public func render(queueUpstreams: [String], snapshot: QueueSnapshot, spoolBytes: Int, now: Double) -> String {
        var out = PrometheusText()
        out.family(
            "backstop_spool_bytes", .gauge,
            "Bytes in the spool: spooled bodies and queued deliveries (spool.max_bytes).")
        out.sample("backstop_spool_bytes", spoolBytes)
        let names = Set(queueUpstreams).union(snapshot.upstreams.keys).sorted()
        out.family(
            "backstop_queue_depth", .gauge, "Deliveries waiting to be delivered (not dead letters), by upstream.")
        for name in names {
            out.sample("backstop_queue_depth", ["upstream": name], snapshot.upstreams[name]?.queued ?? 0)
        }
        out.family(
            "backstop_queue_oldest_seconds", .gauge, "Age of the oldest delivery waiting, by upstream (0 when none).")
        for name in names {
            let age = snapshot.upstreams[name]?.oldestQueuedAt.map { max(0, now - $0) } ?? 0
            out.sample("backstop_queue_oldest_seconds", ["upstream": name], age)
        }
        out.family("backstop_deliveries_total", .counter, "Queued deliveries finished, by result (delivered, dead).")
        let counts = finished.withLockedValue { $0 }
        for name in Set(names).union(counts.keys).sorted() {
            let row = counts[name] ?? [Int](repeating: 0, count: Result.allCases.count)
            for (index, result) in Result.allCases.enumerated() {
                out.sample("backstop_deliveries_total", ["upstream": name, "result": result.rawValue], row[index])
            }
        }
        return out.text
    }
}
