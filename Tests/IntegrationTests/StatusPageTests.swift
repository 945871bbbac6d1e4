import BackstopKeychain
import BackstopTestSupport
import Foundation
import Testing

/// `/status` and `/status.json` served by the real daemon after scripted traffic (docs/reference/operations.md#status-page):
/// the same facts in both, every upstream and failure present, and no credential anywhere.
@Suite("Status page", .serialized)
struct StatusPageTests {
    @Test("both pages show every upstream, endpoint, token state and failure, and never a secret")
    func statusFromDaemon() async throws {
        let directory = try TestFiles.makeTemporaryDirectory()
        defer { TestFiles.remove(directory) }
        let staticSecret = "sTaTiC-secret-\(UUID().uuidString)"
        let auth = try await TestAuthServer.start(initialRefreshToken: "refresh-\(UUID().uuidString)")
        let protected = try await TestOrigin.start(script: auth.protectedScript())
        let plain = try await TestOrigin.start { _ in .text(200, "ok") }
        let failing = try await TestOrigin.start { _ in .respond(status: 503) }
        let deadPort = try FreePort.reserveClosedPort()
        let opened = try KeychainBootstrap.open(
            path: directory + "/keychain.bkc", key: .file(path: directory + "/keychain.key"))
        try opened.keychain.set("static/token", value: Array(staticSecret.utf8))
        try opened.keychain.set("api/refresh_token", value: Array(auth.currentRefreshToken.utf8))

        let port = try FreePort.reserveClosedPort()
        let adminPort = try FreePort.reserveClosedPort()
        let path = directory + "/backstop.yaml"
        try """
        version: 1
        listen: [127.0.0.1:\(port)]
        admin: {listen: 127.0.0.1:\(adminPort)}
        \(keychainSection(directory: directory))
        upstreams:
          - name: api
            match: {hosts: [api.test]}
            url: \(protected.baseURL)
            auth: {type: oauth2, token_url: \(auth.tokenURL), keychain_prefix: api}
          - name: keyed
            match: {hosts: [keyed.test]}
            url: \(plain.baseURL)
            auth: {type: static, entry: static/token, header: X-Api-Key, scheme: ""}
          - name: flaky
            match: {hosts: [flaky.test]}
            url: \(failing.baseURL)
            retry: {attempts: 2, backoff: {strategy: constant, base: 10ms, max: 10ms, jitter: none}}
          - name: gone
            match: {hosts: [gone.test]}
            url: http://127.0.0.1:\(deadPort)
            retry: {attempts: 1}
        """.write(toFile: path, atomically: true, encoding: .utf8)
        let daemon = try DaemonProcess.start(binary: DaemonProcess.binaryPath(), arguments: ["run", "--config", path])
        var failure: (any Error)?
        do {
            try await daemon.waitUntilListening(port: port)
            for host in ["api.test", "keyed.test", "flaky.test", "gone.test"] {
                _ = try await RawHTTP.exchange(
                    port: port, request: RawHTTP.request("GET", "http://\(host)/x?key=q", host: host),
                    timeout: .seconds(10))
            }
            // An exchange records its end once its response is written: wait for both failures to be in.
            var json = try await RawHTTP.exchange(
                port: adminPort, request: RawHTTP.request("GET", "/status.json", host: "admin"), timeout: .seconds(5))
            let deadline = ContinuousClock.now + .seconds(5)
            while json.bodyString.components(separatedBy: "\"cause\"").count - 1 < 2, ContinuousClock.now < deadline {
                try await Task.sleep(for: .milliseconds(20))
                json = try await RawHTTP.exchange(
                    port: adminPort, request: RawHTTP.request("GET", "/status.json", host: "admin"),
                    timeout: .seconds(5))
            }
            let page = try await RawHTTP.exchange(
                port: adminPort, request: RawHTTP.request("GET", "/status", host: "admin"), timeout: .seconds(5))
            #expect(page.status == 200)
            #expect(page.header("Content-Type") == "text/html; charset=utf-8")
            #expect(page.header("Content-Security-Policy")?.hasPrefix("default-src 'none'; style-src 'sha256-") == true)
            #expect(page.header("X-Content-Type-Options") == "nosniff")
            let posted = try await RawHTTP.exchange(
                port: adminPort, request: RawHTTP.request("POST", "/status", host: "admin"), timeout: .seconds(5))
            #expect(posted.status == 405)
            #expect(posted.header("Allow") == "GET, HEAD")
            #expect(json.status == 200)
            #expect(json.header("Content-Type") == "application/json")
            let html = page.bodyString
            for name in ["api", "keyed", "flaky", "gone"] {
                #expect(html.contains("<tr data-upstream=\"\(name)\"><th scope=\"row\">\(name)</th>"), "\(name)")
                #expect(html.contains("<tr data-upstream=\"\(name)\" data-endpoint-state=\"healthy\">"), "\(name)")
            }
            #expect(html.contains("<td>\(failing.baseURL)</td><td class=\"n\">503</td><td>upstream answered 503</td>"))
            #expect(
                html.contains("<td>http://127.0.0.1:\(deadPort)</td><td class=\"n\">502</td><td>upstream-unreachable"))
            #expect(html.contains("<th scope=\"row\">api</th><td>oauth2</td><td class=\"ok\">yes</td>"))
            #expect(html.contains("<span class=\"ok\">success</span>"))
            #expect(html.contains("<th scope=\"row\">keyed</th><td>static</td><td class=\"ok\">yes</td>"))

            let object = try #require(
                try JSONSerialization.jsonObject(with: Data(json.bodyString.utf8)) as? [String: Any])
            let upstreams = try #require(object["upstreams"] as? [[String: Any]])
            #expect(upstreams.map { $0["name"] as? String } == ["api", "keyed", "flaky", "gone"])
            let flaky = try #require(upstreams.first { $0["name"] as? String == "flaky" })
            #expect(flaky["success_ratio"] as? Double == 0)
            #expect(flaky["attempts_per_request"] as? Double == 2)
            let failures = try #require(object["failures"] as? [[String: Any]])
            #expect(failures.map { $0["upstream"] as? String } == ["gone", "flaky"])
            #expect(failures.allSatisfy { !($0["endpoint"] as? String ?? "?").contains("?") })

            for secret in auth.issuedSecrets + [staticSecret] {
                #expect(!html.contains(secret), "a secret on the status page")
                #expect(!json.bodyString.contains(secret), "a secret in status.json")
            }
        } catch {
            failure = error
        }
        await daemon.stop()
        try? await protected.shutdown()
        try? await plain.shutdown()
        try? await failing.shutdown()
        try? await auth.origin.shutdown()
        if let failure { throw failure }
    }
}
