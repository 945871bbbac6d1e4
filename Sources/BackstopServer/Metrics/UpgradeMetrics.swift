import BackstopCore
import Synchronization

/// Counters for upgraded requests (WebSocket, docs/reference/operations.md#metrics): handshakes by how they ended,
/// relays open now, and bytes each way through them. Atomics: a relay counts its bytes as they pass.
public final class UpgradeMetrics: Sendable {
    private let switchedCount = Atomic<Int>(0)
    private let notSwitchedCount = Atomic<Int>(0)
    private let failedCount = Atomic<Int>(0)
    private let open = Atomic<Int>(0)
    private let bytesUp = Atomic<Int>(0)
    private let bytesDown = Atomic<Int>(0)

    public init() {}

    /// The upstream answered `101`: a relay opened.
    func switched() {
        switchedCount.add(1, ordering: .relaxed)
        open.add(1, ordering: .relaxed)
    }
    /// The upstream answered something else, relayed as a response.
    func notSwitched() { notSwitchedCount.add(1, ordering: .relaxed) }
    /// Backstop answered with its own error (no attempt got an answer, or the credential was missing).
    func failed() { failedCount.add(1, ordering: .relaxed) }
    func relayClosed() { open.subtract(1, ordering: .relaxed) }
    func carried(up: Int) { bytesUp.add(up, ordering: .relaxed) }
    func carried(down: Int) { bytesDown.add(down, ordering: .relaxed) }

    public var openRelays: Int { open.load(ordering: .relaxed) }

    func render() -> String {
        var out = PrometheusText()
        out.family(
            "backstop_upgrades_total", .counter, "Upgrade requests (WebSocket handshakes), by how the handshake ended.")
        out.sample("backstop_upgrades_total", ["result": "switched"], switchedCount.load(ordering: .relaxed))
        out.sample("backstop_upgrades_total", ["result": "not-switched"], notSwitchedCount.load(ordering: .relaxed))
        out.sample("backstop_upgrades_total", ["result": "failed"], failedCount.load(ordering: .relaxed))
        out.family("backstop_upgrades_open", .gauge, "Upgraded connections being relayed now.")
        out.sample("backstop_upgrades_open", open.load(ordering: .relaxed))
        out.family(
            "backstop_upgrade_bytes_total", .counter,
            "Bytes relayed by upgraded connections: up (client to upstream), down.")
        out.sample("backstop_upgrade_bytes_total", ["direction": "up"], bytesUp.load(ordering: .relaxed))
        out.sample("backstop_upgrade_bytes_total", ["direction": "down"], bytesDown.load(ordering: .relaxed))
        return out.text
    }
}
