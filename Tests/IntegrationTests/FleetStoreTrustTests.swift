import BackstopKeychain
import BackstopTestSupport
import Foundation
import Testing

/// What a database role without the keychain key can still do to the PostgreSQL token store, against real daemons
/// and a real server (docs/reference/token-store.md#notifications, #row-versions): send notifications, put back an
/// older row; and what the operator sees when the database refuses or is down.
extension FleetTests {
    /// One request to daemon `index`; its status.
    func status(_ fleet: Fleet, _ index: Int = 0, path: String) async throws -> Int {
        try await RawHTTP.exchange(
            port: fleet.ports[index].proxy, request: RawHTTP.request("GET", "http://api.test\(path)", host: "api.test"),
            timeout: .seconds(20)
        ).status
    }

    /// `backstop_token_store_operations_total{store="postgres",operation="notify",result="ok"}` of one daemon.
    func notificationsReceived(_ fleet: Fleet, _ index: Int = 0) async throws -> Int {
        let text = try await RawHTTP.exchange(
            port: fleet.ports[index].admin, request: RawHTTP.request("GET", "/metrics", host: "a"), timeout: .seconds(5)
        ).bodyString
        let prefix = "backstop_token_store_operations_total{store=\"postgres\",operation=\"notify\",result=\"ok\"} "
        return text.split(separator: "\n").first { $0.hasPrefix(prefix) }.flatMap { Int($0.dropFirst(prefix.count)) }
            ?? 0
    }

    /// Sends requests to daemon 0 for `duration` (each on a new connection); returns their statuses.
    func requests(_ fleet: Fleet, for duration: Duration) async throws -> [Int] {
        let deadline = ContinuousClock.now + duration
        var statuses: [Int] = []
        while ContinuousClock.now < deadline {
            statuses.append(try await status(fleet, path: "/r\(statuses.count)"))
            try await Task.sleep(for: .milliseconds(50))
        }
        return statuses
    }

    /// Sends requests until the token endpoint has been called `calls` times (the hold-down ended and a new
    /// refresh failed); returns when that call was seen.
    func requestUntilTokenCalls(_ fleet: Fleet, reach calls: Int) async throws -> ContinuousClock.Instant {
        let deadline = ContinuousClock.now + .seconds(15)
        while fleet.auth.tokenCalls < calls && ContinuousClock.now < deadline {
            _ = try await status(fleet, path: "/wait")
            try await Task.sleep(for: .milliseconds(20))
        }
        try #require(fleet.auth.tokenCalls == calls, "the token endpoint was called again after the hold-down")
        return .now
    }

    @Test(
        "a role with no table rights sending NOTIFY does not end the refresh hold-down: token calls do not multiply; a seed still ends it at once"
    )
    func notificationsAreOnlyHints() async throws {
        let fleet = try await startFleet(count: 1, postgres: true, lifetime: 600, refreshAhead: "5s")
        var failure: (any Error)?
        do {
            let pg = try #require(fleet.pg)
            let auth = fleet.auth
            try await pg.psql("CREATE ROLE intruder LOGIN PASSWORD 'intruder'")
            await #expect(throws: (any Error).self, "the intruder cannot read the table") {
                try await pg.psql("SET ROLE intruder; SELECT count(*) FROM backstop_tokens")
            }
            // The grant is dead: every refresh is answered 400 invalid_grant.
            auth.update { $0.invalidGrant = true }

            // Baseline: 2 s of requests cost one token call (the first), then the 5-s hold-down fails them fast.
            let baselineStatuses = try await requests(fleet, for: .seconds(2))
            let baseline = auth.tokenCalls
            #expect(Set(baselineStatuses) == [502], "\(baselineStatuses)")
            #expect(baseline == 1)

            // The same 2 s, starting with the refresh that starts the next hold-down, while the intruder notifies.
            _ = try await requestUntilTokenCalls(fleet, reach: baseline + 1)
            let before = auth.tokenCalls
            let notifiedBefore = try await notificationsReceived(fleet)
            let spam = Task {
                let deadline = ContinuousClock.now + .seconds(2)
                var sent = 0
                while ContinuousClock.now < deadline {
                    try await pg.psql("SET ROLE intruder; NOTIFY backstop_tokens, 'api|\(1000 + sent)|attacker'")
                    sent += 1
                }
                return sent
            }
            let statuses = try await requests(fleet, for: .seconds(2))
            let sent = try await spam.value
            let during = auth.tokenCalls - before
            let notified = try await notificationsReceived(fleet) - notifiedBefore
            print(
                "intruder notifications: \(sent) sent, \(notified) received; token calls in 2 s: baseline \(baseline), "
                    + "with notifications \(1 + during)")
            #expect(notified > 5, "the daemon received the intruder's notifications (\(notified) of \(sent))")
            #expect(1 + during == baseline, "token calls in 2 s: \(1 + during) with notifications, \(baseline) without")
            #expect(Set(statuses) == [502], "\(statuses)")

            // A new sealed row (an operator's seed) still ends the hold-down at once, well before its 5 s.
            let started = try await requestUntilTokenCalls(fleet, reach: auth.tokenCalls + 1)
            auth.update { $0.invalidGrant = false }
            let seeded = try await SpawnedProcess.run(
                "/bin/sh",
                [
                    "-c",
                    "printf %s '\(auth.currentRefreshToken)' | '\(binary)' tokens seed api --config '\(fleet.directory)/d0.yaml'",
                ])
            #expect(seeded.status == 0, "\(seeded.standardError)")
            var fixed = 0
            while fixed != 200 && ContinuousClock.now - started < .seconds(4) {
                fixed = try await status(fleet, path: "/fixed")
                if fixed != 200 { try await Task.sleep(for: .milliseconds(50)) }
            }
            #expect(fixed == 200, "the seed ended the hold-down within \(ContinuousClock.now - started)")
            #expect(auth.rejectedRefreshTokens == 0)
        } catch {
            failure = error
        }
        await stop(fleet)
        if let failure { throw failure }
    }

    @Test(
        "a rolled-back row (an older sealed value restored) is never used: no token call with the spent refresh token, a warning naming both versions, also after a restart; tokens seed recovers"
    )
    func rolledBackRowIsRefused() async throws {
        var fleet = try await startFleet(count: 1, postgres: true, lifetime: 600, refreshAhead: "5s")
        var failure: (any Error)?
        do {
            let pg = try #require(fleet.pg)
            let auth = fleet.auth
            // The seeded row holds refresh-0; keep it, as a backup would.
            let backup = try await pg.psql("SELECT encode(sealed, 'hex') || '|' || version FROM backstop_tokens")
                .trimmingCharacters(in: .whitespacesAndNewlines).split(separator: "|").map(String.init)
            try #require(backup.count == 2)
            let seededVersion = try #require(Int64(backup[1]))
            // The first request spends refresh-0 (the endpoint rotates it) and stores the next version.
            #expect(try await status(fleet, path: "/warm") == 200)
            #expect(auth.tokenCalls == 1)
            let current = try await pg.psql("SELECT version FROM backstop_tokens").trimmingCharacters(
                in: .whitespacesAndNewlines)
            #expect(current == String(seededVersion + 1))

            // A restore puts the old row back (sealed value and version column), then the access token is revoked.
            try await pg.psql(
                "UPDATE backstop_tokens SET sealed = decode('\(backup[0])', 'hex'), version = \(seededVersion)")
            // A notification makes the daemon re-read the row: refused, the warning names the upstream to seed.
            _ = try await pg.psql("SELECT pg_notify('backstop_tokens', 'api|1|another-instance')")
            let notified = [
                "msg=\"token store row is older than one already seen; not used\"", "upstream=api", "prefix=api",
                "stored_version=\(seededVersion)", "tokens seed api\"",
            ]
            try await fleet.daemons[0].waitForOutput(timeout: .seconds(5)) { output in
                output.split(separator: "\n").contains { line in notified.allSatisfy { line.contains($0) } }
            }
            auth.revokeAllAccessTokens()
            let response = try await RawHTTP.exchange(
                port: fleet.ports[0].proxy, request: RawHTTP.request("GET", "http://api.test/after", host: "api.test"),
                timeout: .seconds(20))
            #expect(response.status == 401)
            #expect(response.header("X-Backstop-Error") == "token-refresh-failed")
            #expect(auth.tokenCalls == 1, "no token call with the spent refresh token")
            #expect(auth.rejectedRefreshTokens == 0)
            #expect(!auth.familyRevoked)
            let expected = [
                "msg=\"token store row is older than one already seen; not used\"", "upstream=api",
                "stored_version=\(seededVersion)", "seen_version=\(seededVersion + 1)", "level=warning",
            ]
            try await fleet.daemons[0].waitForOutput(timeout: .seconds(5)) { output in
                output.split(separator: "\n").contains { line in expected.allSatisfy { line.contains($0) } }
            }
            // The row is left for the operator, and the mark is in the keychain.
            let after = try await pg.psql("SELECT encode(sealed, 'hex') FROM backstop_tokens")
            #expect(after.trimmingCharacters(in: .whitespacesAndNewlines) == backup[0])
            let mark = try await SpawnedProcess.run(
                binary,
                [
                    "keychain", "get", "api/row_version", "--config", fleet.directory + "/d0.yaml",
                ])
            #expect(mark.standardOutput.trimmingCharacters(in: .whitespacesAndNewlines) == String(seededVersion + 1))

            // A restarted daemon remembers the version it saw: the old row is still refused.
            var log = fleet.daemons[0].output
            await fleet.daemons[0].stop()
            fleet.daemons[0] = try DaemonProcess.start(
                binary: binary, arguments: ["run", "--config", fleet.directory + "/d0.yaml"])
            try await fleet.daemons[0].waitUntilListening(port: fleet.ports[0].proxy)
            let restarted = try await status(fleet, path: "/restarted")
            #expect(restarted == 502)
            #expect(auth.tokenCalls == 1, "no token call after the restart either")
            try await fleet.daemons[0].waitForOutput(timeout: .seconds(5)) { output in
                output.split(separator: "\n").contains { line in expected.allSatisfy { line.contains($0) } }
            }

            // The operator seeds the current grant: every daemon accepts the seeded row, whatever it saw before.
            let seeded = try await SpawnedProcess.run(
                "/bin/sh",
                [
                    "-c",
                    "printf %s '\(auth.currentRefreshToken)' | '\(binary)' tokens seed api --config '\(fleet.directory)/d0.yaml'",
                ])
            #expect(seeded.status == 0, "\(seeded.standardError)")
            let deadline = ContinuousClock.now + .seconds(10)
            var recovered = 0
            while recovered != 200 && ContinuousClock.now < deadline {
                recovered = try await status(fleet, path: "/recovered")
                if recovered != 200 { try await Task.sleep(for: .milliseconds(100)) }
            }
            #expect(recovered == 200)
            #expect(auth.tokenCalls == 2)
            #expect(auth.rejectedRefreshTokens == 0)
            log += fleet.daemons[0].output
            for secret in auth.issuedSecrets { #expect(!log.contains(secret), "no token in the log") }
        } catch {
            failure = error
        }
        await stop(fleet)
        if let failure { throw failure }
    }

    @Test(
        "a wrong database password: check --online and tokens list name the server's answer (28P01); with the database down, tokens list says 'token store unavailable' once"
    )
    func serverAnswersArePassedThrough() async throws {
        let fleet = try await startFleet(count: 1, postgres: true, lifetime: 600, refreshAhead: "5s")
        var failure: (any Error)?
        do {
            let pg = try #require(fleet.pg)
            let config = fleet.directory + "/d0.yaml"
            let opened = try KeychainBootstrap.open(
                path: fleet.directory + "/kc0.bkc", key: .file(path: fleet.directory + "/keychain.key"))
            try opened.keychain.set("postgres/password", value: Array("not-the-password".utf8))

            let check = try await SpawnedProcess.run(binary, ["check", "--online", "--config", config])
            #expect(check.status == 1)
            #expect(check.standardOutput.contains("28P01"), "\(check.standardOutput)")
            #expect(check.standardOutput.contains("password authentication failed"), "\(check.standardOutput)")
            #expect(!check.standardOutput.contains("not-the-password"))
            let list = try await SpawnedProcess.run(binary, ["tokens", "list", "--config", config])
            #expect(list.status == 1)
            #expect(list.standardError.contains("28P01"), "\(list.standardError)")
            #expect(
                list.standardError.components(separatedBy: "token store unavailable").count == 2,
                "said once: \(list.standardError)")

            try opened.keychain.set("postgres/password", value: Array(pg.password.utf8))
            try await pg.pause()
            let down = try await SpawnedProcess.run(binary, ["tokens", "list", "--config", config])
            #expect(down.status == 1)
            #expect(
                down.standardError.components(separatedBy: "token store unavailable").count == 2,
                "said once: \(down.standardError)")
            #expect(down.standardError.contains("no connection within 5.0 seconds"), "\(down.standardError)")
            let seed = try await SpawnedProcess.run(
                "/bin/sh", ["-c", "printf x | '\(binary)' tokens seed api --config '\(config)'"])
            #expect(seed.status == 1)
            #expect(
                seed.standardError.components(separatedBy: "token store").count == 2, "said once: \(seed.standardError)"
            )
            try await pg.resume()
        } catch {
            failure = error
        }
        await stop(fleet)
        if let failure { throw failure }
    }
}
