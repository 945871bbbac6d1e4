import BackstopCore
import BackstopKeychain
import BackstopServer
import BackstopTestSupport
import Foundation
import Logging

/// A Backstop proxy running in the test process on an ephemeral loopback port.
struct ProxyHarness {
    let server: ProxyServer
    let port: Int

    /// Starts a proxy from YAML (listener `127.0.0.1:0` is added unless the YAML has a `listen:` section).
    static func start(_ yaml: String, directory: String = NSTemporaryDirectory(), keychain: FileKeychain? = nil)
        async throws -> ProxyHarness
    {
        var text = yaml
        if !text.hasPrefix("listen:") && !text.contains("\nlisten:") { text = "listen: [\"127.0.0.1:0\"]\n" + text }
        if !text.contains("version:") { text = "version: 1\n" + text }
        let config = try ConfigLoader.parse(yaml: text, file: "test.yaml", baseDirectory: directory)
        // BACKSTOP_TEST_LOG=debug (or another level) shows the proxy's log lines on stderr while debugging a test.
        let level = ProcessInfo.processInfo.environment["BACKSTOP_TEST_LOG"].flatMap(LogLevel.init(rawValue:))
        let logger = Logger(label: "backstop-test") { label in
            guard let level else { return SwiftLogNoOpLogHandler() }
            return LineLogHandler(label: label, settings: LogSettings(level: level.loggerLevel, format: .logfmt))
        }
        let server = ProxyServer(config: config, logger: logger, keychain: keychain)
        try await server.start()
        guard let port = server.boundAddresses.first?.port else { throw HarnessError.noPort }
        return ProxyHarness(server: server, port: port)
    }

    func stop() async { await server.drainAndStop(timeout: .seconds(2)) }

    /// One request through the proxy on a fresh connection.
    func send(_ request: [UInt8], timeout: Duration = .seconds(15)) async throws -> RawHTTPResponse {
        try await RawHTTP.exchange(port: port, request: request, timeout: timeout)
    }

    func get(_ target: String, host: String = "localhost", headers: [(String, String)] = []) async throws
        -> RawHTTPResponse
    {
        try await send(RawHTTP.request("GET", target, host: host, headers: headers))
    }
}

enum HarnessError: Error { case noPort }

/// Runs `body` with a started origin and proxy, shutting both down afterwards whatever happens.
func withOriginAndProxy(
    origin script: @escaping TestOrigin.Script,
    config: (TestOrigin) -> String,
    _ body: (TestOrigin, ProxyHarness) async throws -> Void
) async throws {
    let origin = try await TestOrigin.start(script: script)
    let proxy: ProxyHarness
    do {
        proxy = try await ProxyHarness.start(config(origin))
    } catch {
        try? await origin.shutdown()
        throw error
    }
    do {
        try await body(origin, proxy)
    } catch {
        await proxy.stop()
        try? await origin.shutdown()
        throw error
    }
    await proxy.stop()
    try await origin.shutdown()
}

/// A config with one upstream `app` for host `app.test` (and path prefix `/app`) pointing at `origin`.
func singleUpstreamConfig(_ origin: TestOrigin, basePath: String = "", extra: String = "") -> String {
    """
    upstreams:
      - name: app
        match:
          hosts: [app.test]
        url: \(origin.baseURL)\(basePath)
    \(extra)
    """
}

/// The top-level `keychain:` section for the files `TokenRefreshTests.makeKeychain` puts in `directory`.
func keychainSection(directory: String) -> String {
    """
    keychain:
      path: \(directory)/keychain.bkc
      key_file: \(directory)/keychain.key
    """
}

/// A config with one upstream `api` for host `api.test` at `url`, injecting the keychain entry `entry` under
/// `header` (static auth), with the keychain files in `directory` (as `TokenRefreshTests.makeKeychain` makes them).
func staticAuthConfig(
    directory: String, url: String, entry: String = "api/token", header: String = "Authorization",
    scheme: String = "Bearer"
) -> String {
    """
    \(keychainSection(directory: directory))
    upstreams:
      - name: api
        match: {hosts: [api.test]}
        url: \(url)
        auth: {type: static, entry: \(entry), header: \(header), scheme: "\(scheme)"}
    """
}

/// A config with one upstream `gone` for host `gone.test` at a closed port, tried once.
func unreachableUpstreamConfig(closedPort: Int) -> String {
    """
    upstreams:
      - name: gone
        match: {hosts: [gone.test]}
        url: http://127.0.0.1:\(closedPort)
        retry: {attempts: 1}
    """
}
