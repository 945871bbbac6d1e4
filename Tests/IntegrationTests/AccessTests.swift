import BackstopTestSupport
import Foundation
import Testing

/// Who may use Backstop and where its requests may go: never an open relay, never a token leaving for another host.
@Suite("Access")
struct AccessTests {
    private let binary = DaemonProcess.binaryPath()

    /// `curl` from inside `namespace` to the proxy; returns the HTTP status (0 when the connection was refused or
    /// closed before a response).
    private func curlStatus(from namespace: NetworkNamespace, port: Int) async throws -> Int {
        let result = try await namespace.run(
            "/usr/bin/curl",
            [
                "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "5", "-H", "Host: app.test",
                "http://\(namespace.hostAddress):\(port)/",
            ])
        return Int(result.standardOutput.trimmingCharacters(in: .whitespacesAndNewlines)) ?? -1
    }

    @Test(
        "a remote listener serves exactly its allow_clients (default: loopback only) and closes the rest at accept",
        .enabled(if: NetworkNamespace.isAvailable, "needs CAP_NET_ADMIN to create a network namespace")
    )
    func allowClients() async throws {
        let namespace = try NetworkNamespace(index: 1)
        defer { namespace.remove() }
        let origin = try await TestOrigin.start { _ in .text(200, "ok") }
        let cases = [
            ("[]", 0, true), ("[10.231.1.0/30]", 200, false), ("[10.9.0.0/16, \"fd00::/8\"]", 0, false),
            ("[10.231.1.0/30, 127.0.0.0/8]", 200, true),
        ]
        for (allow, expected, loopbackServed) in cases {
            let proxy = try await ProxyHarness.start(
                """
                listen:
                  - {address: "0.0.0.0:0", allow_remote: true, allow_clients: \(allow)}
                \(singleUpstreamConfig(origin))
                """)
            let status = try await curlStatus(from: namespace, port: proxy.port)
            #expect(status == expected, "allow_clients \(allow): got \(status)")
            // A given list is the whole list: loopback is served only by default or when listed.
            if loopbackServed {
                let local = try await proxy.get("/", host: "app.test")
                #expect(local.status == 200)
            } else {
                await #expect(throws: (any Error).self, "allow_clients \(allow): a loopback client") {
                    _ = try await proxy.get("/", host: "app.test")
                }
            }
            await proxy.stop()
        }
        // The two allowed namespace clients and the two served loopback requests reached the origin.
        #expect(origin.requestCount == 4)
        try await origin.shutdown()
    }

    @Test("non-loopback listeners and admin listeners need allow_remote: true")
    func remoteNeedsAllowRemote() async throws {
        let directory = try TestFiles.makeTemporaryDirectory()
        defer { TestFiles.remove(directory) }
        let cases: [(String, Int32)] = [
            ("version: 1\nlisten: [0.0.0.0:8080]\n", 1),
            ("version: 1\nlisten: [\"[::]:8080\"]\n", 1),
            ("version: 1\nlisten:\n  - {address: 0.0.0.0:8080, allow_remote: true}\n", 0),
            ("version: 1\nlisten: [127.0.0.1:8080]\nadmin: {listen: 0.0.0.0:9901}\n", 1),
            ("version: 1\nlisten: [127.0.0.1:8080]\nadmin: {listen: 127.0.0.1:9901}\n", 0),
            ("version: 1\nlisten: [127.0.0.1:8080]\nadmin: {listen: 0.0.0.0:9901, allow_remote: true}\n", 0),
        ]
        for (index, (yaml, expected)) in cases.enumerated() {
            let path = directory + "/c\(index).yaml"
            try yaml.write(toFile: path, atomically: true, encoding: .utf8)
            let result = try await TestProcess.run(binary, ["check", "--config", path])
            #expect(result.status == expected, "\(yaml): \(result.standardOutput)")
            if expected == 1 { #expect(result.standardOutput.contains("allow_remote")) }
        }
    }

    @Test("unmatched: reject is the default: an unknown host gets 403 and nothing is contacted (no open relay)")
    func notAnOpenRelay() async throws {
        let bystander = try await TestOrigin.start { _ in .text(200, "relayed") }
        let origin = try await TestOrigin.start { _ in .text(200, "ok") }
        let proxy = try await ProxyHarness.start(singleUpstreamConfig(origin))
        // Absolute form to a live host no upstream names, origin form with its Host, and with a path.
        let absolute = try await proxy.get(
            "http://127.0.0.1:\(bystander.port)/steal", host: "127.0.0.1:\(bystander.port)")
        let originForm = try await proxy.get("/steal", host: "127.0.0.1:\(bystander.port)")
        for response in [absolute, originForm] {
            #expect(response.status == 403)
            #expect(response.header("X-Backstop-Error") == "no-route")
        }
        #expect(bystander.requestCount == 0)
        #expect(origin.requestCount == 0)
        await proxy.stop()
        try await origin.shutdown()
        try await bystander.shutdown()
    }

    @Test("redirects are returned, not followed: the injected token never reaches another host")
    func redirectsNotFollowed() async throws {
        let (keychain, directory) = try TokenRefreshTests.makeKeychain(["api/token": "secret-token-value"])
        defer { TestFiles.remove(directory) }
        let elsewhere = try await TestOrigin.start { _ in .text(200, "got it") }
        let origin = try await TestOrigin.start { _ in
            .respond(status: 302, headers: [("Location", "\(elsewhere.baseURL)/collect")], body: [])
        }
        let proxy = try await ProxyHarness.start(
            staticAuthConfig(directory: directory, url: origin.baseURL), keychain: keychain)
        let response = try await proxy.get("http://api.test/start", host: "api.test")
        #expect(response.status == 302)
        #expect(response.header("Location") == "\(elsewhere.baseURL)/collect")
        #expect(origin.requests.first?.header("Authorization") == "Bearer secret-token-value")
        #expect(elsewhere.requestCount == 0)
        await proxy.stop()
        try await origin.shutdown()
        try await elsewhere.shutdown()
    }
}
