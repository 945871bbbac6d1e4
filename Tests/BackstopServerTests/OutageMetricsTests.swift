import BackstopCore
import Testing

@testable import BackstopServer

/// The outage metrics as Prometheus text, recorded from `EndpointSet` events and exchange verdicts.
@Suite("Outage metrics")
struct OutageMetricsTests {
    static let endpoints = ["http://a.test:80", "http://b.test:80"]

    @Test("endpoint states follow the events; ejections count every ejection")
    func endpointStates() {
        let metrics = OutageMetrics()
        metrics.register(upstream: "api", endpoints: Self.endpoints)
        metrics.record(
            [.ejected(endpoint: 1, openFor: .seconds(30), ejection: 1)], upstream: "api", endpoints: Self.endpoints)
        metrics.record([.probing(endpoint: 1)], upstream: "api", endpoints: Self.endpoints)
        var text = metrics.render()
        #expect(text.contains("backstop_endpoint_state{upstream=\"api\",endpoint=\"http://a.test:80\"} 0\n"))
        #expect(text.contains("backstop_endpoint_state{upstream=\"api\",endpoint=\"http://b.test:80\"} 2\n"))
        metrics.record(
            [
                .ejected(endpoint: 1, openFor: .seconds(60), ejection: 2),
                .ejected(endpoint: 0, openFor: .seconds(30), ejection: 1),
            ],
            upstream: "api", endpoints: Self.endpoints)
        metrics.record(
            [.probing(endpoint: 0), .probeReleased(endpoint: 0)], upstream: "api", endpoints: Self.endpoints)
        text = metrics.render()
        #expect(text.contains("backstop_endpoint_state{upstream=\"api\",endpoint=\"http://a.test:80\"} 1\n"))
        #expect(text.contains("backstop_ejections_total{upstream=\"api\",endpoint=\"http://a.test:80\"} 1\n"))
        #expect(text.contains("backstop_ejections_total{upstream=\"api\",endpoint=\"http://b.test:80\"} 2\n"))
        metrics.record(
            [.restored(endpoint: 1), .ejected(endpoint: 7, openFor: .seconds(1), ejection: 1)],
            upstream: "api", endpoints: Self.endpoints)
        text = metrics.render()
        #expect(text.contains("backstop_endpoint_state{upstream=\"api\",endpoint=\"http://b.test:80\"} 0\n"))
        #expect(!text.contains("endpoint=\"7\""))
    }

    @Test("a reload that changes the endpoints replaces their state series and keeps the counters")
    func reregister() {
        let metrics = OutageMetrics()
        metrics.register(upstream: "api", endpoints: Self.endpoints)
        metrics.register(upstream: "other", endpoints: ["https://c.test:443"])
        metrics.record(
            [.ejected(endpoint: 0, openFor: .seconds(30), ejection: 1)], upstream: "api", endpoints: Self.endpoints)
        metrics.register(upstream: "api", endpoints: ["http://b.test:80"])
        let text = metrics.render()
        #expect(!text.contains("backstop_endpoint_state{upstream=\"api\",endpoint=\"http://a.test:80\"}"))
        #expect(text.contains("backstop_endpoint_state{upstream=\"api\",endpoint=\"http://b.test:80\"} 0\n"))
        #expect(text.contains("backstop_endpoint_state{upstream=\"other\",endpoint=\"https://c.test:443\"} 0\n"))
        #expect(text.contains("backstop_ejections_total{upstream=\"api\",endpoint=\"http://a.test:80\"} 1\n"))
    }

    @Test("fast failures, hedges and network changes")
    func counters() {
        let metrics = OutageMetrics()
        var text = metrics.render()
        for family in [
            "backstop_endpoint_state gauge", "backstop_ejections_total counter", "backstop_fast_failures_total counter",
            "backstop_hedges_total counter", "backstop_network_changes_total counter",
        ] {
            #expect(text.contains("# TYPE \(family)\n"))
        }
        #expect(text.contains("backstop_network_changes_total 0\n"))
        metrics.record(.circuitOpen, upstream: "api")
        metrics.record(.circuitOpen, upstream: "api")
        metrics.record(.upstreamOverloaded, upstream: "b\"x")
        metrics.record(.won, upstream: "api")
        metrics.record(.cancelled, upstream: "api")
        metrics.record(.cancelled, upstream: "api")
        metrics.recordNetworkChanges(3)
        text = metrics.render()
        #expect(text.contains("backstop_fast_failures_total{upstream=\"api\",reason=\"circuit-open\"} 2\n"))
        #expect(text.contains("backstop_fast_failures_total{upstream=\"b\\\"x\",reason=\"upstream-overloaded\"} 1\n"))
        #expect(!text.contains("reason=\"upstream-overloaded\"} 0"))
        #expect(text.contains("backstop_hedges_total{upstream=\"api\",result=\"won\"} 1\n"))
        #expect(text.contains("backstop_hedges_total{upstream=\"api\",result=\"cancelled\"} 2\n"))
        #expect(!text.contains("result=\"lost\""))
        #expect(text.contains("backstop_network_changes_total 3\n"))
    }
}
