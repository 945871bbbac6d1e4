import BackstopCore
import BackstopTestSupport
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Testing

@testable import BackstopServer

/// `UpstreamHealth`: the shared wrapper reads the injected clock, keeps one `EndpointSet` for every caller, and
/// turns what the set decided into metrics and log lines.
@Suite("Upstream health")
struct UpstreamHealthTests {
    static func upstream(failures: Int = 2, openFor: Duration = .seconds(10), maxInflight: Int = 2) -> UpstreamConfig {
        UpstreamConfig(
            name: "api", match: MatchConfig(hosts: ["api.test"]),
            endpoints: [
                UpstreamURL(scheme: "http", host: "a.test", port: 8080), UpstreamURL(scheme: "http", host: "b.test"),
            ],
            circuit: CircuitConfig(failures: failures, openFor: openFor, maxInflight: maxInflight))
    }

    /// Log lines as `level message key=value…`, sorted keys.
    final class Lines: Sendable {
        let all = NIOLockedValueBox<[String]>([])
        var logger: Logger {
            Logger(label: "test") { _ in Handler(lines: self) }
        }
        struct Handler: LogHandler {
            let lines: Lines
            var metadata: Logger.Metadata = [:]
            var logLevel: Logger.Level = .trace
            subscript(metadataKey key: String) -> Logger.Metadata.Value? {
                get { metadata[key] }
                set { metadata[key] = newValue }
            }
            func log(event: LogEvent) {
                let fields = (event.metadata ?? [:]).sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }
                lines.all.withLockedValue {
                    $0.append(([event.level.rawValue, "\(event.message)"] + fields).joined(separator: " "))
                }
            }
        }
    }

    @Test("failures eject on the clock, a probe restores; metrics and log lines follow each change")
    func ejectAndRestore() {
        let clock = ManualClock(start: .seconds(100))
        let metrics = OutageMetrics()
        let lines = Lines()
        let health = UpstreamHealth(upstream: Self.upstream(), clock: clock, metrics: metrics, logger: lines.logger)
        #expect(health.endpointKeys == ["http://a.test:8080", "http://b.test:80"])
        #expect(
            metrics.render().contains("backstop_endpoint_state{upstream=\"api\",endpoint=\"http://a.test:8080\"} 0\n"))

        #expect(health.choose() == .attempt(EndpointTicket(endpoint: 0, probe: nil)))
        health.report(.failure, ticket: EndpointTicket(endpoint: 0, probe: nil), reason: "connect-failure")
        health.report(.failure, ticket: EndpointTicket(endpoint: 0, probe: nil), reason: "status-503")
        #expect(
            lines.all.withLockedValue { $0 } == [
                "warning endpoint ejected ejection=1 endpoint=http://a.test:8080 for=10s reason=status-503 upstream=api"
            ])
        #expect(health.health == [.ejected, .healthy])
        #expect(health.choose() == .attempt(EndpointTicket(endpoint: 1, probe: nil)))
        let details = health.endpointDetails
        #expect(details[0].nextProbeIn == .seconds(10) && details[1].nextProbeIn == nil)

        clock.advance(by: .seconds(10))
        #expect(health.choose() == .attempt(EndpointTicket(endpoint: 0, probe: 1)))
        #expect(
            metrics.render().contains("backstop_endpoint_state{upstream=\"api\",endpoint=\"http://a.test:8080\"} 2\n"))
        health.report(.success, ticket: EndpointTicket(endpoint: 0, probe: 1), reason: nil)
        #expect(health.health == [.healthy, .healthy])
        #expect(
            lines.all.withLockedValue { $0 }.last == "notice endpoint restored endpoint=http://a.test:8080 upstream=api"
        )
        let text = metrics.render()
        #expect(text.contains("backstop_endpoint_state{upstream=\"api\",endpoint=\"http://a.test:8080\"} 0\n"))
        #expect(text.contains("backstop_ejections_total{upstream=\"api\",endpoint=\"http://a.test:8080\"} 1\n"))
    }

    @Test("every endpoint ejected: circuit-open with the seconds to the next probe, counted as a fast failure")
    func circuitOpen() {
        let clock = ManualClock()
        let metrics = OutageMetrics()
        let health = UpstreamHealth(
            upstream: Self.upstream(failures: 1, openFor: .milliseconds(2500)), clock: clock, metrics: metrics,
            logger: Lines().logger)
        health.report(.failure, ticket: EndpointTicket(endpoint: 0, probe: nil), reason: "reset")
        clock.advance(by: .seconds(1))
        health.report(.failure, ticket: EndpointTicket(endpoint: 1, probe: nil), reason: "reset")
        // Endpoint 0 may be probed 1.5 s from now: rounded up.
        #expect(health.choose() == .circuitOpen(retryAfter: 2))
        // Counted where a request ends with it (the exchange), not on the verdict: a retry may end otherwise.
        #expect(
            !metrics.render().contains("backstop_fast_failures_total{upstream=\"api\",reason=\"circuit-open\"} 1\n"))
    }

    @Test("an unreported probe past per_try ejects again, logged as unanswered, when anyone looks")
    func probeUnanswered() {
        let clock = ManualClock()
        let lines = Lines()
        var config = Self.upstream(failures: 1)
        config.timeouts.perTry = .seconds(3)
        let health = UpstreamHealth(upstream: config, clock: clock, metrics: OutageMetrics(), logger: lines.logger)
        health.report(.failure, ticket: EndpointTicket(endpoint: 0, probe: nil), reason: "timeout")
        clock.advance(by: .seconds(10))
        #expect(health.choose() == .attempt(EndpointTicket(endpoint: 0, probe: 1)))
        clock.advance(by: .seconds(3))
        #expect(health.health == [.ejected, .healthy])
        #expect(
            lines.all.withLockedValue { $0 }.last
                == "warning endpoint ejected ejection=2 endpoint=http://a.test:8080 for=20s reason=probe unanswered upstream=api"
        )
    }

    @Test("max_inflight: one slot per request, the one beyond is overloaded and counted")
    func maxInflight() {
        let metrics = OutageMetrics()
        let health = UpstreamHealth(
            upstream: Self.upstream(maxInflight: 2), clock: ManualClock(), metrics: metrics, logger: Lines().logger)
        #expect([health.acquire(), health.acquire(), health.acquire()] == [.admitted, .admitted, .overloaded])
        #expect(health.inflight == 2)
        health.release()
        #expect(health.acquire() == .admitted)
        #expect(
            metrics.render().contains(
                "backstop_fast_failures_total{upstream=\"api\",reason=\"upstream-overloaded\"} 1\n"))
    }

    @Test("a reload keeps the health while endpoints and circuit are the same, and starts over otherwise")
    func carriedAcrossReload() {
        let clock = ManualClock()
        let metrics = OutageMetrics()
        let logger = Lines().logger
        let first = UpstreamHealth(upstream: Self.upstream(), clock: clock, metrics: metrics, logger: logger)
        var same = Self.upstream()
        same.retry.attempts = 7
        #expect(UpstreamHealth.carried(first, for: same, clock: clock, metrics: metrics, logger: logger) === first)
        #expect(
            UpstreamHealth.carried(
                first, for: Self.upstream(failures: 3), clock: clock, metrics: metrics, logger: logger)
                !== first)
        var fewer = Self.upstream()
        fewer.endpoints.removeLast()
        #expect(UpstreamHealth.carried(first, for: fewer, clock: clock, metrics: metrics, logger: logger) !== first)
        #expect(UpstreamHealth.carried(nil, for: same, clock: clock, metrics: metrics, logger: logger) !== first)
    }

    @Test("p95 head latency: 250 ms until 20 samples, then the window's 95th percentile; a fixed after as is")
    func hedgeDelay() {
        let clock = ManualClock()
        let health = UpstreamHealth(
            upstream: Self.upstream(), clock: clock, metrics: OutageMetrics(), logger: Lines().logger)
        #expect(health.hedgeDelay(.fixed(.milliseconds(40))) == .milliseconds(40))
        for _ in 0..<19 { health.recordHeadLatency(.milliseconds(100)) }
        #expect(health.hedgeDelay(.p95) == .milliseconds(250))
        health.recordHeadLatency(.milliseconds(100))
        let delay = health.hedgeDelay(.p95)
        #expect(delay >= .milliseconds(100) && delay <= .milliseconds(125))
        clock.advance(by: .seconds(61))
        #expect(health.hedgeDelay(.p95) == .milliseconds(250))
    }

    @Test("endpoints are shared by every caller: concurrent reports from many threads count every failure")
    func concurrentReports() async {
        let health = UpstreamHealth(
            upstream: Self.upstream(failures: 400), clock: ManualClock(), metrics: OutageMetrics(),
            logger: Lines().logger)
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<8 {
                group.addTask {
                    for _ in 0..<50 {
                        health.report(.failure, ticket: EndpointTicket(endpoint: 1, probe: nil), reason: "reset")
                    }
                }
            }
        }
        #expect(health.health == [.healthy, .ejected])
    }
}

/// `NetworkReturnSignal`: a wait is woken once, on its loop, by the first change after the generation it saw.
@Suite("Network return signal")
struct NetworkReturnSignalTests {
    final class Count: Sendable {
        let value = NIOLockedValueBox(0)
        let loops = NIOLockedValueBox<[Bool]>([])
    }

    /// Waits (with a deadline) until `count` wakes were seen.
    static func expectWakes(_ count: Count, _ expected: Int) async throws {
        _ = await Poll.holds(within: .seconds(2), every: .milliseconds(1)) {
            count.value.withLockedValue { $0 } >= expected
        }
        #expect(count.value.withLockedValue { $0 } == expected)
    }

    @Test("woken by the next change, on its loop, once; a cancelled wait is not")
    func wakes() async throws {
        let signal = NetworkReturnSignal()
        let loop = MultiThreadedEventLoopGroup.singleton.next()
        let count = Count()
        let wake: @Sendable () -> Void = {
            count.loops.withLockedValue { $0.append(loop.inEventLoop) }
            count.value.withLockedValue { $0 += 1 }
        }
        _ = signal.wait(after: signal.generation, on: loop, wake)
        let cancelled = signal.wait(after: signal.generation, on: loop, wake)
        signal.cancel(cancelled)
        #expect(signal.waiting == 1)
        signal.signal()
        signal.signal()
        try await Self.expectWakes(count, 1)
        #expect(count.loops.withLockedValue { $0 } == [true])
        #expect(signal.waiting == 0 && signal.generation == 2)
    }

    @Test("a change after the generation seen, before the wait began, wakes it at once")
    func changeBeforeWait() async throws {
        let signal = NetworkReturnSignal()
        let loop = MultiThreadedEventLoopGroup.singleton.next()
        let count = Count()
        let seen = signal.generation
        signal.signal()
        _ = signal.wait(after: seen, on: loop) { count.value.withLockedValue { $0 += 1 } }
        #expect(signal.waiting == 0)
        try await Self.expectWakes(count, 1)
    }
}
