import BackstopKeychain
import BackstopTestSupport
import Foundation
import NIOConcurrencyHelpers
import Synchronization
import Testing

/// Queued delivery through the real daemon (docs/reference/behaviour.md#queued-delivery): `202` only once stored,
/// the deliverer sending through the upstream's auth with one `Idempotency-Key` per delivery, deliveries surviving
/// an upstream outage and `kill -9`, dead letters, and `507` when the spool is full.
@Suite("Queued delivery", .serialized)
struct QueuedDeliveryTests {
    private let binary = DaemonProcess.binaryPath()

    /// A daemon with a keychain holding `api/token`, a spool, and upstream `events` (host `events.test`) with
    /// `delivery: queue` at `origin`.
    final class Setup: Sendable {
        let directory: String
        let port: Int
        let config: String

        /// `upstream`: more settings of upstream `events`, one per line; `extra`: more top-level settings.
        init(origin: TestOrigin, maxBytes: String = "64MiB", upstream: [String] = [], extra: String = "") throws {
            directory = try TestFiles.makeTemporaryDirectory(prefix: "backstop-queued")
            let opened = try KeychainBootstrap.open(
                path: directory + "/keychain.bkc", key: .file(path: directory + "/keychain.key"))
            try opened.keychain.set("api/token", value: Array("queue-t0ken".utf8))
            port = try FreePort.reserveClosedPort()
            config = directory + "/backstop.yaml"
            try """
            version: 1
            listen: [127.0.0.1:\(port)]
            log: {level: info}
            \(keychainSection(directory: directory))
            spool: {dir: \(directory)/spool, max_bytes: \(maxBytes)}
            upstreams:
              - name: events
                match: {hosts: [events.test]}
                url: \(origin.baseURL)
                auth: {type: static, entry: api/token}
                delivery: queue
                retry: {attempts: 1}
            \(upstream.map { "    " + $0 + "\n" }.joined())\(extra)
            """.write(toFile: config, atomically: true, encoding: .utf8)
        }

        deinit { TestFiles.remove(directory) }

        func post(_ path: String, body: String, headers: [(String, String)] = []) async throws -> RawHTTPResponse {
            try await RawHTTP.exchange(
                port: port,
                request: RawHTTP.request(
                    "POST", "http://events.test\(path)", host: "events.test", headers: headers, body: Array(body.utf8)),
                timeout: .seconds(20))
        }

        /// Writes `text` as the config and has `daemon` reload it.
        func reload(_ daemon: DaemonProcess, with text: String) throws {
            try text.write(toFile: config, atomically: true, encoding: .utf8)
            daemon.send(signal: SIGHUP)
        }

        func deliveries(_ arguments: [String]) async throws -> String {
            let result = try await TestProcess.run(
                DaemonProcess.binaryPath(), ["deliveries"] + arguments + ["--config", config])
            #expect(result.status == 0, "\(result.standardError)")
            return result.standardOutput
        }
    }

    /// An origin that resets every connection while `down`, else answers `204`; it records the `Idempotency-Key`
    /// of each request it answered.
    final class SwitchableOrigin: Sendable {
        final class Flag: Sendable {
            let down: Synchronization.Atomic<Bool>
            /// Requests answered with a reset (counted once the answer is decided, unlike `requests`).
            let resets = Atomic<Int>(0)
            let answered = NIOLockedValueBox<[String]>([])
            init(_ down: Bool) { self.down = Atomic(down) }
        }
        let flag: Flag
        let origin: TestOrigin

        init(down: Bool) async throws {
            let flag = Flag(down)
            self.flag = flag
            origin = try await TestOrigin.start { request in
                if flag.down.load(ordering: .acquiring) {
                    flag.resets.add(1, ordering: .relaxed)
                    return .reset
                }
                if let key = request.header("Idempotency-Key") { flag.answered.withLockedValue { $0.append(key) } }
                return .respond(status: 204)
            }
        }

        /// The `Idempotency-Key`s of the requests answered `204`, in order.
        var answered: [String] { flag.answered.withLockedValue { $0 } }

        func setDown(_ value: Bool) { flag.down.store(value, ordering: .releasing) }

        /// Waits until `count` requests were answered with a reset: the origin records a request before it looks at
        /// `down`, so `waitForRequests` alone can return before that request's answer is decided.
        func waitForResets(_ count: Int) async throws {
            try await Poll.until("\(count) tries reset") { flag.resets.load(ordering: .relaxed) >= count }
        }
    }

    /// A daemon on `setup` with one request accepted (`202`) and tried once against the origin, which is down;
    /// returns the daemon and the delivery id.
    static func queueOneWhileDown(
        _ setup: Setup, _ switchable: SwitchableOrigin
    ) async throws -> (DaemonProcess, String) {
        let daemon = try DaemonProcess.start(
            binary: DaemonProcess.binaryPath(), arguments: ["run", "--config", setup.config])
        try await daemon.waitUntilListening(port: setup.port)
        let id = try #require(try await setup.post("/e", body: "event").header("X-Backstop-Delivery"))
        try await switchable.waitForResets(1)
        return (daemon, id)
    }

    /// Counts what an origin script answered.
    final class Counter: Sendable {
        let value = Atomic<Int>(0)
        /// The count before this call.
        func next() -> Int { value.add(1, ordering: .relaxed).oldValue }
    }

    @Test("202 with X-Backstop-Delivery once stored; delivered with the token and the delivery id as Idempotency-Key")
    func acceptAndDeliver() async throws {
        let origin = try await TestOrigin.start { _ in .respond(status: 201) }
        let setup = try Setup(origin: origin)
        let daemon = try DaemonProcess.start(binary: binary, arguments: ["run", "--config", setup.config])
        try await daemon.waitUntilListening(port: setup.port)

        let response = try await setup.post(
            "/events?sig=abc", body: #"{"n":1}"#,
            headers: [("Connection", "keep-alive, X-Hop"), ("X-Hop", "hop-secret"), ("X-Kept", "yes")])
        #expect(response.status == 202)
        let id = try #require(response.header("X-Backstop-Delivery"))
        #expect(!id.isEmpty)

        let received = try await origin.waitForRequests(1, timeout: .seconds(10))
        let request = try #require(received.first)
        #expect(request.method == "POST")
        #expect(request.uri == "/events?sig=abc")
        #expect(request.body == Array(#"{"n":1}"#.utf8))
        #expect(request.header("Authorization") == "Bearer queue-t0ken")
        #expect(request.header("Idempotency-Key") == id)
        #expect(request.header("X-Backstop-Delivery") == nil, "the private delivery header never leaves")
        // A field the client's `Connection` names is hop-by-hop: never stored, never delivered.
        #expect(request.header("X-Hop") == nil)
        #expect(request.header("X-Kept") == "yes")

        // Delivered: nothing left to list.
        try await daemon.waitForOutput(timeout: .seconds(10)) { $0.contains("msg=delivered") }
        #expect(try await setup.deliveries(["list"]).isEmpty)
        #expect(!daemon.output.contains("queue-t0ken"))
        await daemon.stop()
        try await origin.shutdown()
    }

    @Test(
        "a queued request has its server span like any other: 202 with the upstream, in the client's trace; a 507 spool-full too, with its reason"
    )
    func queuedIntakeTraced() async throws {
        let receiver = try await TracedRequestTests.Receiver.start()
        defer { receiver.stop() }
        let switchable = try await SwitchableOrigin(down: true)
        let setup = try Setup(
            origin: switchable.origin, maxBytes: "1MiB",
            extra: "limits: {max_request_body: 512KiB}\n" + TracedRequestTests.tracing(receiver))
        let daemon = try DaemonProcess.start(binary: binary, arguments: ["run", "--config", setup.config])
        try await daemon.waitUntilListening(port: setup.port)
        let traces = ["1bf92f3577b34da6a3ce929d0e0e4736", "2bf92f3577b34da6a3ce929d0e0e4736"]
        let accepted = try await setup.post(
            "/hook", body: "{}", headers: [("traceparent", "00-\(traces[0])-00f067aa0ba902b7-01")])
        #expect(accepted.status == 202)
        // Bodies of 500 KiB until the 1 MiB budget refuses one, without storing it.
        var statuses: [Int] = []
        for n in 0..<3 where !statuses.contains(507) {
            statuses.append(
                try await setup.post(
                    "/big/\(n)", body: String(repeating: "x", count: 500 * 1024),
                    headers: [("traceparent", "00-\(traces[1])-00f067aa0ba902b7-01")]
                ).status)
        }
        #expect(statuses.last == 507, "\(statuses)")

        try await receiver.process.waitForOutput(timeout: .seconds(15)) { output in
            traces.allSatisfy { output.contains($0) }
        }
        let spans = receiver.spans
        let intake = try #require(spans.first { $0["trace_id"] as? String == traces[0] })
        #expect(intake["kind"] as? String == "SPAN_KIND_SERVER")
        #expect(intake["parent_span_id"] as? String == "00f067aa0ba902b7")
        #expect(TracedRequestTests.int(intake, "http.response.status_code") == 202)
        #expect(TracedRequestTests.string(intake, "backstop.upstream") == "events")
        #expect(TracedRequestTests.int(intake, "backstop.attempts") == 0)
        let full = try #require(
            spans.first {
                $0["trace_id"] as? String == traces[1] && TracedRequestTests.int($0, "http.response.status_code") == 507
            })
        #expect(TracedRequestTests.string(full, "error.type") == "spool-full")
        #expect(TracedRequestTests.statusCode(full) == "STATUS_CODE_ERROR")
        await daemon.stop()
        try await switchable.origin.shutdown()
    }

    @Test(
        "deliveries list: a spool.dir that is missing, or whose queue cannot be looked at, is exit 1 naming it — never the empty list a drain check would trust"
    )
    func listRefusesASpoolItCannotSee() async throws {
        let origin = try await TestOrigin.start { _ in .text(204, "") }
        let setup = try Setup(origin: origin)
        let spool = setup.directory + "/spool"
        func list() async throws -> (status: Int32, error: String) {
            let result = try await TestProcess.run(binary, ["deliveries", "list", "--config", setup.config])
            #expect(result.standardOutput.isEmpty)
            return (result.status, result.standardError)
        }
        let missing = try await list()
        #expect(missing.status == 1)
        #expect(missing.error.contains("spool.dir \(spool): No such file or directory"), "\(missing.error)")
        // A queue file that cannot be looked at (here a symlink loop; as another user, EACCES): its path and why.
        #expect(mkdir(spool, 0o700) == 0)
        #expect(symlink(spool + "/queue.db", spool + "/queue.db") == 0)
        let unreadable = try await list()
        #expect(unreadable.status == 1)
        #expect(
            unreadable.error.contains("\(spool)/queue.db: Too many levels of symbolic links"), "\(unreadable.error)")
        // A spool where nothing was ever queued lists nothing, as before.
        #expect(unlink(spool + "/queue.db") == 0)
        #expect(try await list() == (0, ""))
        try await origin.shutdown()
    }

    @Test("accepted while the upstream resets every connection; delivered when it is back, one key on every try")
    func outlivesOutage() async throws {
        let switchable = try await SwitchableOrigin(down: true)
        let setup = try Setup(origin: switchable.origin)
        let daemon = try DaemonProcess.start(binary: binary, arguments: ["run", "--config", setup.config])
        try await daemon.waitUntilListening(port: setup.port)

        let response = try await setup.post("/hook", body: "payload", headers: [("Idempotency-Key", "client-key-1")])
        #expect(response.status == 202)
        // At least one try fails against the reset, then the origin comes back.
        try await switchable.waitForResets(1)
        switchable.setDown(false)
        try await daemon.waitForOutput(timeout: .seconds(15)) { $0.contains("msg=delivered") }
        let tries = switchable.origin.requests
        #expect(tries.count >= 2)
        #expect(tries.allSatisfy { $0.header("Idempotency-Key") == "client-key-1" }, "the client's own key is kept")
        #expect(tries.allSatisfy { $0.body == Array("payload".utf8) })
        await daemon.stop()
        try await switchable.origin.shutdown()
    }

    @Test("every request that got 202 is delivered after kill -9 and a restart")
    func survivesKill() async throws {
        let switchable = try await SwitchableOrigin(down: true)
        let setup = try Setup(origin: switchable.origin)
        var daemon = try DaemonProcess.start(binary: binary, arguments: ["run", "--config", setup.config])
        try await daemon.waitUntilListening(port: setup.port)
        var accepted: [String] = []
        for n in 0..<20 {
            let response = try await setup.post("/e/\(n)", body: "event \(n)")
            #expect(response.status == 202)
            if let id = response.header("X-Backstop-Delivery") { accepted.append(id) }
        }
        #expect(accepted.count == 20)
        daemon.send(signal: SIGKILL)
        _ = try await daemon.waitForExit(timeout: .seconds(10))

        switchable.setDown(false)
        daemon = try DaemonProcess.start(binary: binary, arguments: ["run", "--config", setup.config])
        try await daemon.waitUntilListening(port: setup.port)
        let deadline = ContinuousClock.now + .seconds(30)
        var keys = Set<String>()
        while ContinuousClock.now < deadline {
            keys = Set(switchable.origin.requests.compactMap { $0.header("Idempotency-Key") })
            if Set(accepted).isSubset(of: keys), try await setup.deliveries(["list"]).isEmpty { break }
            _ = try? await switchable.origin.waitForRequests(switchable.origin.requestCount + 1, timeout: .seconds(1))
        }
        #expect(Set(accepted).isSubset(of: keys), "missing: \(Set(accepted).subtracting(keys))")
        #expect(keys.isSubset(of: Set(accepted)), "nothing that did not get 202 is delivered")
        await daemon.stop()
        try await switchable.origin.shutdown()
    }

    @Test(
        "an answer that cannot be relayed (a 101 nobody asked for) is a dead letter at once, as a 1xx is, not retried")
    func unrelayableAnswerIsADeadLetter() async throws {
        let switching = Array(
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n".utf8)
        let origin = try await TestOrigin.start { _ in .raw(switching, close: true) }
        let setup = try Setup(origin: origin)
        let daemon = try DaemonProcess.start(binary: binary, arguments: ["run", "--config", setup.config])
        try await daemon.waitUntilListening(port: setup.port)
        let id = try #require(try await setup.post("/switch", body: "record").header("X-Backstop-Delivery"))
        try await daemon.waitForOutput(timeout: .seconds(10)) { $0.contains("dead letter") }
        let dead = try await setup.deliveries(["list", "--dead"])
        #expect(dead.contains(id) && dead.contains("bad-upstream-response"), "\(dead)")
        #expect(try await setup.deliveries(["list"]).isEmpty, "not queued again")
        #expect(origin.requests.count == 1, "one try of one attempt (retry.attempts: 1), not a schedule of them")
        await daemon.stop()
        try await origin.shutdown()
    }

    @Test("a 400 becomes a dead letter, listed with its outcome; deliveries retry sends it again")
    func deadLetterAndRetry() async throws {
        let answers = Counter()
        let origin = try await TestOrigin.start { _ in
            answers.next() == 0 ? .respond(status: 400) : .respond(status: 200)
        }
        let setup = try Setup(origin: origin)
        let daemon = try DaemonProcess.start(binary: binary, arguments: ["run", "--config", setup.config])
        try await daemon.waitUntilListening(port: setup.port)
        let response = try await setup.post("/audit", body: "record")
        let id = try #require(response.header("X-Backstop-Delivery"))
        try await daemon.waitForOutput(timeout: .seconds(10)) { $0.contains("dead letter") }
        let dead = try await setup.deliveries(["list", "--dead"])
        #expect(dead.contains(id))
        #expect(dead.contains("status 400"))
        // An edited outcome with a line break, a tab and an escape sequence stays one escaped line.
        let edit = try await TestProcess.run(
            "/usr/bin/python3",
            [
                "-c",
                "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); "
                    + "c.execute(\"UPDATE deliveries SET last_outcome='status 400\\nforged\\trow\\x1b[2J'\"); c.commit()",
                setup.directory + "/spool/queue.db",
            ])
        #expect(edit.status == 0, "\(edit.standardError)")
        let edited = try await setup.deliveries(["list", "--dead"])
        #expect(edited.split(separator: "\n").count == 1, "\(edited)")
        #expect(edited.contains("status 400\\nforged\\trow\\u001b[2J") && !edited.contains("\u{1B}"), "\(edited)")

        _ = try await setup.deliveries(["retry", id])
        try await daemon.waitForOutput(timeout: .seconds(15)) { $0.contains("msg=delivered") }
        #expect(origin.requests.count == 2)
        #expect(try await setup.deliveries(["list", "--dead"]).isEmpty)
        // Bad input is exit 1 (a usage error would be 2): an id that is not one, and one that names nothing.
        for arguments in [
            ["retry", "does-not-exist"], ["drop", "bogus"], ["drop", "00000000-0000-7000-8000-000000000000"],
        ] {
            let result = try await TestProcess.run(
                DaemonProcess.binaryPath(), ["deliveries"] + arguments + ["--config", setup.config])
            #expect(result.status == 1, "\(arguments): \(result.standardError)")
            #expect(result.standardError.hasPrefix("error: "), "\(arguments): \(result.standardError)")
        }
        await daemon.stop()
        try await origin.shutdown()
    }

    @Test(
        "a reload that renames the queue upstream leaves its deliveries queued, saying so; named back, they are sent"
    )
    func upstreamNoLongerQueued() async throws {
        let switchable = try await SwitchableOrigin(down: true)
        let setup = try Setup(origin: switchable.origin)
        let (daemon, id) = try await Self.queueOneWhileDown(setup, switchable)
        let original = try String(contentsOfFile: setup.config, encoding: .utf8)
        try setup.reload(daemon, with: original.replacingOccurrences(of: "- name: events", with: "- name: events2"))
        // Before the fix nothing was said: the delivery waited, with no lane for it, unseen.
        try await daemon.waitForOutput(timeout: .seconds(10)) { output in
            output.split(separator: "\n").contains {
                $0.contains("msg=\"deliveries wait for an upstream without delivery: queue\" count=1 ")
                    && $0.hasSuffix(" upstream=events")
            }
        }
        #expect(try await setup.deliveries(["list"]).contains(id), "kept, as the 202 promised")

        switchable.setDown(false)
        try setup.reload(daemon, with: original)
        try await daemon.waitForOutput(timeout: .seconds(15)) { $0.contains("msg=delivered") }
        #expect(switchable.answered == [id])
        await daemon.stop()
        try await switchable.origin.shutdown()
    }

    @Test(
        "a delivery goes to the upstream it was accepted for or nowhere: after a reload gives its host to another upstream, it is a dead letter (403), never sent there"
    )
    func deliveredOnlyToItsUpstream() async throws {
        let switchable = try await SwitchableOrigin(down: true)
        let other = try await TestOrigin.start { _ in .respond(status: 204) }
        let setup = try Setup(origin: switchable.origin)
        let (daemon, id) = try await Self.queueOneWhileDown(setup, switchable)
        // events.test now routes to `admin` (its own credential); `events` keeps `delivery: queue` for other.test.
        let original = try String(contentsOfFile: setup.config, encoding: .utf8)
        try setup.reload(
            daemon,
            with: original.replacingOccurrences(
                of: "match: {hosts: [events.test]}", with: "match: {hosts: [other.test]}")
                + "  - {name: admin, match: {hosts: [events.test]}, url: \(other.baseURL)}\n")
        try await daemon.waitForOutput(timeout: .seconds(10)) { $0.contains("msg=\"config reloaded\"") }
        switchable.setDown(false)
        try await daemon.waitForOutput(timeout: .seconds(20)) { $0.contains("delivery is a dead letter") }
        #expect(other.requestCount == 0, "sent to another upstream")
        let dead = try await setup.deliveries(["list", "--dead"])
        #expect(dead.contains(id) && dead.contains("status 403"), "\(dead)")
        await daemon.stop()
        try await switchable.origin.shutdown()
        try await other.shutdown()
    }

    @Test("a client that hangs up inside its body is logged 499 client-closed, not 400; nothing is stored")
    func hangUpInsideBody() async throws {
        let origin = try await TestOrigin.start { _ in .respond(status: 204) }
        let setup = try Setup(origin: origin)
        let daemon = try DaemonProcess.start(binary: binary, arguments: ["run", "--config", setup.config])
        try await daemon.waitUntilListening(port: setup.port)
        let port = setup.port
        try await BlockingSocket.onThread {
            let socket = try BlockingSocket(port: port)
            _ = socket.send(
                "POST http://events.test/part HTTP/1.1\r\nHost: events.test\r\nContent-Length: 100\r\n\r\nseven b")
        }()
        try await daemon.waitForOutput(timeout: .seconds(10)) { $0.contains("path=/part") }
        let line = daemon.output.split(separator: "\n").first { $0.contains("path=/part") }.map(String.init) ?? ""
        #expect(line.contains("status=499") && line.contains("error=client-closed"), "\(line)")
        #expect(try await setup.deliveries(["list"]).isEmpty)
        #expect(origin.requestCount == 0)
        await daemon.stop()
        try await origin.shutdown()
    }

    @Test("a 2xx whose body never comes (cut at timeouts.total) is a delivery, not a timeout sent again")
    func acceptedWithSlowBody() async throws {
        let origin = try await TestOrigin.start { _ in
            .raw(Array("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n".utf8))
        }
        let setup = try Setup(origin: origin, upstream: ["timeouts: {per_try: 1s, total: 2s}"])
        let daemon = try DaemonProcess.start(binary: binary, arguments: ["run", "--config", setup.config])
        try await daemon.waitUntilListening(port: setup.port)
        #expect(try await setup.post("/slow", body: "event").status == 202)
        // Before the fix: `outcome=timeout`, tried again later, again and again until max_age, then a dead letter.
        try await daemon.waitForOutput(timeout: .seconds(20)) {
            $0.contains("msg=delivered") || $0.contains("tried again later")
        }
        #expect(daemon.output.contains("msg=delivered"), "\(daemon.output)")
        #expect(origin.requestCount == 1)
        #expect(try await setup.deliveries(["list"]).isEmpty)
        await daemon.stop()
        try await origin.shutdown()
    }

    @Test(
        "a full disk (a 1 MiB tmpfs in the daemon's own mount namespace): 507 spool-full, every 202 is delivered and its outcome recorded"
    )
    func diskFull() async throws {
        try #require(
            getuid() == 0 && FileManager.default.isExecutableFile(atPath: "/usr/bin/unshare"),
            "needs root and unshare(1) to mount a tmpfs in a private mount namespace")
        let switchable = try await SwitchableOrigin(down: true)
        // The budget is far above the filesystem: what refuses is the disk, not spool.max_bytes.
        // Never ejected: the outage would otherwise open the circuit for 30 s, and what is tested is the store.
        let setup = try Setup(
            origin: switchable.origin, maxBytes: "1GiB", upstream: ["circuit: {failures: 0}"],
            extra: "limits: {max_request_body: 512KiB}")
        let spool = setup.directory + "/spool"
        try FileManager.default.createDirectory(atPath: spool, withIntermediateDirectories: false)
        // unshare(1) makes the new mount namespace private: the tmpfs is the daemon's only and goes with it.
        let script = "mount -t tmpfs -o size=1m,mode=0700 backstop-test \"$0\" && exec \"$@\""
        let daemon = try DaemonProcess.start(
            binary: "/usr/bin/unshare",
            arguments: ["-m", "/bin/sh", "-c", script, spool, binary, "run", "--config", setup.config])
        try await daemon.waitUntilListening(port: setup.port)

        let body = String(repeating: "f", count: 48 * 1024)
        var accepted: [String] = []
        var refused: [Int] = []
        var others: [Int] = []
        let fillDeadline = ContinuousClock.now + .seconds(60)
        for n in 0..<200 where refused.count < 3 && ContinuousClock.now < fillDeadline {
            let response = try await setup.post("/full/\(n)", body: body)
            switch response.status {
            case 202:
                if let id = response.header("X-Backstop-Delivery") { accepted.append(id) }
            case 507:
                #expect(response.header("X-Backstop-Error") == "spool-full")
                #expect(response.header("X-Backstop-Delivery") == nil)
                refused.append(n)
            default:
                others.append(response.status)
            }
        }
        #expect(others.isEmpty, "only 202 and 507: \(others)")
        #expect(refused.count == 3, "the 1 MiB disk filled within 200 requests of 48 KiB")
        #expect(accepted.count >= 5, "\(accepted.count) accepted before the disk was full")
        #expect(daemon.isRunning)

        // The store still reads: once the origin is back, every request that got 202 is delivered (answered 204),
        // none other; and the reserve (`SpoolReserve`) gives their outcomes room: each is recorded as delivered.
        // Before the fix the queue had filled the disk with its own WAL: no outcome could be written, nothing was
        // freed, and a restart refused to open the queue.
        switchable.setDown(false)
        try await daemon.waitForOutput(timeout: .seconds(30)) { output in
            let recorded = output.split(separator: "\n").filter { $0.contains("msg=delivered") }
            return accepted.allSatisfy { id in recorded.contains { $0.contains(id) } }
        }
        let delivered = switchable.answered
        #expect(Set(delivered) == Set(accepted), "nothing refused is delivered, nothing accepted is missing")
        let deliveredPaths = Set(switchable.origin.requests.map(\.uri))
        #expect(refused.allSatisfy { !deliveredPaths.contains("/full/\($0)") })
        let answered = switchable.answered
        #expect(answered.count == Set(answered).count, "a delivered request was sent again: \(answered)")
        await daemon.stop()
        try await switchable.origin.shutdown()
    }

    @Test(
        "507 spool-full once the spool's budget is spent; nothing is kept of the refused request; the status page shows the 507s among the upstream's failures"
    )
    func spoolFull() async throws {
        let switchable = try await SwitchableOrigin(down: true)
        let adminPort = try FreePort.reserveClosedPort()
        let setup = try Setup(
            origin: switchable.origin, maxBytes: "1MiB",
            extra: "limits: {max_request_body: 512KiB}\nadmin: {listen: 127.0.0.1:\(adminPort)}")
        let daemon = try DaemonProcess.start(binary: binary, arguments: ["run", "--config", setup.config])
        try await daemon.waitUntilListening(port: setup.port)
        let body = String(repeating: "x", count: 300 * 1024)
        var statuses: [Int] = []
        for n in 0..<5 {
            let response = try await setup.post("/big/\(n)", body: body)
            statuses.append(response.status)
            if response.status == 507 {
                #expect(response.header("X-Backstop-Error") == "spool-full")
                #expect(response.header("X-Backstop-Delivery") == nil)
            }
        }
        #expect(statuses.prefix(3).allSatisfy { $0 == 202 }, "\(statuses)")
        #expect(statuses.last == 507, "\(statuses)")
        let listed = try await setup.deliveries(["list"])
        #expect(listed.split(separator: "\n").count == statuses.filter { $0 == 202 }.count)
        // Answered by Backstop for the upstream: its 507s are among the status page's failures (they were not).
        let status = try await RawHTTP.exchange(
            port: adminPort, request: RawHTTP.request("GET", "/status.json", host: "admin"), timeout: .seconds(5))
        let object = try #require(
            try JSONSerialization.jsonObject(with: Data(status.bodyString.utf8)) as? [String: Any])
        let failures = try #require(object["failures"] as? [[String: Any]])
        #expect(
            failures.filter { $0["cause"] as? String == "spool-full" && $0["upstream"] as? String == "events" }.count
                == statuses.filter { $0 == 507 }.count, "\(failures)")
        await daemon.stop()
        try await switchable.origin.shutdown()
    }
}
