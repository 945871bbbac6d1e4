import Synchronization

/// The metrics SPEC §4 names, kept in one lock-protected registry and rendered as Prometheus text.
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

    private struct State {
        var requests: [LabelPair: Int] = [:]
        var attempts: [LabelPair: Int] = [:]
        var retries: [LabelPair: Int] = [:]
        var budgetExhausted: [String: Int] = [:]
        var durations: [String: Histogram] = [:]
    }

    private struct LabelPair: Hashable {
        var upstream: String
        var value: String
    }

    private let state = Mutex(State())

    public init() {}

    func recordRequest(upstream: String, status: Int, seconds: Double) {
        state.withLock { s in
            s.requests[LabelPair(upstream: upstream, value: String(status)), default: 0] += 1
            var histogram = s.durations[upstream] ?? Histogram()
            if let bucket = Self.durationBuckets.firstIndex(where: { seconds <= $0 }) { histogram.counts[bucket] += 1 }
            histogram.sum += seconds
            histogram.count += 1
            s.durations[upstream] = histogram
        }
    }

    func recordAttempt(upstream: String, outcome: String) {
        state.withLock { $0.attempts[LabelPair(upstream: upstream, value: outcome), default: 0] += 1 }
    }

    func recordRetry(upstream: String, reason: String) {
        state.withLock { $0.retries[LabelPair(upstream: upstream, value: reason), default: 0] += 1 }
    }

    func recordBudgetExhausted(upstream: String) {
        state.withLock { $0.budgetExhausted[upstream, default: 0] += 1 }
    }

    /// The Prometheus text exposition (version 0.0.4) of everything, plus the given gauges and token counters.
    public func render(inflight: Int, tokenRefreshes: [String: [TokenManager.RefreshResult: Int]]) -> String {
        let s = state.withLock { $0 }
        var out = ""
        func family(_ name: String, _ type: String, _ help: String) {
            out += "# HELP \(name) \(help)\n# TYPE \(name) \(type)\n"
        }
        func pairs(_ name: String, _ label: String, _ values: [LabelPair: Int]) {
            for (key, count) in values.sorted(by: { ($0.key.upstream, $0.key.value) < ($1.key.upstream, $1.key.value) }) {
                out += "\(name){upstream=\"\(Self.escape(key.upstream))\",\(label)=\"\(Self.escape(key.value))\"} \(count)\n"
            }
        }
        family("backstop_requests_total", "counter", "Client requests answered, by upstream and status code.")
        pairs("backstop_requests_total", "code", s.requests)
        family("backstop_upstream_attempts_total", "counter", "Upstream attempts, by outcome (status class or failure).")
        pairs("backstop_upstream_attempts_total", "outcome", s.attempts)
        family("backstop_retries_total", "counter", "Retries made, by the retry.on condition that caused them.")
        pairs("backstop_retries_total", "reason", s.retries)
        family("backstop_retry_budget_exhausted_total", "counter", "Retries refused because the retry budget was spent.")
        for (upstream, count) in s.budgetExhausted.sorted(by: { $0.key < $1.key }) {
            out += "backstop_retry_budget_exhausted_total{upstream=\"\(Self.escape(upstream))\"} \(count)\n"
        }
        family("backstop_token_refreshes_total", "counter", "Token refreshes, by result (success, failure, adopted from the keychain).")
        for (upstream, results) in tokenRefreshes.sorted(by: { $0.key < $1.key }) {
            for (result, count) in results.sorted(by: { $0.key.rawValue < $1.key.rawValue }) {
                out += "backstop_token_refreshes_total{upstream=\"\(Self.escape(upstream))\",result=\"\(result.rawValue)\"} \(count)\n"
            }
        }
        family("backstop_request_duration_seconds", "histogram", "Client request duration, first byte in to last byte out.")
        for (upstream, histogram) in s.durations.sorted(by: { $0.key < $1.key }) {
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
