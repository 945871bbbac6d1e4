import BackstopCore
import BackstopStatus
import NIOConcurrencyHelpers

/// The metrics docs/reference/operations.md#metrics names, kept in one lock-protected registry and rendered as Prometheus text.
///
/// Hand-written rather than swift-metrics + swift-prometheus: seven metrics with fixed label sets do not need a
/// process-global metrics backend, and rendering the exposition format is a few lines.
public final class ProxyMetrics: Sendable {
    /// Upper bounds (seconds) of the request duration histogram: sub-millisecond proxying to slow upstreams.
    public static let durationBuckets: [Double] = [
        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
    ]

    struct Histogram {
        var counts = [Int](repeating: 0, count: ProxyMetrics.durationBuckets.count)
        var sum = 0.0
        var count = 0
    }

    /// Everything counted for one upstream label. Status codes are Int keys; attempts ending in a status are counted
    /// by class in a fixed array (the common case hashes no string), other outcome and reason labels are static
    /// strings.
    struct UpstreamCounters {
        var requestsByCode: [Int: Int] = [:]
        /// Attempts that got a `1xx`…`5xx` status, by class (index 0 is `1xx`).
        var attemptsByStatusClass = [Int](repeating: 0, count: 5)
        var otherAttempts: [String: Int] = [:]
        var retries: [String: Int] = [:]
        var budgetExhausted = 0
        var durations = Histogram()
        var hasDurations = false
        /// The status page's last minute of requests, answers and attempts.
        var activity = ActivityWindow()

        var attempts: [String: Int] {
            var all = otherAttempts
            for (index, count) in attemptsByStatusClass.enumerated() where count > 0 {
                all[ProxyMetrics.statusClassLabel((index + 1) * 100), default: 0] += count
            }
            return all
        }
    }

    /// One upstream's counters behind their own lock: an exchange looks its upstream up once and then records
    /// without hashing the upstream's name (and without contending with other upstreams' requests).
    public final class Upstream: Sendable {
        /// The upstream label these counters are for.
        let name: String
        private let counters = NIOLockedValueBox(UpstreamCounters())

        init(name: String) { self.name = name }

        func recordRequest(status: Int, seconds: Double) {
            let bucket = ProxyMetrics.durationBuckets.firstIndex { seconds <= $0 }
            counters.withLockedValue { Self.count(&$0, status: status, seconds: seconds, bucket: bucket) }
        }

        /// An exchange's end: `recordRequest` and the status page's activity window under one lock.
        func recordExchange(status: Int, seconds: Double, attempts: Int, second: Int64) {
            let bucket = ProxyMetrics.durationBuckets.firstIndex { seconds <= $0 }
            counters.withLockedValue { c in
                Self.count(&c, status: status, seconds: seconds, bucket: bucket)
                c.activity.record(second: second, success: status < 500, attempts: attempts)
            }
        }

        private static func count(_ c: inout UpstreamCounters, status: Int, seconds: Double, bucket: Int?) {
            c.requestsByCode[status, default: 0] += 1
            if let bucket { c.durations.counts[bucket] += 1 }
            c.durations.sum += seconds
            c.durations.count += 1
            c.hasDurations = true
        }

        /// An attempt that ended with an upstream status.
        func recordAttempt(status: Int) {
            let statusClass = status / 100
            guard (1...5).contains(statusClass) else {
                recordAttempt(outcome: ProxyMetrics.statusClassLabel(status))
                return
            }
            counters.withLockedValue { $0.attemptsByStatusClass[statusClass - 1] += 1 }
        }

        /// An attempt that ended without a status (`timeout`, a transport failure's label).
        func recordAttempt(outcome: String) {
            counters.withLockedValue { $0.otherAttempts[outcome, default: 0] += 1 }
        }

        func recordRetry(reason: String) {
            counters.withLockedValue { $0.retries[reason, default: 0] += 1 }
        }

        func recordBudgetExhausted() {
            counters.withLockedValue { $0.budgetExhausted += 1 }
        }

        var snapshot: UpstreamCounters { counters.withLockedValue { $0 } }
    }

    private let upstreams = NIOLockedValueBox([String: Upstream]())

    public init() {}

    /// The counters of the upstream labelled `name`, made on first use (they outlive config reloads).
    func upstream(_ name: String) -> Upstream {
        upstreams.withLockedValue { table in
            if let existing = table[name] { return existing }
            let made = Upstream(name: name)
            table[name] = made
            return made
        }
    }

    /// `upstream(name)`, or `known` when it is that upstream's: a connection keeps the last one it used.
    func upstream(_ name: String, known: Upstream?) -> Upstream {
        if let known, known.name == name { return known }
        return upstream(name)
    }

    func recordRequest(upstream: String, status: Int, seconds: Double) {
        self.upstream(upstream).recordRequest(status: status, seconds: seconds)
    }

    /// `2xx`-style outcome labels, without formatting a string per attempt.
    static func statusClassLabel(_ status: Int) -> String {
        switch status / 100 {
        case 1: "1xx"
        case 2: "2xx"
        case 3: "3xx"
        case 4: "4xx"
        case 5: "5xx"
        default: "\(status / 100)xx"
        }
    }

    public func render(
        inflight: Int, tokenRefreshes: [String: [TokenManager.RefreshResult: Int]], keychainWriteErrors: Int = 0
    ) -> String {
        let s = upstreams.withLockedValue { $0 }.map { (key: $0.key, value: $0.value.snapshot) }.sorted {
            $0.key < $1.key
        }
        var out = PrometheusText()
        func pairs(_ name: String, _ label: String, _ values: (UpstreamCounters) -> [(String, Int)]) {
            for (upstream, counters) in s {
                for (value, count) in values(counters).sorted(by: { $0.0 < $1.0 }) {
                    out.sample(name, ["upstream": upstream, label: value], count)
                }
            }
        }
        out.family("backstop_requests_total", .counter, "Client requests answered, by upstream and status code.")
        pairs("backstop_requests_total", "code") { $0.requestsByCode.map { (String($0.key), $0.value) } }
        out.family(
            "backstop_upstream_attempts_total", .counter, "Upstream attempts, by outcome (status class or failure).")
        pairs("backstop_upstream_attempts_total", "outcome") { $0.attempts.map { ($0.key, $0.value) } }
        out.family("backstop_retries_total", .counter, "Retries made, by the retry.on condition that caused them.")
        pairs("backstop_retries_total", "reason") { $0.retries.map { ($0.key, $0.value) } }
        out.family(
            "backstop_retry_budget_exhausted_total", .counter, "Retries refused because the retry budget was spent.")
        for (upstream, counters) in s where counters.budgetExhausted > 0 {
            out.sample("backstop_retry_budget_exhausted_total", ["upstream": upstream], counters.budgetExhausted)
        }
        out.family(
            "backstop_token_refreshes_total", .counter,
            "Token refreshes, by result (success, failure, adopted from the keychain).")
        for (upstream, results) in tokenRefreshes.sorted(by: { $0.key < $1.key }) {
            for (result, count) in results.sorted(by: { $0.key.rawValue < $1.key.rawValue }) {
                out.sample("backstop_token_refreshes_total", ["upstream": upstream, "result": result.rawValue], count)
            }
        }
        out.family(
            "backstop_request_duration_seconds", .histogram, "Client request duration, first byte in to last byte out."
        )
        for (upstream, counters) in s where counters.hasDurations {
            let histogram = counters.durations
            var cumulative = 0
            for (index, bound) in Self.durationBuckets.enumerated() {
                cumulative += histogram.counts[index]
                out.sample(
                    "backstop_request_duration_seconds_bucket", ["upstream": upstream, "le": "\(bound)"], cumulative)
            }
            out.sample(
                "backstop_request_duration_seconds_bucket", ["upstream": upstream, "le": "+Inf"], histogram.count)
            out.sample("backstop_request_duration_seconds_sum", ["upstream": upstream], histogram.sum)
            out.sample("backstop_request_duration_seconds_count", ["upstream": upstream], histogram.count)
        }
        out.family(
            "backstop_keychain_write_errors_total", .counter, "Failed keychain writes of refreshed tokens (retried).")
        out.sample("backstop_keychain_write_errors_total", keychainWriteErrors)
        out.family("backstop_inflight_requests", .gauge, "Client requests being handled now.")
        out.sample("backstop_inflight_requests", inflight)
        return out.text
    }
}
