import BackstopKeychain
import BackstopTestSupport
import Foundation
import NIOConcurrencyHelpers
import Testing

/// A fleet of real daemons on one PostgreSQL token store and one token endpoint that rotates refresh tokens and
/// revokes the whole family on reuse (docs/reference/token-store.md): exactly one refresh per expiry fleet-wide, no
/// reuse, every instance adopting what others fetched; and the same fleet on separate keychains, which is what the
/// store prevents.
@Suite(
    "Fleet token store", .serialized, .enabled(if: TestPostgres.isAvailable, "\(TestPostgres.unavailableReason ?? "")"))
struct FleetTests {
    let binary = DaemonProcess.binaryPath()

    /// A fleet's shared parts: the cluster, the endpoint, the origin, the key file and a keychain per daemon.
    struct Fleet {
        let pg: TestPostgres?
        let auth: TestAuthServer
        let origin: TestOrigin
        let directory: String
        var daemons: [DaemonProcess] = []
        var ports: [(proxy: Int, admin: Int)] = []
    }

    /// Writes `count` configs and keychains (one key file) and starts a daemon on each.
    func startFleet(
        count: Int, postgres: Bool, lifetime: Int, refreshAhead: String, seedEach: Bool = false
    ) async throws -> Fleet {
        let pg = postgres ? try await TestPostgres.start() : nil
        let auth = try await TestAuthServer.start()
        auth.update {
            $0.expiresIn = lifetime
            $0.enforcedLifetime = .seconds(lifetime)
            $0.revokeFamilyOnReuse = true
        }
        let origin = try await TestOrigin.start(script: auth.protectedScript())
        let directory = try TestFiles.makeTemporaryDirectory()
        var fleet = Fleet(pg: pg, auth: auth, origin: origin, directory: directory)
        let keyPath = directory + "/keychain.key"
        for index in 0..<count {
            let opened = try KeychainBootstrap.open(path: directory + "/kc\(index).bkc", key: .file(path: keyPath))
            if let pg { try opened.keychain.set("postgres/password", value: Array(pg.password.utf8)) }
            if seedEach { try opened.keychain.set("api/refresh_token", value: Array("refresh-0".utf8)) }
            let ports = (proxy: try FreePort.reserveClosedPort(), admin: try FreePort.reserveClosedPort())
            let store =
                pg.map { pg in
                    """
                    token_store:
                      type: postgres
                      url: postgres://\(pg.user)@127.0.0.1:\(pg.port)/\(pg.database)
                      password_entry: postgres/password
                      tls: disable
                    """
                } ?? ""
            try """
            version: 1
            listen: [127.0.0.1:\(ports.proxy)]
            admin: {listen: 127.0.0.1:\(ports.admin)}
            log: {level: info, access_log: false}
            keychain: {path: kc\(index).bkc, key_file: keychain.key}
            \(store)
            upstreams:
              - name: api
                match: {hosts: [api.test]}
                url: \(origin.baseURL)
                retry: {attempts: 1}
                auth: {type: oauth2, token_url: \(auth.tokenURL), keychain_prefix: api, refresh_ahead: \(refreshAhead)}
            """.write(toFile: directory + "/d\(index).yaml", atomically: true, encoding: .utf8)
            fleet.ports.append(ports)
        }
        if postgres {
            let seeded = try await SpawnedProcess.run(
                "/bin/sh",
                [
                    "-c", "printf %s refresh-0 | '\(binary)' tokens seed api --config '\(directory)/d0.yaml'",
                ])
            #expect(seeded.status == 0, "\(seeded.standardError)")
        }
        for index in 0..<count {
            let daemon = try DaemonProcess.start(
                binary: binary, arguments: ["run", "--config", directory + "/d\(index).yaml"])
            fleet.daemons.append(daemon)
        }
        for (index, daemon) in fleet.daemons.enumerated() {
            try await daemon.waitUntilListening(port: fleet.ports[index].proxy)
        }
        return fleet
    }

    func stop(_ fleet: Fleet) async {
        for daemon in fleet.daemons { await daemon.stop() }
        try? await fleet.origin.shutdown()
        try? await fleet.auth.origin.shutdown()
        await fleet.pg?.stop()
        TestFiles.remove(fleet.directory)
    }

    /// Statuses of requests sent by `clients` concurrent clients, round robin over the daemons, until `duration`
    /// passed; the endpoint revokes every access token every `revokeEvery`.
    func load(
        _ fleet: Fleet, clients: Int, duration: Duration, revokeEvery: Duration?
    ) async throws -> [Int: Int] {
        let deadline = ContinuousClock.now + duration
        let statuses = NIOLockedValueBox<[Int: Int]>([:])
        let ports = fleet.ports.map(\.proxy)
        let auth = fleet.auth
        try await withThrowingTaskGroup(of: Void.self) { group in
            for client in 0..<clients {
                group.addTask {
                    var index = client
                    while ContinuousClock.now < deadline {
                        let port = ports[index % ports.count]
                        index += 1
                        let status: Int
                        do {
                            status = try await RawHTTP.exchange(
                                port: port,
                                request: RawHTTP.request("GET", "http://api.test/c\(client)", host: "api.test"),
                                timeout: .seconds(20)
                            ).status
                        } catch {
                            status = 0
                        }
                        statuses.withLockedValue { $0[status, default: 0] += 1 }
                    }
                }
            }
            if let revokeEvery {
                group.addTask {
                    while ContinuousClock.now + revokeEvery < deadline {
                        try await Task.sleep(for: revokeEvery)
                        auth.revokeAllAccessTokens()
                    }
                }
            }
            try await group.waitForAll()
        }
        return statuses.withLockedValue { $0 }
    }

    /// `backstop_token_refreshes_total{upstream="api",result=…}` of one daemon.
    func refreshes(_ adminPort: Int) async throws -> [String: Int] {
        let text = try await RawHTTP.exchange(
            port: adminPort, request: RawHTTP.request("GET", "/metrics", host: "a"), timeout: .seconds(5)
        ).bodyString
        var out: [String: Int] = [:]
        for line in text.split(separator: "\n") where line.hasPrefix("backstop_token_refreshes_total{upstream=\"api\"")
        {
            guard let result = line.split(separator: "\"").dropFirst(3).first,
                let value = line.split(separator: " ").last
            else { continue }
            out[String(result)] = Int(value)
        }
        return out
    }

    @Test(
        "8 daemons on one PostgreSQL store under load, tokens living 2 s and revoked every 7 s: every request succeeds, one grant per expiry or revocation, no refresh token reused, every daemon adopts tokens it did not fetch"
    )
    func fleetRefreshesOncePerExpiry() async throws {
        let seconds = Int(ProcessInfo.processInfo.environment["BACKSTOP_FLEET_SECONDS"] ?? "") ?? 60
        let fleet = try await startFleet(count: 8, postgres: true, lifetime: 2, refreshAhead: "1s")
        var failure: (any Error)?
        do {
            let statuses = try await load(fleet, clients: 16, duration: .seconds(seconds), revokeEvery: .seconds(7))
            let total = statuses.values.reduce(0, +)
            #expect(total > seconds * 50, "enough traffic: \(statuses)")
            #expect(statuses.keys.sorted() == [200], "every client request succeeds: \(statuses)")
            let auth = fleet.auth
            #expect(auth.rejectedRefreshTokens == 0, "no refresh token was ever reused")
            #expect(!auth.familyRevoked)
            // Every grant is explained: at least half a token lifetime after the previous one (the earliest a
            // proactive refresh starts), or after a revocation.
            let grants = auth.grantTimes.sorted()
            let revocations = auth.revocationTimes
            var unexplained = 0
            for (previous, next) in zip(grants, grants.dropFirst()) {
                let revoked = revocations.contains { $0 > previous && $0 <= next }
                if next - previous < .milliseconds(900) && !revoked { unexplained += 1 }
            }
            #expect(unexplained == 0, "grants closer than half a lifetime without a revocation: \(unexplained)")
            #expect(grants.count <= seconds + revocations.count + 2, "grants \(grants.count) for \(seconds) s")
            #expect(grants.count >= seconds / 2, "tokens were refreshed all along: \(grants.count)")
            var fetched = 0
            for (index, ports) in fleet.ports.enumerated() {
                let counts = try await refreshes(ports.admin)
                fetched += counts["success"] ?? 0
                #expect((counts["adopted"] ?? 0) > 0, "daemon \(index) adopted tokens others fetched: \(counts)")
                #expect((counts["failure"] ?? 0) == 0, "daemon \(index): \(counts)")
            }
            #expect(fetched == auth.tokenCalls, "each grant was fetched by exactly one daemon")
            var adopted: [Int] = []
            for ports in fleet.ports { adopted.append(try await refreshes(ports.admin)["adopted"] ?? 0) }
            print(
                "fleet: \(seconds) s, \(total) requests \(statuses), \(grants.count) grants, "
                    + "\(revocations.count) revocations, fetched per daemon total \(fetched), adopted per daemon \(adopted), "
                    + "reused refresh tokens \(auth.rejectedRefreshTokens)")
        } catch {
            failure = error
        }
        await stop(fleet)
        if let failure { throw failure }
    }

    @Test(
        "the same fleet on 8 separate keychains reuses the refresh token, and the endpoint revokes the family: the failure the shared store prevents"
    )
    func separateKeychainsReuse() async throws {
        let fleet = try await startFleet(count: 8, postgres: false, lifetime: 2, refreshAhead: "1s", seedEach: true)
        var failure: (any Error)?
        do {
            let statuses = try await load(fleet, clients: 16, duration: .seconds(4), revokeEvery: nil)
            #expect(fleet.auth.rejectedRefreshTokens > 0, "a second daemon used the rotated-out refresh token")
            #expect(fleet.auth.familyRevoked)
            #expect(statuses.keys.contains { $0 != 200 }, "clients saw the outage: \(statuses)")
        } catch {
            failure = error
        }
        await stop(fleet)
        if let failure { throw failure }
    }

    @Test(
        "PostgreSQL restarted under load: no request fails while tokens are valid, and a refresh works again after; the request path sends nothing to the database while the token is valid"
    )
    func databaseRestart() async throws {
        let fleet = try await startFleet(count: 2, postgres: true, lifetime: 60, refreshAhead: "5s")
        var failure: (any Error)?
        do {
            let pg = try #require(fleet.pg)
            let warm = try await load(fleet, clients: 2, duration: .milliseconds(500), revokeEvery: nil)
            #expect(warm.keys.sorted() == [200])
            // Let the pool's start-up work and the listeners settle, then count what 2,000 requests cost the database.
            try await Task.sleep(for: .milliseconds(500))
            // Every statement the daemons send is in the server's log (log_statement=all): count those between two
            // marks around the requests. The pool's keep-alive pings of idle connections are not the request path.
            try await pg.mark("cost-start")
            let requests = Int(ProcessInfo.processInfo.environment["BACKSTOP_FLEET_COST_REQUESTS"] ?? "") ?? 2_000
            var served = 0
            while served < requests {
                let response = try await RawHTTP.exchange(
                    port: fleet.ports[served % 2].proxy,
                    request: RawHTTP.request("GET", "http://api.test/n", host: "api.test"),
                    timeout: .seconds(5))
                #expect(response.status == 200)
                served += 1
            }
            try await pg.mark("cost-end")
            let sent = pg.statements(by: pg.user, between: "cost-start", and: "cost-end")
            let pings = sent.filter { $0.hasSuffix("SELECT 1;") || $0.hasSuffix("SELECT 1") }
            print(
                "statements sent to the database during \(requests) requests with a valid token: \(sent.count) "
                    + "(\(pings.count) pool keep-alive pings)")
            #expect(
                sent.count == pings.count,
                "the request path never touches the database while the token is valid: \(sent)")

            let underLoad = Task { try await load(fleet, clients: 4, duration: .seconds(4), revokeEvery: nil) }
            try await Task.sleep(for: .seconds(1))
            try await pg.restart()
            let statuses = try await underLoad.value
            #expect(statuses.keys.sorted() == [200], "valid tokens keep serving through the restart: \(statuses)")

            let grantsBefore = fleet.auth.grantTimes.count
            fleet.auth.revokeAllAccessTokens()
            let deadline = ContinuousClock.now + .seconds(20)
            var status = 0
            while ContinuousClock.now < deadline && status != 200 {
                status = try await RawHTTP.exchange(
                    port: fleet.ports[0].proxy, request: RawHTTP.request("GET", "http://api.test/r", host: "api.test"),
                    timeout: .seconds(20)
                ).status
                if status != 200 { try await Task.sleep(for: .milliseconds(500)) }
            }
            #expect(status == 200, "the refresh works once the database is back")
            #expect(fleet.auth.grantTimes.count > grantsBefore)
            #expect(fleet.auth.rejectedRefreshTokens == 0)
        } catch {
            failure = error
        }
        await stop(fleet)
        if let failure { throw failure }
    }

    @Test(
        "a daemon killed (-9) while it holds the refresh lock: the lock goes with its connection and another daemon completes the refresh, with no reuse"
    )
    func killedHolder() async throws {
        let fleet = try await startFleet(count: 2, postgres: true, lifetime: 60, refreshAhead: "5s")
        var failure: (any Error)?
        do {
            let warm = try await load(fleet, clients: 2, duration: .milliseconds(300), revokeEvery: nil)
            #expect(warm.keys.sorted() == [200])
            let auth = fleet.auth
            let callsBefore = auth.tokenCalls
            auth.update { $0.holdCalls = true }
            auth.revokeAllAccessTokens()
            // Daemon 0 gets a 401, takes the lock and calls the endpoint, which does not answer.
            let stuck = Task {
                try? await RawHTTP.exchange(
                    port: fleet.ports[0].proxy, request: RawHTTP.request("GET", "http://api.test/k", host: "api.test"),
                    timeout: .seconds(30))
            }
            _ = await Poll.holds(within: .seconds(10), every: .milliseconds(20)) { auth.heldCalls > 0 }
            #expect(auth.heldCalls == 1)
            kill(fleet.daemons[0].pid, SIGKILL)
            _ = await stuck.value
            auth.update { $0.holdCalls = false }
            let response = try await RawHTTP.exchange(
                port: fleet.ports[1].proxy, request: RawHTTP.request("GET", "http://api.test/after", host: "api.test"),
                timeout: .seconds(30))
            #expect(response.status == 200, "\(response.bodyString)")
            #expect(auth.tokenCalls == callsBefore + 1, "one refresh, by the survivor")
            #expect(auth.rejectedRefreshTokens == 0)
            #expect(!auth.familyRevoked)
        } catch {
            failure = error
        }
        await stop(fleet)
        if let failure { throw failure }
    }

    @Test("a tampered row: the refresh fails with a clear error naming the cause, the daemon keeps running, no crash")
    func tamperedRow() async throws {
        let fleet = try await startFleet(count: 1, postgres: true, lifetime: 60, refreshAhead: "5s")
        var failure: (any Error)?
        do {
            let pg = try #require(fleet.pg)
            let warm = try await load(fleet, clients: 1, duration: .milliseconds(200), revokeEvery: nil)
            #expect(warm.keys.sorted() == [200])
            try await pg.psql("UPDATE backstop_tokens SET sealed = overlay(sealed placing '\\x00'::bytea from 20)")
            fleet.auth.revokeAllAccessTokens()
            let response = try await RawHTTP.exchange(
                port: fleet.ports[0].proxy, request: RawHTTP.request("GET", "http://api.test/t", host: "api.test"),
                timeout: .seconds(20))
            #expect(response.status == 401)
            #expect(response.header("X-Backstop-Error") == "token-refresh-failed")
            try await fleet.daemons[0].waitForOutput(timeout: .seconds(5)) {
                $0.contains("token store record unreadable")
            }
            #expect(fleet.daemons[0].output.contains("cannot be opened with this keychain key"))
            #expect(fleet.daemons[0].isRunning)
            let dump = try await pg.psql("SELECT encode(sealed, 'hex') FROM backstop_tokens")
            #expect(!dump.isEmpty)
        } catch {
            failure = error
        }
        await stop(fleet)
        if let failure { throw failure }
    }

    @Test(
        "refresh latency through each store, as the token manager sees it (printed for the record; every refresh must succeed)"
    )
    func refreshLatency() async throws {
        for postgres in [false, true] {
            let fleet = try await startFleet(
                count: 1, postgres: postgres, lifetime: 600, refreshAhead: "5s", seedEach: !postgres)
            var failure: (any Error)?
            do {
                var times: [Duration] = []
                for round in 0..<40 {
                    fleet.auth.revokeAllAccessTokens()
                    let started = ContinuousClock.now
                    let response = try await RawHTTP.exchange(
                        port: fleet.ports[0].proxy,
                        request: RawHTTP.request("GET", "http://api.test/l\(round)", host: "api.test"),
                        timeout: .seconds(10))
                    // The first round fetches the first token; every later one is 401 → refresh → replay.
                    if round > 0 { times.append(ContinuousClock.now - started) }
                    #expect(response.status == 200)
                }
                let sorted = times.sorted()
                print(
                    "refresh round trip (401, refresh, replay) with the \(postgres ? "postgres" : "keychain") store: "
                        + "median \(sorted[sorted.count / 2]), p90 \(sorted[sorted.count * 9 / 10]) over \(sorted.count)"
                )
                #expect(fleet.auth.tokenCalls == 40)
            } catch {
                failure = error
            }
            await stop(fleet)
            if let failure { throw failure }
        }
    }

    @Test(
        "tokens list shows each store's state and never a token; check --online finds the table and its rights, and says what is missing"
    )
    func listAndOnlineCheck() async throws {
        let fleet = try await startFleet(count: 1, postgres: true, lifetime: 600, refreshAhead: "5s")
        var failure: (any Error)?
        do {
            let pg = try #require(fleet.pg)
            let config = fleet.directory + "/d0.yaml"
            let warm = try await load(fleet, clients: 1, duration: .milliseconds(200), revokeEvery: nil)
            #expect(warm.keys.sorted() == [200])
            let list = try await SpawnedProcess.run(binary, ["tokens", "list", "--config", config])
            #expect(list.status == 0, "\(list.standardError)")
            let fields = list.standardOutput.trimmingCharacters(in: .newlines).split(separator: "\t").map(String.init)
            #expect(fields.count == 9, "\(list.standardOutput)")
            #expect(fields.first == "api")
            #expect(fields.dropFirst().first?.hasPrefix("postgres postgres://backstop@127.0.0.1:") == true)
            #expect(Array(fields.dropFirst(2).prefix(2)) == ["present", "present"])
            #expect(fields.count == 9 && fields[6].hasPrefix("refreshed by "))
            // LAST_REFRESH is the write's time (LAST_WRITE), its outcome ok.
            #expect(fields.count == 9 && fields[7] == fields[5] && fields[8] == "ok", "\(list.standardOutput)")
            for secret in fleet.auth.issuedSecrets { #expect(!list.standardOutput.contains(secret)) }

            let online = try await SpawnedProcess.run(binary, ["check", "--online", "--config", config])
            #expect(online.status == 0, "\(online.standardOutput) \(online.standardError)")
            #expect(online.standardOutput == "ok\n")
            try await pg.psql("REVOKE UPDATE ON backstop_tokens FROM \(pg.user)")
            try await pg.psql("ALTER TABLE backstop_tokens OWNER TO postgres")
            let missing = try await SpawnedProcess.run(binary, ["check", "--online", "--config", config])
            #expect(missing.status == 1)
            #expect(
                missing.standardOutput.contains("lacks SELECT on table backstop_tokens"), "\(missing.standardOutput)")
            try await pg.pause()
            let down = try await SpawnedProcess.run(binary, ["check", "--online", "--config", config])
            #expect(down.status == 1)
            #expect(down.standardOutput.contains("cannot use postgres://backstop@127.0.0.1:"), "\(down.standardOutput)")
            #expect(!down.standardOutput.contains(pg.password))
            try await pg.resume()
        } catch {
            failure = error
        }
        await stop(fleet)
        if let failure { throw failure }
    }
}
