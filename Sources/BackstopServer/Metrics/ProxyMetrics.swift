import NIOConcurrencyHelpers

/// The metrics docs/reference/operations.md#metrics names, kept in one lock-protected registry and rendered as Prometheus text.
///
/// Hand-written rather than swift-metrics + swift-prometheus: seven metrics with fixed label sets do not need a
/// process-global metrics backend, and rendering the exposition format is a few lines.
public final class ProxyMetrics: Sendable {
    /// Upper bounds (seconds) of the request duration histogram: sub-millisecond proxying to slow upstreams.
    public static let durationBuckets: [Double] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60]

    private struct Histogram {
        var counts = [Int](repeating: 0, count: ProxyMetrics.durationBuckets.count)
        var sum = 0.0
        var count = 0
    }

    /// Everything counted for one upstream label. Mutated in place under the lock (no copy per request):
    /// status codes are Int keys, outcome and reason labels are static strings.
    private struct UpstreamCounters {
        var requestsByCode: [Int: Int] = [:]
        var attempts: [String: Int] = [:]
        var retries: [String: Int] = [:]
        var budgetExhausted = 0
        var durations = Histogram()
        var hasDurations = false

        mutating func recordRequest(status: Int, seconds: Double, bucket: Int?) {
            requestsByCode[status, default: 0] += 1
            if let bucket { durations.counts[bucket] += 1 }
            durations.sum += seconds
            durations.count += 1
            hasDurations = true
        }
    }

    private let state = NIOLockedValueBox([String: UpstreamCounters]())

    public init() {}

    func recordRequest(upstream: String, status: Int, seconds: Double) {
        let bucket = Self.durationBuckets.firstIndex { seconds <= $0 }
        state.withLockedValue { s in
            s[upstream, default: UpstreamCounters()].recordRequest(status: status, seconds: seconds, bucket: bucket)
        }
    }

    func recordAttempt(upstream: String, outcome: String) {
        state.withLockedValue { $0[upstream, default: UpstreamCounters()].attempts[outcome, default: 0] += 1 }
    }

    func recordRetry(upstream: String, reason: String) {
        state.withLockedValue { $0[upstream, default: UpstreamCounters()].retries[reason, default: 0] += 1 }
    }

    func recordBudgetExhausted(upstream: String) {
        state.withLockedValue { $0[upstream, default: UpstreamCounters()].budgetExhausted += 1 }
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
        let s = state.withLockedValue { $0 }.sorted { $0.key < $1.key }
        var out = ""
        func family(_ name: String, _ type: String, _ help: String) {
            out += "# HELP \(name) \(help)\n# TYPE \(name) \(type)\n"
        }
        func pairs(_ name: String, _ label: String, _ values: (UpstreamCounters) -> [(String, Int)]) {
            for (upstream, counters) in s {
                for (value, count) in values(counters).sorted(by: { $0.0 < $1.0 }) {
                    out += "\(name){upstream=\"\(Self.escape(upstream))\",\(label)=\"\(Self.escape(value))\"} \(count)\n"
                }
            }
        }
        family("backstop_requests_total", "counter", "Client requests answered, by upstream and status code.")
        pairs("backstop_requests_total", "code") { $0.requestsByCode.map { (String($0.key), $0.value) } }
        family("backstop_upstream_attempts_total", "counter", "Upstream attempts, by outcome (status class or failure).")
        pairs("backstop_upstream_attempts_total", "outcome") { $0.attempts.map { ($0.key, $0.value) } }
        family("backstop_retries_total", "counter", "Retries made, by the retry.on condition that caused them.")
        pairs("backstop_retries_total", "reason") { $0.retries.map { ($0.key, $0.value) } }
        family("backstop_retry_budget_exhausted_total", "counter", "Retries refused because the retry budget was spent.")
        for (upstream, counters) in s where counters.budgetExhausted > 0 {
            out += "backstop_retry_budget_exhausted_total{upstream=\"\(Self.escape(upstream))\"} \(counters.budgetExhausted)\n"
        }
        family("backstop_token_refreshes_total", "counter", "Token refreshes, by result (success, failure, adopted from the keychain).")
        for (upstream, results) in tokenRefreshes.sorted(by: { $0.key < $1.key }) {
            for (result, count) in results.sorted(by: { $0.key.rawValue < $1.key.rawValue }) {
                out += "backstop_token_refreshes_total{upstream=\"\(Self.escape(upstream))\",result=\"\(result.rawValue)\"} \(count)\n"
            }
        }
        family("backstop_request_duration_seconds", "histogram", "Client request duration, first byte in to last byte out.")
        for (upstream, counters) in s where counters.hasDurations {
            let histogram = counters.durations
            let label = "upstream=\"\(Self.escape(upstream))\""
            var cumulative = 0
            for (index, bound) in Self.durationBuckets.enumerated() {
                cumulative += histogram.counts[index]
                out += "backstop_request_duration_seconds_bucket{\(label),le=\"\(bound)\"} \(cumulative)\n"
            }
            out += "backstop_request_duration_seconds_bucket{\(label),le=\"+Inf\"} \(histogram.count)\n"
            out += "backstop_request_duration_seconds_sum{\(label)} \(histogram.sum)\n"
            out += "backstop_request_duration_seconds_count{\(label)} \(histogram.count)\n"
        }
        family("backstop_keychain_write_errors_total", "counter", "Failed keychain writes of refreshed tokens (retried).")
        out += "backstop_keychain_write_errors_total \(keychainWriteErrors)\n"
        family("backstop_inflight_requests", "gauge", "Client requests being handled now.")
        out += "backstop_inflight_requests \(inflight)\n"
        return out
    }

    static func escape(_ value: String) -> String {
        var out = ""
        for ch in value {
            switch ch {
            case "\\": out += "\\\\"
            case "\"": out += "\\\""
            case "\n": out += "\\n"
            default: out.append(ch)
            }
        }
        return out
    }
}
