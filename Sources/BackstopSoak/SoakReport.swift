import Foundation

/// What a soak run measured, the checks it must pass, and how it prints (a Markdown table or JSON).
struct SoakReport {
    let duration: Duration
    let concurrency: Int
    let seed: UInt64
    let load: LoadGenerator.Stats
    let chaos: ChaosOrigin.Tally
    let grants: [ContinuousClock.Instant]
    let failedTokenCalls: Int
    let revocations: [ContinuousClock.Instant]
    let rejectedRefreshTokens: Int
    let warm: ProcessProbe.Sample
    let end: ProcessProbe.Sample
    let alive: Bool
    let exitStatus: Int32?
    let secretsLogged: Int
    let secretsChecked: Int
    let logLines: Int

    /// Descriptors may differ by a handful (an idle upstream connection more or less); memory by a quarter or
    /// 16 MiB, whichever is larger (allocator caches), but not grow with the run.
    static func withinMargins(warm: ProcessProbe.Sample, end: ProcessProbe.Sample) -> Bool {
        end.fds <= warm.fds + 8 && end.rssKiB <= warm.rssKiB + max(warm.rssKiB / 4, 16 * 1024)
    }

    /// Two token grants closer than this, with no revocation between them, are a refresh stampede.
    static let stampedeGap: Duration = .milliseconds(250)

    var seconds: Double { Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18 }

    /// Token grants the run can justify: the first fetch, one per token lifetime (a proactive refresh comes at
    /// `lifetime − refresh_ahead − jitter`, jitter ≤ refresh_ahead / 5), one per revocation, one in flight at the end.
    var grantLimit: Int {
        let perToken = Double(SoakCommand.tokenLifetime) - Double(SoakCommand.refreshAhead) * 1.2
        return 1 + Int((seconds / perToken).rounded(.up)) + revocations.count + 1
    }

    /// Pairs of grants closer than `stampedeGap` with no revocation in between.
    var stampedes: Int {
        var count = 0
        for (a, b) in zip(grants, grants.dropFirst()) where b - a < Self.stampedeGap {
            if !revocations.contains(where: { $0 > a && $0 <= b }) { count += 1 }
        }
        return count
    }

    /// Ids of POST/PATCH requests without an idempotency key that the origin acted on more than once. A connect
    /// failure never reaches the origin and a 401 is a refusal replayed by design (SPEC §3), so neither counts;
    /// any other repeat was a retry the spec forbids.
    var duplicatedUnkeyed: Int { chaos.unkeyed.filter { (chaos.attempts[$0] ?? 0) > 1 }.count }

    var originAttempts: Int { chaos.attempts.values.reduce(0, +) + chaos.refused.values.reduce(0, +) }

    var clientRequests: Int { load.requests.values.reduce(0, +) }
    var responses: Int { load.statuses.values.reduce(0, +) }

    struct Check {
        let name: String
        let value: String
        let passed: Bool?
    }

    var checks: [Check] {
        let requests = load.requests.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", ")
        let statuses = load.statuses.sorted { $0.key < $1.key }.map { "\($0.key): \($0.value)" }.joined(separator: ", ")
        let faults = ChaosOrigin.Fault.allCases.map { "\($0.rawValue) \(chaos.faults[$0] ?? 0)" }.joined(separator: ", ")
        let attempts = originAttempts
        return [
            Check(name: "client requests", value: "\(clientRequests) (\(requests); \(load.keyedPosts) POST with Idempotency-Key)", passed: nil),
            Check(name: "responses (by status)", value: "\(responses) (\(statuses)); slowest head \(Self.format(load.slowestHead))", passed: nil),
            Check(name: "client disconnects (deliberate)", value: "\(load.abandoned)", passed: nil),
            Check(name: "lost (sent, never answered)", value: "\(load.lost + load.connectFailures) (connect failures \(load.connectFailures))",
                  passed: load.lost + load.connectFailures == 0),
            Check(name: "hung past total + 1 s", value: "\(load.hung)", passed: load.hung == 0),
            Check(name: "answered twice", value: "\(load.extraResponses)", passed: load.extraResponses == 0),
            Check(name: "bodies cut short or stalled", value: "\(load.truncated + load.stalledBodies)",
                  passed: load.truncated + load.stalledBodies == 0),
            Check(name: "origin attempts (faults injected)", value: "\(attempts) (\(faults))", passed: nil),
            Check(name: "unkeyed POST reaching the origin twice", value: "\(duplicatedUnkeyed) of \(chaos.unkeyed.count)",
                  passed: duplicatedUnkeyed == 0),
            Check(name: "token grants (limit: expiries + revocations)",
                  value: "\(grants.count) ≤ \(grantLimit) (\(revocations.count) revocations, \(failedTokenCalls) token calls failed with 503)",
                  passed: grants.count >= 1 && grants.count <= grantLimit),
            Check(name: "refresh stampedes (grants < 250 ms apart)", value: "\(stampedes)", passed: stampedes == 0),
            Check(name: "invalid_grant from a reused refresh token", value: "\(rejectedRefreshTokens)", passed: rejectedRefreshTokens == 0),
            Check(name: "daemon fds after warm-up → end", value: "\(warm.fds) → \(end.fds)", passed: end.fds >= 0 && end.fds <= warm.fds + 8),
            Check(name: "daemon RSS after warm-up → end",
                  value: String(format: "%.1f → %.1f MiB", Double(warm.rssKiB) / 1024, Double(end.rssKiB) / 1024),
                  passed: Self.withinMargins(warm: warm, end: end)),
            Check(name: "daemon alive to the end, exit status on SIGTERM", value: "\(alive ? "yes" : "no"), \(exitStatus.map(String.init) ?? "none")",
                  passed: alive && exitStatus == 0),
            Check(name: "secrets in the daemon log", value: "\(secretsLogged) of \(secretsChecked) values (\(logLines) lines)",
                  passed: secretsLogged == 0),
        ]
    }

    var passed: Bool { checks.allSatisfy { $0.passed != false } }

    func table() -> String {
        var out = String(format: "# Backstop chaos soak: %.0f s, %d clients, seed %llu\n\n", seconds, concurrency, seed)
        out += "| measure | value | check |\n|---|---|---|\n"
        for check in checks {
            let verdict = check.passed.map { $0 ? "pass" : "**FAIL**" } ?? "–"
            out += "| \(check.name) | \(check.value) | \(verdict) |\n"
        }
        out += "\n\(passed ? "All checks passed." : "Some checks FAILED.")\n"
        if !load.samples.isEmpty {
            out += "\nFirst client-side errors:\n" + load.samples.map { "- \($0)" }.joined(separator: "\n") + "\n"
        }
        return out
    }

    func json() -> String {
        let object: [String: Any] = [
            "duration_s": seconds, "concurrency": concurrency, "seed": seed, "passed": passed,
            "requests": load.requests, "responses": responses,
            "statuses": Dictionary(uniqueKeysWithValues: load.statuses.map { (String($0.key), $0.value) }),
            "lost": load.lost + load.connectFailures, "hung": load.hung, "answered_twice": load.extraResponses,
            "truncated": load.truncated, "stalled": load.stalledBodies, "abandoned": load.abandoned,
            "faults": Dictionary(uniqueKeysWithValues: chaos.faults.map { ($0.key.rawValue, $0.value) }),
            "origin_attempts": originAttempts, "unkeyed_duplicated": duplicatedUnkeyed,
            "token_grants": grants.count, "token_grant_limit": grantLimit, "token_calls_failed": failedTokenCalls,
            "revocations": revocations.count, "stampedes": stampedes, "invalid_grant": rejectedRefreshTokens,
            "fds": ["warm": warm.fds, "end": end.fds], "rss_kib": ["warm": warm.rssKiB, "end": end.rssKiB],
            "alive": alive, "exit_status": exitStatus.map { Int($0) } ?? -1, "secrets_logged": secretsLogged,
        ]
        let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])) ?? Data()
        return String(decoding: data, as: UTF8.self)
    }

    private static func format(_ d: Duration) -> String {
        String(format: "%.0f ms", Double(d.components.seconds) * 1000 + Double(d.components.attoseconds) / 1e15)
    }
}
