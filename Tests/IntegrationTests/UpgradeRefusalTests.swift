import BackstopTestSupport
import Testing

/// `upgrades: false` (docs/reference/config.md#upgrades): a request with `Upgrade` is refused before anything is sent.
@Suite("Upgrades refused", .serialized)
struct UpgradeRefusalTests {
    @Test(
        "upgrades: false answers a WebSocket handshake 400 upgrade-not-allowed and sends nothing; a plain request and another upstream's handshake go on"
    )
    func refusedBeforeAnythingIsSent() async throws {
        try await withOriginAndProxy(
            origin: { _ in .text(200, "ok") },
            config: { origin in
                """
                upstreams:
                  - {name: reports, match: {hosts: [reports.test]}, url: \(origin.baseURL), upgrades: false}
                  - {name: live, match: {hosts: [live.test]}, url: \(origin.baseURL)}
                """
            }
        ) { origin, proxy in
            let handshake = [
                ("Upgrade", "websocket"), ("Connection", "Upgrade"), ("Sec-WebSocket-Version", "13"),
                ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
            ]
            let refused = try await proxy.get("http://reports.test/ws", host: "reports.test", headers: handshake)
            #expect(refused.status == 400)
            #expect(refused.header("X-Backstop-Error") == "upgrade-not-allowed")
            let plain = try await proxy.get("http://reports.test/plain", host: "reports.test")
            #expect(plain.status == 200)
            let other = try await proxy.get("http://live.test/ws", host: "live.test", headers: handshake)
            #expect(other.header("X-Backstop-Error") != "upgrade-not-allowed")
            #expect(origin.requests.map(\.uri) == ["/plain", "/ws"])
            // Refused after routing: counted as the upstream's answer.
            #expect(
                proxy.server.metricsText().contains("backstop_requests_total{upstream=\"reports\",code=\"400\"} 1\n"))
        }
    }
}
