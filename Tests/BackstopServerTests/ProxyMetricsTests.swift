import Testing

@testable import BackstopServer

/// The metrics registry's counting and rendering (docs/reference/operations.md#metrics), without a daemon: per-upstream
/// handles, attempts by status class next to named outcomes, and the duration histogram.
@Suite("Proxy metrics")
struct ProxyMetricsTests {
    @Test("a handle counts into the same series as a lookup by name, and survives being looked up again")
    func handlesShareCounters() {
        let metrics = ProxyMetrics()
        let app = metrics.upstream("app")
        app.recordRequest(status: 200, seconds: 0.002)
        metrics.recordRequest(upstream: "app", status: 200, seconds: 0.2)
        metrics.upstream("app").recordRequest(status: 503, seconds: 90)
        metrics.recordRequest(upstream: "-", status: 403, seconds: 0)
        #expect(metrics.upstream("app") === app)
        let text = metrics.render(inflight: 0, tokenRefreshes: [:])
        #expect(text.contains("backstop_requests_total{upstream=\"app\",code=\"200\"} 2\n"))
        #expect(text.contains("backstop_requests_total{upstream=\"app\",code=\"503\"} 1\n"))
        #expect(text.contains("backstop_requests_total{upstream=\"-\",code=\"403\"} 1\n"))
        // 0.002 s lands in le=0.0025 and every bucket above; 90 s only in +Inf.
        #expect(text.contains("backstop_request_duration_seconds_bucket{upstream=\"app\",le=\"0.001\"} 0\n"))
        #expect(text.contains("backstop_request_duration_seconds_bucket{upstream=\"app\",le=\"0.0025\"} 1\n"))
        #expect(text.contains("backstop_request_duration_seconds_bucket{upstream=\"app\",le=\"0.25\"} 2\n"))
        #expect(text.contains("backstop_request_duration_seconds_bucket{upstream=\"app\",le=\"60.0\"} 2\n"))
        #expect(text.contains("backstop_request_duration_seconds_bucket{upstream=\"app\",le=\"+Inf\"} 3\n"))
        #expect(text.contains("backstop_request_duration_seconds_count{upstream=\"app\"} 3\n"))
    }

    @Test("attempts by status class and by failure label render as one sorted outcome family")
    func attemptOutcomes() {
        let metrics = ProxyMetrics()
        let app = metrics.upstream("app")
        for status in [200, 204, 503, 502, 101, 404, 302] { app.recordAttempt(status: status) }
        app.recordAttempt(status: 999)  // outside 1xx…5xx: its own label, as the class label function names it
        app.recordAttempt(outcome: "timeout")
        app.recordAttempt(outcome: "timeout")
        app.recordAttempt(outcome: "connect-failure")
        app.recordRetry(reason: "503")
        app.recordBudgetExhausted()
        let lines = metrics.render(inflight: 3, tokenRefreshes: [:]).split(separator: "\n")
            .filter { $0.hasPrefix("backstop_upstream_attempts_total{") }
        #expect(
            lines == [
                "backstop_upstream_attempts_total{upstream=\"app\",outcome=\"1xx\"} 1",
                "backstop_upstream_attempts_total{upstream=\"app\",outcome=\"2xx\"} 2",
                "backstop_upstream_attempts_total{upstream=\"app\",outcome=\"3xx\"} 1",
                "backstop_upstream_attempts_total{upstream=\"app\",outcome=\"4xx\"} 1",
                "backstop_upstream_attempts_total{upstream=\"app\",outcome=\"5xx\"} 2",
                "backstop_upstream_attempts_total{upstream=\"app\",outcome=\"9xx\"} 1",
                "backstop_upstream_attempts_total{upstream=\"app\",outcome=\"connect-failure\"} 1",
                "backstop_upstream_attempts_total{upstream=\"app\",outcome=\"timeout\"} 2",
            ])
        let text = metrics.render(inflight: 3, tokenRefreshes: [:])
        #expect(text.contains("backstop_retries_total{upstream=\"app\",reason=\"503\"} 1\n"))
        #expect(text.contains("backstop_retry_budget_exhausted_total{upstream=\"app\"} 1\n"))
        #expect(text.contains("backstop_inflight_requests 3\n"))
    }
}
