import BackstopTestSupport
import Foundation
import Testing

/// The two `tunnel-denied` refusals say which rule refused (docs/reference/errors.md): no `tunnels.allow` pattern,
/// or every resolved address in `tunnels.deny_addresses`.
@Suite("Tunnel refusal bodies")
struct TunnelRefusalBodyTests {
    @Test("not in tunnels.allow, and every address denied, give different bodies naming the setting")
    func bodies() async throws {
        let origin = try await TestOrigin.start { _ in .text(200, "never") }
        let proxy = try await ProxyHarness.start(
            """
            tunnels:
              allow: ["localhost:\(origin.port)"]
            """)
        func body(_ target: String) async throws -> String {
            let bytes = Array("CONNECT \(target) HTTP/1.1\r\nHost: \(target)\r\n\r\n".utf8)
            let port = proxy.port
            let received = try await BlockingSocket.onThread {
                let socket = try BlockingSocket(port: port)
                _ = socket.send(bytes)
                return socket.readUntilClosed(timeout: .seconds(5))
            }()
            let text = String(decoding: received, as: UTF8.self)
            #expect(text.hasPrefix("HTTP/1.1 403 "), "\(text)")
            #expect(text.contains("X-Backstop-Error: tunnel-denied\r\n"), "\(text)")
            return String(text[(text.range(of: "\r\n\r\n")?.upperBound ?? text.endIndex)...])
        }
        #expect(
            try await body("other.test:443")
                == "CONNECT to this host and port is not allowed: no tunnels.allow pattern matches it\n")
        #expect(
            try await body("localhost:\(origin.port)")
                == "CONNECT to this host is not allowed: every address it resolves to is in tunnels.deny_addresses\n")
        #expect(origin.connectionCount == 0)
        await proxy.stop()
        try await origin.shutdown()
    }
}
