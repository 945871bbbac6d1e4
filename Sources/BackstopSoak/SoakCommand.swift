import ArgumentParser
import BackstopKeychain
import BackstopTestSupport
import Foundation

/// `backstop-soak`: a chaos soak of the real daemon. Starts a chaos origin and a rotating OAuth2 token endpoint on
/// 127.0.0.1, runs `backstop run` against them as a child process, drives it with concurrent clients for a fixed
/// time, and checks that nothing was lost, duplicated, stampeded, leaked or left behind (see `SoakReport`).
@main
struct SoakCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "backstop-soak",
        abstract:
            "Chaos soak: faulty origin, rotating token endpoint, concurrent clients; prints and checks the outcome.")

    @Option(help: "The backstop binary to run.")
    var binary = ".build/debug/backstop"

    @Option(help: "How long to drive load, in seconds.")
    var duration = 300

    @Option(help: "Concurrent clients.")
    var concurrency = 64

    @Option(help: "Seed of every random choice (origin faults, request mix, token endpoint failures).")
    var seed: UInt64 = 1

    @Flag(help: "The origin speaks TLS (a CA made for the run; Backstop verifies it), the path most users run.")
    var tls = false

    @Flag(help: "Exit 1 when a check fails.")
    var assert = false

    @Flag(help: "Print the report as JSON.")
    var json = false

    /// The upstream's timeouts in the daemon config; a response head later than `total + 1 s` counts as hung.
    static let perTry = 1
    static let total = 4
    /// Access tokens live this long and are refreshed this long before they expire.
    static let tokenLifetime = 4
    static let refreshAhead = 1
    /// The soak revokes every access token this often (forcing a refresh on the next 401).
    static let revocationInterval: Duration = .seconds(7)

    func run() async throws {
        let directory = try TestFiles.makeTemporaryDirectory(prefix: "backstop-soak")
        defer { TestFiles.remove(directory) }
        let salt = String(UInt64.random(in: 1..<UInt64.max), radix: 36)

        let auth = try await TestAuthServer.start(initialRefreshToken: "refresh-\(salt)-initial")
        auth.update {
            $0.expiresIn = Self.tokenLifetime
            $0.enforcedLifetime = .seconds(Self.tokenLifetime)
            $0.failureRate = 0.1
            $0.seed = seed
            $0.tokenSalt = salt
            // The first token call fails for sure (the daemon must retry it), on top of the random 10%.
            $0.failNext = 1
        }
        let certificates = tls ? try TestCertificates.generate(in: directory) : nil
        let chaos = try await ChaosOrigin.start(seed: seed, auth: auth, tls: certificates?.serverIdentity)
        let clientSecret = "client-secret-\(salt)"
        let opened = try KeychainBootstrap.open(
            path: directory + "/keychain.bkc", key: .file(path: directory + "/keychain.key"))
        try opened.keychain.set("soak/refresh_token", value: Array("refresh-\(salt)-initial".utf8))
        try opened.keychain.set("soak/client_secret", value: Array(clientSecret.utf8))

        let port = try FreePort.reserveClosedPort()
        let adminPort = try FreePort.reserveClosedPort()
        let configPath = directory + "/soak.yaml"
        try config(
            port: port, adminPort: adminPort, directory: directory, origin: chaos.origin, auth: auth,
            caFile: certificates?.caCertPath
        )
        .write(toFile: configPath, atomically: true, encoding: .utf8)

        let daemon = try DaemonProcess.start(binary: binary, arguments: ["run", "--config", configPath])
        try await daemon.waitUntilListening(port: port)
        let probe = ProcessProbe(pid: daemon.pid, upstreamPorts: [chaos.origin.port, auth.origin.port])
        let started = ContinuousClock.now

        // A warm-up run (connections, the first token, allocator and connection caches), then the idle baseline;
        // the main run, then the idle end. Idle is compared with idle: a leak cannot hide under the load's own
        // sockets and buffers.
        let load = LoadGenerator(port: port, host: "127.0.0.1", headTimeout: .seconds(Self.total + 1))
        let loadDuration = Duration.seconds(duration)
        let warmUp = min(Duration.seconds(10), loadDuration / 5)
        var nextRevocation = started + Self.revocationInterval
        try await drive(load, for: warmUp, phase: 0, auth: auth, nextRevocation: &nextRevocation)
        let baseline = await settleIdle(probe: probe, within: .seconds(15))
        try await drive(load, for: loadDuration - warmUp, phase: 1, auth: auth, nextRevocation: &nextRevocation)
        let elapsed = ContinuousClock.now - started
        let settled = await settleIdle(
            probe: probe, within: .seconds(15), until: { SoakReport.withinMargins(baseline: baseline, end: $0) })
        let alive = daemon.isRunning
        // SIGTERM drains; the exit status and the whole log (shutdown included) go into the report.
        daemon.send(signal: SIGTERM)
        let exitStatus = try? await daemon.waitForExit(timeout: .seconds(30))
        // The log is read once from its file, in chunks (never held whole), before `stop()` removes it.
        let scan = SecretScanner(secrets: Set(auth.issuedSecrets + [clientSecret]), salt: Array(salt.utf8))
            .scan(path: daemon.logPath)
        await daemon.stop()

        let report = SoakReport(
            duration: elapsed, concurrency: concurrency, seed: seed, load: load.result, chaos: chaos.tally,
            grants: auth.grantTimes, failedTokenCalls: auth.failedCalls, revocations: auth.revocationTimes,
            rejectedRefreshTokens: auth.rejectedRefreshTokens, baseline: baseline, end: settled,
            alive: alive, exitStatus: exitStatus,
            secretsLogged: scan.found.count, secretsChecked: auth.issuedSecrets.count + 1, logLines: scan.lines)
        print(json ? report.json() : report.table())
        try? await chaos.origin.shutdown()
        try? await auth.origin.shutdown()
        if assert && !report.passed { throw ExitCode(1) }
    }

    /// Runs the clients for `duration` while revoking every access token each `revocationInterval`.
    private func drive(
        _ load: LoadGenerator, for duration: Duration, phase: Int, auth: TestAuthServer,
        nextRevocation: inout ContinuousClock.Instant
    ) async throws {
        // The revoker waits for each scheduled revocation itself (no polling) and hands its schedule back when
        // the clients are done, so the next phase keeps the same 7-s rhythm.
        let revoker = Task { [first = nextRevocation] () -> ContinuousClock.Instant in
            var next = first
            while true {
                do { try await Task.sleep(until: next, clock: .continuous) } catch { return next }
                auth.revokeAllAccessTokens()
                next = .now + Self.revocationInterval
            }
        }
        await load.run(concurrency: concurrency, duration: duration, seed: seed, phase: phase)
        revoker.cancel()
        nextRevocation = await revoker.value
    }

    /// Once the clients are done: samples every 250 ms until the descriptor count holds still for a second (closed
    /// connections and cancelled transfers are gone) and `until` accepts the sample, or `within` passes.
    private func settleIdle(
        probe: ProcessProbe, within: Duration, until accept: (ProcessProbe.Sample) -> Bool = { _ in true }
    ) async -> ProcessProbe.Sample {
        let deadline = ContinuousClock.now + within
        var sample = probe.sample()
        var steady = 0
        while ContinuousClock.now < deadline, steady < 4 || !accept(sample) {
            try? await Task.sleep(for: .milliseconds(250))
            let next = probe.sample()
            steady = next.fds == sample.fds ? steady + 1 : 0
            sample = next
        }
        return sample
    }

    private func config(
        port: Int, adminPort: Int, directory: String, origin: TestOrigin, auth: TestAuthServer, caFile: String?
    ) -> String {
        """
        version: 1
        listen: [127.0.0.1:\(port)]
        admin: {listen: 127.0.0.1:\(adminPort)}
        log: {level: debug, format: logfmt, access_log: true}
        keychain: {path: \(directory)/keychain.bkc, key_file: \(directory)/keychain.key}
        limits: {max_request_body: 4MiB, retry_buffer: 64KiB, client_idle_timeout: 10s}
        upstreams:
          - name: chaos
            match: {hosts: [chaos.test]}
            url: \(origin.baseURL)
            \(caFile.map { "tls: {ca_file: \($0)}" } ?? "")
            timeouts: {connect: 1s, per_try: \(Self.perTry)s, total: \(Self.total)s}
            retry:
              attempts: 3
              on: [connect-failure, reset, timeout, 429, 502, 503, 504]
              backoff: {base: 20ms, max: 200ms}
              retry_after: {max: 2s}
            # The soak's subject is retries, budgets and tokens under an origin that fails half its attempts on
            # purpose: with the default circuit (5 failed attempts in a row eject the endpoint) most requests would
            # be answered circuit-open without reaching it. Ejection has its own tests (OutageTests).
            circuit: {failures: 0}
            auth:
              type: oauth2
              token_url: \(auth.tokenURL)
              client_id: soak
              client_secret_entry: soak/client_secret
              keychain_prefix: soak
              refresh_ahead: \(Self.refreshAhead)s
        """
    }
}
