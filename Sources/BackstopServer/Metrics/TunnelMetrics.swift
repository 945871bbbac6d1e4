import BackstopCore
import NIOConcurrencyHelpers
import Synchronization

/// Counters for `CONNECT`: blind tunnels open now, opened by result, bytes each way, and intercepted connections
/// by result (docs/reference/operations.md#metrics). Atomics: a tunnel counts its bytes as they pass.
public final class TunnelMetrics: Sendable {
    /// How a `CONNECT` ended up, for `backstop_tunnels_total{result}`.
    enum Result: String, CaseIterable {
        case established, denied, unreachable
        case badRequest = "bad-request"
        case loopDetected = "loop-detected"
    }

    /// How an intercepted connection's TLS handshake went, for `backstop_intercepted_connections_total{result}`.
    enum InterceptResult: String, CaseIterable {
        case established
        /// The client sent something that is not a TLS handshake, or gave up.
        case handshakeFailed = "handshake-failed"
        /// The ClientHello named another host than the `CONNECT`.
        case sniMismatch = "sni-mismatch"
    }

    private let open = Atomic<Int>(0)
    /// Per `CONNECT`, not per byte: a lock is cheap enough.
    private let results = NIOLockedValueBox([Int](repeating: 0, count: Result.allCases.count))
    private let intercepts = NIOLockedValueBox([Int](repeating: 0, count: InterceptResult.allCases.count))
    private let bytesUp = Atomic<Int>(0)
    private let bytesDown = Atomic<Int>(0)

    public init() {}

    func record(_ result: Result) {
        let index = Result.allCases.firstIndex(of: result)!
        results.withLockedValue { $0[index] += 1 }
        if result == .established { open.add(1, ordering: .relaxed) }
    }

    func record(_ result: InterceptResult) {
        let index = InterceptResult.allCases.firstIndex(of: result)!
        intercepts.withLockedValue { $0[index] += 1 }
    }

    func tunnelClosed() { open.subtract(1, ordering: .relaxed) }

    /// Bytes copied from the client to the upstream (`up`) or back (`down`).
    func carried(up: Int) { bytesUp.add(up, ordering: .relaxed) }
    func carried(down: Int) { bytesDown.add(down, ordering: .relaxed) }

    public var openTunnels: Int { open.load(ordering: .relaxed) }

    func render() -> String {
        var out = PrometheusText()
        out.family("backstop_tunnels_open", .gauge, "Blind CONNECT tunnels open now.")
        out.sample("backstop_tunnels_open", open.load(ordering: .relaxed))
        out.family("backstop_tunnels_total", .counter, "Blind CONNECT tunnels asked for, by result.")
        let resultCounts = results.withLockedValue { $0 }
        for (index, result) in Result.allCases.enumerated() {
            out.sample("backstop_tunnels_total", ["result": result.rawValue], resultCounts[index])
        }
        out.family(
            "backstop_tunnel_bytes_total", .counter, "Bytes carried by blind tunnels: up (client to upstream), down.")
        out.sample("backstop_tunnel_bytes_total", ["direction": "up"], bytesUp.load(ordering: .relaxed))
        out.sample("backstop_tunnel_bytes_total", ["direction": "down"], bytesDown.load(ordering: .relaxed))
        out.family(
            "backstop_intercepted_connections_total", .counter,
            "Intercepted CONNECTs, by how the client's TLS handshake ended.")
        let interceptCounts = intercepts.withLockedValue { $0 }
        for (index, result) in InterceptResult.allCases.enumerated() {
            out.sample("backstop_intercepted_connections_total", ["result": result.rawValue], interceptCounts[index])
        }
        return out.text
    }
}
