import BackstopCore
import BackstopKeychain
import BackstopServer
import BackstopTestSupport
import Foundation
import Logging
import NIOConcurrencyHelpers

/// A Backstop proxy running in the test process on an ephemeral loopback port.
struct ProxyHarness {
    let server: ProxyServer
    let port: Int
    /// `server.run()` (the token managers' watchers, the span exporter), as `backstop run` runs it; ends after `stop`.
    let background: Task<Void, Never>

    /// Starts a proxy from YAML (listener `127.0.0.1:0` is added unless the YAML has a `listen:` section).
    static func start(
        _ yaml: String, directory: String = NSTemporaryDirectory(), keychain: FileKeychain? = nil,
        capture: LogCapture? = nil
    ) async throws -> ProxyHarness {
        let config = try parse(yaml, directory: directory)
        // BACKSTOP_TEST_LOG=debug (or another level) shows the proxy's log lines on stderr while debugging a test.
        let level = ProcessInfo.processInfo.environment["BACKSTOP_TEST_LOG"].flatMap(LogLevel.init(rawValue:))
        let logger = Logger(label: "backstop-test") { label in
            if let capture { return capture.handler(format: config.log.format) }
            guard let level else { return SwiftLogNoOpLogHandler() }
            return LineLogHandler(label: label, settings: LogSettings(level: level.loggerLevel, format: .logfmt))
        }
        let intercept = try InterceptAuthority.load(config: config, keychain: keychain)
        let server = ProxyServer(config: config, logger: logger, keychain: keychain, intercept: intercept)
        try await server.start()
        let background = Task { await server.run() }
        guard let port = server.boundAddresses.first?.port else {
            await server.drainAndStop(timeout: .zero)
            throw HarnessError.noPort
        }
        return ProxyHarness(server: server, port: port, background: background)
    }

    /// The config `start` would serve for `yaml` (the same listener added).
    static func parse(_ yaml: String, directory: String = NSTemporaryDirectory()) throws -> Config {
        var text = yaml
        if !text.hasPrefix("listen:") && !text.contains("\nlisten:") { text = "listen: [\"127.0.0.1:0\"]\n" + text }
        if !text.contains("version:") { text = "version: 1\n" + text }
        return try ConfigLoader.parse(yaml: text, file: "test.yaml", baseDirectory: directory)
    }

    /// Reloads the proxy with `yaml`, as SIGHUP does once the new config is accepted (the listener stays bound).
    func reload(_ yaml: String, keychain: FileKeychain? = nil) async throws {
        let config = try Self.parse(yaml)
        await server.reload(config: config, intercept: try InterceptAuthority.load(config: config, keychain: keychain))
    }

    func stop() async {
        await server.drainAndStop(timeout: .seconds(2))
        await background.value
    }

    /// One request through the proxy on a fresh connection.
    func send(_ request: [UInt8], timeout: Duration = .seconds(15)) async throws -> RawHTTPResponse {
        try await RawHTTP.exchange(port: port, request: request, timeout: timeout)
    }

    func get(
        _ target: String, host: String = "localhost", headers: [(String, String)] = []
    ) async throws
        -> RawHTTPResponse
    {
        try await send(RawHTTP.request("GET", target, host: host, headers: headers))
    }
}

enum HarnessError: Error { case noPort }

/// Collects the proxy's log lines, rendered exactly as the daemon writes them, for tests that read logs.
final class LogCapture: Sendable {
    private let lines = NIOLockedValueBox<[String]>([])

    var all: [String] { lines.withLockedValue { $0 } }

    /// Lines whose message is `msg` (logfmt `msg=…` or JSON `"msg":"…"`).
    func messages(_ msg: String) -> [String] {
        all.filter { $0.contains("msg=\(msg) ") || $0.contains("msg=\"\(msg)\"") || $0.contains("\"msg\":\"\(msg)\"") }
    }

    /// Waits until `count` lines with message `msg` were logged (access lines come after the response is sent).
    func waitFor(_ msg: String, count: Int, timeout: Duration = .seconds(5)) async throws -> [String] {
        let deadline = ContinuousClock.now + timeout
        while messages(msg).count < count && ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(10))
        }
        return messages(msg)
    }

    func handler(format: LogFormat) -> some LogHandler {
        CapturingHandler(capture: self, format: format)
    }

    fileprivate func append(_ line: String) { lines.withLockedValue { $0.append(line) } }
}

private struct CapturingHandler: LogHandler {
    let capture: LogCapture
    let format: LogFormat
    var metadata: Logger.Metadata = [:]
    var logLevel: Logger.Level = .trace

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        var merged = metadata
        if let extra = event.metadata { merged.merge(extra) { _, new in new } }
        capture.append(
            LineLogHandler.render(
                time: "T", level: event.level, message: "\(event.message)", metadata: merged, format: format))
    }
}

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
