import BackstopKeychain
import BackstopTestSupport
import Foundation
import Testing

/// Token refresh across real daemon processes sharing one keychain file.
@Suite("Token refresh across processes", .serialized)
struct TokenProcessTests {
    private let binary = DaemonProcess.binaryPath()

    private func writeConfig(
        directory: String, name: String, port: Int, origin: TestOrigin, auth: TestAuthServer,
        level: String = "info", refreshAhead: String = "60s"
    ) throws -> String {
        let path = directory + "/\(name).yaml"
        try """
        version: 1
        listen: [127.0.0.1:\(port)]
        log: {level: \(level)}
        \(keychainSection(directory: directory))
        \(OAuth2TestConfig.upstreams(
            originURL: origin.baseURL, tokenURL: auth.tokenURL, authLines: ["refresh_ahead: \(refreshAhead)"]))
        """.write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    private func get(_ port: Int, _ path: String = "/x") async throws -> RawHTTPResponse {
        try await RawHTTP.exchange(
            port: port, request: RawHTTP.request("GET", "http://api.test\(path)", host: "api.test"),
            timeout: .seconds(20))
    }

    @Test(
        "two daemons sharing a keychain refresh a revoked token exactly once; rotation persisted; restart reuses the token"
    )
    func twoDaemons() async throws {
        let directory = try TestFiles.makeTemporaryDirectory()
        defer { TestFiles.remove(directory) }
        let auth = try await TestAuthServer.start()
        let origin = try await TestOrigin.start(script: auth.protectedScript())
        let opened = try KeychainBootstrap.open(
            path: directory + "/keychain.bkc", key: .file(path: directory + "/keychain.key"))
        try opened.keychain.set("api/refresh_token", value: Array("refresh-0".utf8))

        let portA = try FreePort.reserveClosedPort()
        let portB = try FreePort.reserveClosedPort()
        let configA = try writeConfig(directory: directory, name: "a", port: portA, origin: origin, auth: auth)
        let configB = try writeConfig(directory: directory, name: "b", port: portB, origin: origin, auth: auth)
        let a = try DaemonProcess.start(binary: binary, arguments: ["run", "--config", configA])
        let b = try DaemonProcess.start(binary: binary, arguments: ["run", "--config", configB])
        try await a.waitUntilListening(port: portA)
        try await b.waitUntilListening(port: portB)

        #expect(try await get(portA).status == 200)
        #expect(try await get(portB).status == 200)
        #expect(auth.tokenCalls == 1, "the second daemon adopts the stored token")

        auth.revokeAllAccessTokens()
        async let fromA = get(portA, "/a")
        async let fromB = get(portB, "/b")
        let (ra, rb) = try await (fromA, fromB)
        #expect(ra.status == 200)
        #expect(rb.status == 200)
        #expect(auth.tokenCalls == 2, "one refresh between the two daemons")
        #expect(auth.rejectedRefreshTokens == 0)

        await a.stop()
        await b.stop()
        let stored = try await TestProcess.run(binary, ["keychain", "get", "api/refresh_token", "--config", configA])
        #expect(stored.status == 0)
        #expect(stored.standardOutput.trimmingCharacters(in: .whitespacesAndNewlines) == auth.currentRefreshToken)

        // Restart with a valid stored token: no token call.
        let c = try DaemonProcess.start(binary: binary, arguments: ["run", "--config", configA])
        try await c.waitUntilListening(port: portA)
        #expect(try await get(portA).status == 200)
        #expect(auth.tokenCalls == 2)
        await c.stop()
        try await origin.shutdown()
        try await auth.origin.shutdown()
    }

    @Test("a trace-level log of the whole flow contains no secret; proactive refresh happens before any 401")
    func noSecretsInLogsAndProactiveRefresh() async throws {
        let directory = try TestFiles.makeTemporaryDirectory()
        defer { TestFiles.remove(directory) }
        let auth = try await TestAuthServer.start(initialRefreshToken: "refresh-secret-0")
        auth.update { $0.expiresIn = 3 }
        let origin = try await TestOrigin.start(script: auth.protectedScript())
        let opened = try KeychainBootstrap.open(
            path: directory + "/keychain.bkc", key: .file(path: directory + "/keychain.key"))
        try opened.keychain.set("api/refresh_token", value: Array("refresh-secret-0".utf8))
        let port = try FreePort.reserveClosedPort()
        let config = try writeConfig(
            directory: directory, name: "t", port: port, origin: origin, auth: auth,
            level: "trace", refreshAhead: "2s")
        let daemon = try DaemonProcess.start(binary: binary, arguments: ["run", "--config", config])
        try await daemon.waitUntilListening(port: port)
        // Tokens live 3 s and are refreshed 2 s ahead: requests every 300 ms for 4 s never see a 401.
        var statuses: [Int] = []
        let deadline = ContinuousClock.now + .seconds(4)
        while ContinuousClock.now < deadline {
            statuses.append(try await get(port).status)
            try await Task.sleep(for: .milliseconds(300))
        }
        #expect(statuses.allSatisfy { $0 == 200 }, "statuses: \(statuses)")
        #expect(auth.tokenCalls >= 2, "proactive refreshes happened")
        let log = daemon.output
        await daemon.stop()
        #expect(log.contains("level=trace") || log.contains("level=debug") || log.contains("level=info"))
        let key = try String(contentsOfFile: directory + "/keychain.key", encoding: .utf8)
            .trimmingCharacters(in: .whitespacesAndNewlines)
        var secrets = [key, "refresh-secret-0", auth.currentRefreshToken]
        for i in 1...auth.tokenCalls { secrets.append("access-\(i)") }
        for secret in secrets { #expect(!log.contains(secret), "log leaks a secret") }
        try await origin.shutdown()
        try await auth.origin.shutdown()
    }
}
