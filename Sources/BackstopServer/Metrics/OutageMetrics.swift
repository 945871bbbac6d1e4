import BackstopCore
import NIOConcurrencyHelpers
import Synchronization

/// The metrics of an upstream that is failing (docs/reference/operations.md#metrics): each endpoint's state,
/// ejections, requests failed fast, hedged copies and network changes. Recorded from decisions (the events an
/// `EndpointSet` call returns, the exchange's verdicts), never by reading their state.
public final class OutageMetrics: Sendable {
    /// `backstop_fast_failures_total{reason}`: requests answered at once without an attempt.
    public enum FastFailure: String, CaseIterable, Sendable {
        case circuitOpen = "circuit-open"
        case upstreamOverloaded = "upstream-overloaded"
    }

    /// `backstop_hedges_total{result}`: how a hedged copy ended.
    public enum HedgeResult: String, CaseIterable, Sendable {
        /// Its response head was the one delivered.
        case won
        /// It ended with a failure (a `retry.on` condition).
        case lost
        /// Another attempt won first; this one was cancelled.
        case cancelled
    }

    private struct Series: Hashable, Comparable {
        var upstream: String
        var endpoint: String
        static func < (a: Series, b: Series) -> Bool { (a.upstream, a.endpoint) < (b.upstream, b.endpoint) }
    }

    private struct Counts {
        var states: [Series: EndpointHealth] = [:]
        var ejections: [Series: Int] = [:]
        var fastFailures: [String: [Int]] = [:]
        var hedges: [String: [Int]] = [:]
    }

    private let counts = NIOLockedValueBox(Counts())
    private let networkChanges = Atomic<Int>(0)

    public init() {}

    /// An upstream's endpoints (labels in `endpoints` order, `UpstreamURL.endpointKey`), all healthy: at start and
    /// when a reload changes them. Endpoints no longer listed lose their state series; counters stay.
    public func register(upstream: String, endpoints: [String]) {
        counts.withLockedValue { counts in
            counts.states = counts.states.filter { $0.key.upstream != upstream }
            for endpoint in endpoints { counts.states[Series(upstream: upstream, endpoint: endpoint)] = .healthy }
        }
    }

    /// A reload left only `upstreams`: the state series of the others go (an ejected endpoint of a removed upstream
    /// would otherwise read as ejected for good, and its alert fire until a restart); counters stay.
    public func keepStates(of upstreams: Set<String>) {
        counts.withLockedValue { counts in counts.states = counts.states.filter { upstreams.contains($0.key.upstream) }
        }
    }

    /// What one `EndpointSet` call changed; `endpoints` are the labels of the set's endpoints by index.
    public func record(_ events: [EndpointEvent], upstream: String, endpoints: [String]) {
        guard !events.isEmpty else { return }
        counts.withLockedValue { counts in
            for event in events {
                let (index, state): (Int, EndpointHealth) =
                    switch event {
                    case .ejected(let endpoint, _, _): (endpoint, .ejected)
                    case .probing(let endpoint): (endpoint, .probing)
                    case .probeReleased(let endpoint): (endpoint, .ejected)
                    case .restored(let endpoint): (endpoint, .healthy)
                    }
                guard endpoints.indices.contains(index) else { continue }
                let series = Series(upstream: upstream, endpoint: endpoints[index])
                counts.states[series] = state
                if case .ejected = event { counts.ejections[series, default: 0] += 1 }
            }
        }
    }

    public func record(_ failure: FastFailure, upstream: String) {
        let index = FastFailure.allCases.firstIndex(of: failure)!
        counts.withLockedValue { counts in
            counts.fastFailures[upstream, default: Array(repeating: 0, count: FastFailure.allCases.count)][index] += 1
        }
    }

    public func record(_ result: HedgeResult, upstream: String) {
        let index = HedgeResult.allCases.firstIndex(of: result)!
        counts.withLockedValue { counts in
            counts.hedges[upstream, default: Array(repeating: 0, count: HedgeResult.allCases.count)][index] += 1
        }
    }

    /// Network changes delivered by the `NetworkChangeMonitor`.
    public func recordNetworkChanges(_ count: Int) { networkChanges.add(count, ordering: .relaxed) }

    func render() -> String {
        let c = counts.withLockedValue { $0 }
        var out = PrometheusText()
        out.family("backstop_endpoint_state", .gauge, "Each endpoint's state: 0 healthy, 1 ejected, 2 probing.")
        for (series, state) in c.states.sorted(by: { $0.key < $1.key }) {
            out.sample(
                "backstop_endpoint_state", ["upstream": series.upstream, "endpoint": series.endpoint], state.rawValue)
        }
        out.family(
            "backstop_ejections_total", .counter, "Endpoint ejections, after failures in a row or a failed probe.")
        for (series, count) in c.ejections.sorted(by: { $0.key < $1.key }) {
            out.sample("backstop_ejections_total", ["upstream": series.upstream, "endpoint": series.endpoint], count)
        }
        out.family(
            "backstop_fast_failures_total", .counter, "Requests answered at once without an attempt, by reason.")
        for (upstream, values) in c.fastFailures.sorted(by: { $0.key < $1.key }) {
            for (index, reason) in FastFailure.allCases.enumerated() where values[index] > 0 {
                out.sample(
                    "backstop_fast_failures_total", ["upstream": upstream, "reason": reason.rawValue], values[index])
            }
        }
        out.family("backstop_hedges_total", .counter, "Hedged copies sent, by how they ended: won, lost, cancelled.")
        for (upstream, values) in c.hedges.sorted(by: { $0.key < $1.key }) {
            for (index, result) in HedgeResult.allCases.enumerated() where values[index] > 0 {
                out.sample("backstop_hedges_total", ["upstream": upstream, "result": result.rawValue], values[index])
            }
        }
        out.family(
            "backstop_network_changes_total", .counter, "Links up, addresses and routes added, seen through rtnetlink."
        )
        out.sample("backstop_network_changes_total", networkChanges.load(ordering: .relaxed))
        return out.text
    }
}
