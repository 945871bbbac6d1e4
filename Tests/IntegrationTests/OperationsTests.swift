import BackstopTestSupport
import Foundation
import Testing

/// docs/reference/operations.md operations against the real daemon process: sd_notify, reload, drain, metrics.
@Suite("Operations", .serialized)
struct OperationsTests {
    private let binary = DaemonProcess.binaryPath()

    fileprivate func config(port: Int, adminPort: Int, upstreams: String) -> String {
        """
        version: 1
        listen: [127.0.0.1:\(port)]
        admin: {listen: 127.0.0.1:\(adminPort)}
        upstreams:
        \(upstreams)
        """
    }

    fileprivate func upstream(_ name: String, _ host: String, _ origin: TestOrigin, retry: String = "") -> String {
        """
          - name: \(name)
            match: {hosts: [\(host)]}
            url: \(origin.baseURL)
            \(retry)
        """
    }

    @Test(
        "a SIGHUP that changes log.level and log.format applies both: access lines appear, as JSON, from then on; listener addresses are readable"
    )
    func reloadAppliesLogSettings() async throws {
        let directory = try TestFiles.makeTemporaryDirectory()
        defer { TestFiles.remove(directory) }
        let origin = try await TestOrigin.start { _ in .text(200, "ok") }
        let port = try FreePort.reserveClosedPort()
        let adminPort = try FreePort.reserveClosedPort()
        let path = directory + "/backstop.yaml"
        func writeConfig(log: String) throws {
            try
                (config(port: port, adminPort: adminPort, upstreams: upstream("one", "one.test", origin))
                + "\nlog: \(log)\n")
                .write(toFile: path, atomically: true, encoding: .utf8)
        }
        try writeConfig(log: "{level: notice, format: logfmt, access_log: true}")
        let daemon = try DaemonProcess.start(binary: binary, arguments: ["run", "--config", path])
        defer { Task { await daemon.stop() } }
        try await daemon.waitUntilListening(port: port)
        // Listener addresses read as people write them.
        try await daemon.waitForOutput(timeout: .seconds(5)) { $0.contains("msg=listening") }
        #expect(daemon.output.contains("admin=127.0.0.1:\(adminPort) listeners=127.0.0.1:\(port) "), "\(daemon.output)")
        #expect(!daemon.output.contains("[IPv4]"))
        let quiet = try await RawHTTP.exchange(
            port: port, request: RawHTTP.request("GET", "http://one.test/quiet", host: "one.test"), timeout: .seconds(5)
        )
        #expect(quiet.status == 200)

        try writeConfig(log: "{level: info, format: json, access_log: true}")
        daemon.send(signal: SIGHUP)
        try await daemon.waitForOutput(timeout: .seconds(5)) {
            $0.contains("\"msg\":\"config reloaded\"") && $0.contains("\"log_format\":\"json\"")
        }
        let loud = try await RawHTTP.exchange(
            port: port, request: RawHTTP.request("GET", "http://one.test/loud", host: "one.test"), timeout: .seconds(5))
        #expect(loud.status == 200)
        try await daemon.waitForOutput(timeout: .seconds(5)) { $0.contains("\"path\":\"/loud\"") }
        let accessLine =
            daemon.output.split(separator: "\n").first { $0.contains("\"path\":\"/loud\"") }.map(String.init) ?? ""
        #expect(accessLine.hasPrefix("{") && accessLine.contains("\"status\":200"), "a JSON access line: \(accessLine)")
        // At `notice`, the request before the reload left no access line.
        #expect(!daemon.output.contains("/quiet"))
    }

    /// A directory holding `backstop.yaml`: listener and admin on free ports, one upstream `one` (host `one.test`) at an
    /// origin answering 200 `ok`.
    private struct Site {
        let directory: String
        let path: String
        let port: Int
        let adminPort: Int
        let origin: TestOrigin

        init(
            _ tests: OperationsTests, origin script: @escaping TestOrigin.Script = { _ in .text(200, "ok") }
        )
            async throws
        {
            directory = try TestFiles.makeTemporaryDirectory()
            path = directory + "/backstop.yaml"
            origin = try await TestOrigin.start(script: script)
            port = try FreePort.reserveClosedPort()
            adminPort = try FreePort.reserveClosedPort()
            try tests.config(port: port, adminPort: adminPort, upstreams: tests.upstream("one", "one.test", origin))
                .write(toFile: path, atomically: true, encoding: .utf8)
        }
    }

    @Test(
        "a reload of a file whose keychain and spool sections only moved down applies; one that changes the spool is refused"
    )
    func reloadWithMovedSections() async throws {
        let site = try await Site(self)
        defer { TestFiles.remove(site.directory) }
        let (directory, path, port, adminPort, origin) = (
            site.directory, site.path, site.port, site.adminPort, site.origin
        )
        func writeConfig(header: String, spool: String = "spool") throws {
            let sections =
                "keychain: {path: \(directory)/k.bkc, key_file: \(directory)/k.key}\n"
                + "spool: {dir: \(directory)/\(spool)}\n"
            try
                (header + sections
                + config(port: port, adminPort: adminPort, upstreams: upstream("one", "one.test", origin)))
                .write(toFile: path, atomically: true, encoding: .utf8)
        }
        try writeConfig(header: "")
        let daemon = try DaemonProcess.start(binary: binary, arguments: ["run", "--config", path])
        defer { Task { await daemon.stop() } }
        try await daemon.waitUntilListening(port: port)
        // Every line moves down two; nothing in force changes.
        try writeConfig(header: "# moved\n# down\n")
        daemon.send(signal: SIGHUP)
        try await daemon.waitForOutput(timeout: .seconds(5)) {
            $0.contains("config reloaded") || $0.contains("reload rejected")
        }
        #expect(daemon.output.contains("config reloaded"), "\(daemon.output)")
        #expect(!daemon.output.contains("reload rejected"))
        // Another spool directory needs a restart.
        try writeConfig(header: "# moved\n# down\n", spool: "elsewhere")
        daemon.send(signal: SIGHUP)
        try await daemon.waitForOutput(timeout: .seconds(5)) { $0.contains("the spool section changed") }
        let response = try await RawHTTP.exchange(
            port: port, request: RawHTTP.request("GET", "http://one.test/x", host: "one.test"), timeout: .seconds(5))
        #expect(response.status == 200)
    }

    @Test(
        "a reload's client_idle_timeout applies to the kept listener's next connection, not to one already open; a max_connections change is warned about"
    )
    func reloadAppliesLimitsToNewConnections() async throws {
        let site = try await Site(self)
        defer { TestFiles.remove(site.directory) }
        let daemon = try DaemonProcess.start(binary: binary, arguments: ["run", "--config", site.path])
        defer { Task { await daemon.stop() } }
        try await daemon.waitUntilListening(port: site.port)
        let request = RawHTTP.request("GET", "http://one.test/x", host: "one.test")
        let before = try await RawHTTPConnection.connect(host: "127.0.0.1", port: site.port)
        #expect(try await before.exchange(request, timeout: .seconds(5)).status == 200)
        try
            (config(port: site.port, adminPort: site.adminPort, upstreams: upstream("one", "one.test", site.origin))
            + "\nlimits: {client_idle_timeout: 1s, max_connections: 100}\n")
            .write(toFile: site.path, atomically: true, encoding: .utf8)
        daemon.send(signal: SIGHUP)
        try await daemon.waitForOutput(timeout: .seconds(5)) { $0.contains("msg=\"config reloaded\"") }
        #expect(
            daemon.output.contains("limits.max_connections changes take effect on restart for listeners that stay"),
            "\(daemon.output)")
        // A connection accepted after the reload is closed after 1 s idle (the listener's start value was 60 s)...
        let after = try await RawHTTPConnection.connect(host: "127.0.0.1", port: site.port)
        #expect(try await after.exchange(request, timeout: .seconds(5)).status == 200)
        try await after.waitForClose(timeout: .seconds(5))
        // ...while the one accepted before keeps the value it was accepted with.
        #expect(!before.isClosed)
        #expect(try await before.exchange(request, timeout: .seconds(5)).status == 200)
        await before.close()
        await after.close()
    }

    @Test("SIGQUIT drains and exits 0, as SIGTERM does (nginx's graceful stop)")
    func quitDrains() async throws {
        let site = try await Site(self)
        defer { TestFiles.remove(site.directory) }
        let (path, port) = (site.path, site.port)
        let daemon = try DaemonProcess.start(binary: binary, arguments: ["run", "--config", path])
        defer { Task { await daemon.stop() } }
        try await daemon.waitUntilListening(port: port)
        daemon.send(signal: SIGQUIT)
        #expect(try await daemon.waitForExit(timeout: .seconds(10)) == 0)
        #expect(daemon.output.contains("msg=draining signal=3"), "\(daemon.output)")
        #expect(daemon.output.contains("msg=stopped"))
    }

    @Test("a second SIGTERM during a drain stops waiting for the request in flight and exits 0")
    func secondSignalCutsDrain() async throws {
        let site = try await Site(self) { _ in .hang }
        defer { TestFiles.remove(site.directory) }
        let daemon = try DaemonProcess.start(
            binary: binary, arguments: ["run", "--config", site.path, "--drain-timeout", "120s"])
        defer { Task { await daemon.stop() } }
        try await daemon.waitUntilListening(port: site.port)
        let port = site.port
        let pending = Task {
            try? await RawHTTP.exchange(
                port: port, request: RawHTTP.request("GET", "http://one.test/slow", host: "one.test"),
                timeout: .seconds(60))
        }
        defer { pending.cancel() }
        try await Poll.until("the request reached the origin", within: .seconds(10), every: .milliseconds(20)) {
            site.origin.requestCount >= 1
        }
        daemon.send(signal: SIGTERM)
        try await daemon.waitForOutput(timeout: .seconds(5)) { $0.contains("msg=draining signal=15") }
        // The drain waits for the request (the origin never answers; timeouts.total is 30 s, the drain 120 s).
        #expect(!(await Poll.holds(within: .milliseconds(300), every: .milliseconds(50)) { !daemon.isRunning }))
        daemon.send(signal: SIGTERM)
        #expect(try await daemon.waitForExit(timeout: .seconds(10)) == 0)
        #expect(
            daemon.output.contains("msg=\"stopping without waiting for requests in flight\" signal=15"),
            "\(daemon.output)")
        #expect(daemon.output.contains("msg=stopped"))
        // The request the drain gave up on is answered as shutting down, not as an unreachable upstream.
        let answer = await pending.value
        #expect(answer?.status == 503)
        #expect(answer?.header("X-Backstop-Error") == "shutting-down")
        let line = daemon.output.split(separator: "\n").first { $0.contains("msg=request ") } ?? ""
        #expect(line.contains("error=shutting-down") && line.contains("status=503"), "\(daemon.output)")
    }

    /// CPU seconds (user + system) the process has used, from `/proc/PID/stat`.
    private func cpuSeconds(_ pid: Int32) -> Double? {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
            let end = text.lastIndex(of: ")")
        else { return nil }
        let fields = text[text.index(after: end)...].split(separator: " ")
        guard fields.count > 13, let user = Double(fields[11]), let system = Double(fields[12]) else { return nil }
        return (user + system) / Double(sysconf(Int32(_SC_CLK_TCK)))
    }

    @Test("out of file descriptors: said once in the log, no core spun on accept, served again once connections close")
    func outOfDescriptors() async throws {
        let site = try await Site(self)
        defer { TestFiles.remove(site.directory) }
        let (path, port) = (site.path, site.port)
        // prlimit execs the daemon: the same process, with 64 descriptors at most.
        let daemon = try DaemonProcess.start(
            binary: "/usr/bin/prlimit", arguments: ["--nofile=64", binary, "run", "--config", path])
        defer { Task { await daemon.stop() } }
        try await daemon.waitUntilListening(port: port)
        let pid = daemon.pid
        let (spent, served) = try await BlockingSocket.onThread { () throws -> (Double, Int) in
            var sockets: [BlockingSocket] = []
            for _ in 0..<100 { if let socket = try? BlockingSocket(port: port) { sockets.append(socket) } }
            let before = self.cpuSeconds(pid) ?? 0
            // A spinning listener passes 0.5 CPU-seconds well within the 2 s (it used ~0.9 a second): waits on that
            // condition, with the 2 s as its deadline.
            _ = Poll.holdsBlocking(within: .seconds(2), every: .milliseconds(50)) {
                (self.cpuSeconds(pid) ?? 0) - before >= 0.5
            }
            let spent = (self.cpuSeconds(pid) ?? 0) - before
            let connected = sockets.count
            sockets.removeAll()
            return (spent, connected)
        }()
        #expect(served == 100)
        #expect(spent < 0.5, "CPU seconds within 2 s at the descriptor limit: \(spent)")
        try await daemon.waitForOutput(timeout: .seconds(5)) {
            $0.contains("cannot accept connections; pausing accept") && $0.contains("errno 24")
        }
        // Descriptors back: requests are served again (bounded retries while the closed connections drain).
        try await Poll.until(
            "a request served once the connections closed", within: .seconds(10), every: .milliseconds(100)
        ) {
            (try? await RawHTTP.exchange(
                port: port, request: RawHTTP.request("GET", "http://one.test/x", host: "one.test"),
                timeout: .seconds(2)))?.status == 200
        }
    }

    @Test(
        "sd_notify READY, RELOADING/READY around SIGHUP, WATCHDOG, STOPPING; reload adds a route; a bad reload keeps the old config; drain finishes in-flight requests"
    )
    func lifecycle() async throws {
        let directory = try TestFiles.makeTemporaryDirectory()
        defer { TestFiles.remove(directory) }
        let origin = try await TestOrigin.start { request in
            request.uri == "/slow"
                ? .delay(.seconds(2), then: .text(200, "slow done")) : .text(200, "ok \(request.uri)")
        }
        let notify = try NotifySocket(directory: directory)
        let port = try FreePort.reserveClosedPort()
        let adminPort = try FreePort.reserveClosedPort()
        let path = directory + "/backstop.yaml"
        try config(port: port, adminPort: adminPort, upstreams: upstream("one", "one.test", origin))
            .write(toFile: path, atomically: true, encoding: .utf8)
        var environment = ProcessInfo.processInfo.environment
        environment["NOTIFY_SOCKET"] = notify.path
        environment["WATCHDOG_USEC"] = "400000"
        let daemon = try DaemonProcess.start(
            binary: binary, arguments: ["run", "--config", path], environment: environment)
        defer { Task { await daemon.stop() } }
        try await daemon.waitUntilListening(port: port)
        try await notify.waitFor { $0.contains("READY=1") }
        try await notify.waitFor { $0.contains("WATCHDOG=1") }
        let firstWatchdog = notify.messages.filter { $0.contains("WATCHDOG=1") }.count
        try await notify.waitFor { _ in notify.messages.filter { $0.contains("WATCHDOG=1") }.count >= firstWatchdog + 2
        }

        // An open keep-alive client connection survives the reload.
        let kept = try await RawHTTPConnection.connect(port: port)
        #expect(
            try await kept.exchange(RawHTTP.request("GET", "http://one.test/a", host: "one.test"), timeout: .seconds(5))
                .status == 200)
        let unknown = try await RawHTTP.exchange(
            port: port, request: RawHTTP.request("GET", "http://two.test/", host: "two.test"), timeout: .seconds(5))
        #expect(unknown.status == 403)

        let addedPort = try FreePort.reserveClosedPort()
        try config(
            port: port, adminPort: adminPort,
            upstreams: upstream("one", "one.test", origin) + "\n" + upstream("two", "two.test", origin)
        )
        .replacingOccurrences(
            of: "listen: [127.0.0.1:\(port)]", with: "listen: [127.0.0.1:\(port), 127.0.0.1:\(addedPort)]"
        )
        .write(toFile: path, atomically: true, encoding: .utf8)
        let before = notify.messages.count
        daemon.send(signal: SIGHUP)
        let reloading = try await notify.waitFor(after: before) {
            $0.contains("RELOADING=1") && $0.contains("MONOTONIC_USEC=")
        }
        try await notify.waitFor(after: reloading + 1) { $0.contains("READY=1") }
        let added = try await RawHTTP.exchange(
            port: port, request: RawHTTP.request("GET", "http://two.test/b", host: "two.test"), timeout: .seconds(5))
        #expect(added.status == 200)
        let viaNewListener = try await RawHTTP.exchange(
            port: addedPort, request: RawHTTP.request("GET", "http://one.test/n", host: "one.test"),
            timeout: .seconds(5))
        #expect(viaNewListener.status == 200)
        #expect(
            try await kept.exchange(RawHTTP.request("GET", "http://one.test/c", host: "one.test"), timeout: .seconds(5))
                .status == 200)

        try "version: 1\nlisten: [127.0.0.1:\(port)]\nupstreams: [{name: BAD}]\n".write(
            toFile: path, atomically: true, encoding: .utf8)
        daemon.send(signal: SIGHUP)
        try await daemon.waitForOutput(timeout: .seconds(5)) { $0.contains("reload rejected") }
        let still = try await RawHTTP.exchange(
            port: port, request: RawHTTP.request("GET", "http://two.test/d", host: "two.test"), timeout: .seconds(5))
        #expect(still.status == 200)
        let metrics = try await RawHTTP.exchange(
            port: adminPort, request: RawHTTP.request("GET", "/metrics", host: "a"), timeout: .seconds(5))
        #expect(metrics.bodyString.contains("backstop_config_reloads_total{result=\"success\"} 1\n"))
        #expect(metrics.bodyString.contains("backstop_config_reloads_total{result=\"failure\"} 1\n"))
        await kept.close()

        // SIGTERM with a 2 s request in flight: it completes, new connections are refused, exit 0.
        let seenBefore = origin.requestCount
        let slow = Task {
            try await RawHTTP.exchange(
                port: port, request: RawHTTP.request("GET", "http://one.test/slow", host: "one.test"),
                timeout: .seconds(10))
        }
        _ = try await origin.waitForRequests(seenBefore + 1, timeout: .seconds(5))
        daemon.send(signal: SIGTERM)
        try await notify.waitFor { $0.contains("STOPPING=1") }
        try await Task.sleep(for: .milliseconds(200))
        await #expect(throws: (any Error).self) {
            _ = try await RawHTTP.exchange(
                port: port, request: RawHTTP.request("GET", "http://one.test/new", host: "one.test"),
                timeout: .seconds(2))
        }
        let finished = try await slow.value
        #expect(finished.status == 200)
        #expect(finished.bodyString == "slow done")
        let status = try await daemon.waitForExit(timeout: .seconds(10))
        #expect(status == 0)
        try await origin.shutdown()
    }

    @Test("/metrics carries every documented metric with values from scripted traffic")
    func metrics() async throws {
        let directory = try TestFiles.makeTemporaryDirectory()
        defer { TestFiles.remove(directory) }
        let origin = try await TestOrigin.start(
            script: TestOrigin.sequence(
                [.respond(status: 503), .respond(status: 503)], then: .text(200, "ok")))
        let port = try FreePort.reserveClosedPort()
        let adminPort = try FreePort.reserveClosedPort()
        let path = directory + "/backstop.yaml"
        try config(
            port: port, adminPort: adminPort,
            upstreams: upstream(
                "app", "app.test", origin,
                retry: "retry: {attempts: 3, backoff: {strategy: constant, base: 10ms, max: 10ms, jitter: none}}")
        )
        .write(toFile: path, atomically: true, encoding: .utf8)
        let daemon = try DaemonProcess.start(binary: binary, arguments: ["run", "--config", path])
        try await daemon.waitUntilListening(port: port)
        let response = try await RawHTTP.exchange(
            port: port, request: RawHTTP.request("GET", "http://app.test/x", host: "app.test"), timeout: .seconds(5))
        #expect(response.header("X-Backstop-Attempts") == "3")
        _ = try await RawHTTP.exchange(
            port: port, request: RawHTTP.request("GET", "http://nowhere.test/", host: "nowhere.test"),
            timeout: .seconds(5))
        let metrics = try await RawHTTP.exchange(
            port: adminPort, request: RawHTTP.request("GET", "/metrics"), timeout: .seconds(5))
        #expect(metrics.status == 200)
        let text = metrics.bodyString
        for line in [
            "backstop_requests_total{upstream=\"app\",code=\"200\"} 1",
            "backstop_requests_total{upstream=\"-\",code=\"403\"} 1",
            "backstop_upstream_attempts_total{upstream=\"app\",outcome=\"5xx\"} 2",
            "backstop_upstream_attempts_total{upstream=\"app\",outcome=\"2xx\"} 1",
            "backstop_retries_total{upstream=\"app\",reason=\"503\"} 2",
            "backstop_request_duration_seconds_count{upstream=\"app\"} 1",
            "backstop_inflight_requests 0",
        ] {
            #expect(text.contains(line + "\n"), "missing: \(line)")
        }
        for family in ["backstop_retry_budget_exhausted_total", "backstop_token_refreshes_total"] {
            #expect(text.contains("# TYPE \(family) counter"))
        }
        // Every sample line parses as `name{labels} value`.
        for line in text.split(separator: "\n") where !line.hasPrefix("#") {
            let parts = line.split(separator: " ")
            #expect(parts.count == 2 && Double(parts[1]) != nil, "bad sample line: \(line)")
        }
        await daemon.stop()
        try await origin.shutdown()
    }
}
