import BackstopTestSupport
import Foundation
import Testing

/// deploy/: the Grafana dashboard and the alerting rules name only metrics a live `/metrics` scrape has (or, for
/// alerts, the few the docs list as not exported yet), and the scrape passes `promtool check metrics`
/// (Debian's `prometheus` package; .ci/run installs it).
@Suite("Deploy files")
struct DeployFilesTests {
    static let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    /// Alert rules on metrics that other parts of the product will export (docs/reference/operations.md#alerts-and-dashboard).
    static let notExportedYet: Set<String> = [
        "backstop_queue_oldest_seconds"
    ]

    /// `backstop_*` and `process_*` names in a file, histogram and summary suffixes taken off.
    static func metricNames(in path: String) throws -> Set<String> {
        let text = try String(contentsOf: repository.appendingPathComponent(path), encoding: .utf8)
        let regex = try NSRegularExpression(pattern: "\\b(backstop|process)_[a-z_]+")
        let names = regex.matches(in: text, range: NSRange(text.startIndex..., in: text)).compactMap {
            Range($0.range, in: text).map { String(text[$0]) }
        }
        return Set(
            names.map { name in
                for suffix in ["_bucket", "_sum", "_count"] where name.hasSuffix(suffix) {
                    return String(name.dropLast(suffix.count))
                }
                return name
            })
    }

    @Test("a live scrape passes promtool; the dashboard and alerts name only metrics it has")
    func scrape() async throws {
        let proxy = try await ProxyHarness.start(
            """
            admin: {listen: 127.0.0.1:0}
            tracing: {otlp_endpoint: "http://127.0.0.1:1"}
            upstreams:
              - {name: api, match: {hosts: [api.test]}, url: "http://127.0.0.1:1", retry: {attempts: 1}}
            """)
        let adminPort = try #require(proxy.server.adminAddress?.port)
        _ = try await proxy.get("http://api.test/", host: "api.test")
        let scrape = try await RawHTTP.exchange(
            port: adminPort, request: RawHTTP.request("GET", "/metrics", host: "admin"), timeout: .seconds(5))
        await proxy.stop()
        #expect(scrape.status == 200)
        let text = scrape.bodyString

        let promtool = ["/usr/bin/promtool", "/usr/local/bin/promtool"].first {
            FileManager.default.isExecutableFile(atPath: $0)
        }
        let tool = try #require(promtool, "promtool not found: apt-get install prometheus")
        let path = NSTemporaryDirectory() + "metrics-\(UUID().uuidString).txt"
        try text.write(toFile: path, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: path) }
        let lint = try await TestProcess.run("/bin/sh", ["-c", "exec \"$0\" check metrics < \"$1\"", tool, path])
        #expect(lint.status == 0, "promtool check metrics: \(lint.standardOutput)\(lint.standardError)")

        let families = Set(
            text.split(separator: "\n").filter { $0.hasPrefix("# TYPE ") }.map {
                String($0.split(separator: " ")[2])
            })
        let dashboard = try Self.metricNames(in: "deploy/grafana/backstop.json")
        #expect(dashboard.count >= 20)
        #expect(
            dashboard.subtracting(families).isEmpty,
            "dashboard names unknown metrics: \(dashboard.subtracting(families))")
        let alerts = try Self.metricNames(in: "deploy/prometheus/alerts.yaml")
        #expect(alerts.subtracting(families) == Self.notExportedYet, "\(alerts.subtracting(families))")
    }
}
