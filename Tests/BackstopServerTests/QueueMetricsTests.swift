import BackstopQueue
import Testing

@testable import BackstopServer

/// The queued-delivery metrics' rendering (docs/reference/operations.md#metrics).
@Suite("Queue metrics")
struct QueueMetricsTests {
    @Test("spool bytes, depth and oldest age per queue upstream (0 when empty), deliveries by result")
    func render() {
        let metrics = QueueMetrics()
        metrics.record(upstream: "events", .delivered, count: 3)
        metrics.record(upstream: "events", .dead)
        metrics.record(upstream: "gone", .delivered, count: 0)
        let snapshot = QueueSnapshot(
            upstreams: [
                "events": .init(queued: 7, dead: 2, oldestQueuedAt: 1000), "old\"q": .init(queued: 0, dead: 1),
            ],
            storedBytes: 4096)
        let text = metrics.render(
            queueUpstreams: ["audit", "events"], snapshot: snapshot, spoolBytes: 5000, now: 1090.5)
        let lines = text.split(separator: "\n").filter { !$0.hasPrefix("#") }
        #expect(
            lines == [
                "backstop_spool_bytes 5000",
                "backstop_queue_depth{upstream=\"audit\"} 0",
                "backstop_queue_depth{upstream=\"events\"} 7",
                "backstop_queue_depth{upstream=\"old\\\"q\"} 0",
                "backstop_queue_oldest_seconds{upstream=\"audit\"} 0.0",
                "backstop_queue_oldest_seconds{upstream=\"events\"} 90.5",
                "backstop_queue_oldest_seconds{upstream=\"old\\\"q\"} 0.0",
                "backstop_deliveries_total{upstream=\"audit\",result=\"delivered\"} 0",
                "backstop_deliveries_total{upstream=\"audit\",result=\"dead\"} 0",
                "backstop_deliveries_total{upstream=\"events\",result=\"delivered\"} 3",
                "backstop_deliveries_total{upstream=\"events\",result=\"dead\"} 1",
                "backstop_deliveries_total{upstream=\"old\\\"q\",result=\"delivered\"} 0",
                "backstop_deliveries_total{upstream=\"old\\\"q\",result=\"dead\"} 0",
            ])
        #expect(text.contains("# TYPE backstop_deliveries_total counter\n"))
        #expect(text.contains("# TYPE backstop_queue_depth gauge\n"))
    }
}
