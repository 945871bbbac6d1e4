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
    /// The daemon idle after the warm-up run, and idle after the main run.
    let baseline: ProcessProbe.Sample
    let end: ProcessProbe.Sample
    let alive: Bool
    let exitStatus: Int32?
    let secretsLogged: Int
    let secretsChecked: Int
    let logLines: Int

    /// Idle against idle: descriptors other than upstream connections may differ by two (a token refresh holding
    /// the keychain lock at that moment); memory by a quarter or 8 MiB, whichever is larger (allocator caches).
    static func withinMargins(baseline: ProcessProbe.Sample, end: ProcessProbe.Sample) -> Bool {
        end.ownFds >= 0 && baseline.ownFds >= 0 && end.ownFds <= baseline.ownFds + 2
            && end.rssKiB >= 0 && baseline.rssKiB >= 0
            && end.rssKiB <= baseline.rssKiB + max(baseline.rssKiB / 4, 8 * 1024)
    }

    var seconds: Double { Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18 }

    /// A proactive refresh comes at `lifetime − refresh_ahead − jitter` (jitter ≤ refresh_ahead / 5) after a grant,
    /// an expiry-driven one later: a grant sooner than this after the previous one needs a revocation in between.
    static var expiryGap: Duration {
        .seconds(SoakCommand.tokenLifetime) - .seconds(SoakCommand.refreshAhead) * 1.2 - .milliseconds(20)
    }

    /// Each grant after the first, by what made it necessary: the previous token neared its expiry, a revocation
    /// came after the previous grant, or nothing did (a stampede or a wasted refresh).
    var grantCauses: (expiry: Int, revocation: Int, unjustified: Int) {
        var causes = (expiry: 0, revocation: 0, unjustified: 0)
        for (previous, grant) in zip(grants, grants.dropFirst()) {
            if revocations.contains(where: { $0 > previous && $0 <= grant }) {
                causes.revocation += 1
            } else if grant - previous >= Self.expiryGap {
                causes.expiry += 1
            } else {
                causes.unjustified += 1
            }
        }
        return causes
    }

    /// Ids of POST/PATCH requests without an idempotency key that the origin acted on more than once, or that
    /// reached it more than twice in all. A connect failure never reaches the origin, and a 401 is a refusal that
    /// docs/reference/behaviour.md replays once with the refreshed token: so one refusal plus one processed attempt is the most.
    var duplicatedUnkeyed: Int {
        chaos.unkeyed.filter {
            let processed = chaos.attempts[$0] ?? 0
            return processed > 1 || processed + (chaos.refused[$0] ?? 0) > 2
        }.count
    }

    /// What the run must have exercised for its other checks to mean anything (empty when all of it happened).
    var notExercised: [String] {
        var missing: [String] = []
        if clientRequests == 0 { missing.append("no client request") }
        let successes = load.statuses.filter { (200..<300).contains($0.key) }.values.reduce(0, +)
        if successes * 2 < responses || responses == 0 { missing.append("fewer than half the responses were 2xx") }
        for fault in ChaosOrigin.Fault.allCases where (chaos.faults[fault] ?? 0) == 0 {
            missing.append("no \(fault.rawValue) from the origin")
        }
        if chaos.unkeyed.isEmpty { missing.append("no unkeyed POST") }
        if load.keyedPosts == 0 { missing.append("no POST with Idempotency-Key") }
        if load.abandoned == 0 { missing.append("no client disconnect") }
        if failedTokenCalls == 0 { missing.append("no failed token call") }
        if revocations.isEmpty { missing.append("no revocation") }
        if logLines == 0 { missing.append("no daemon log line") }
        return missing
    }

    var originAttempts: Int { chaos.attemptTotal + chaos.refusedTotal }

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
        let faults = ChaosOrigin.Fault.allCases.map { "\($0.rawValue) \(chaos.faults[$0] ?? 0)" }.joined(
            separator: ", ")
        let attempts = originAttempts
        let causes = grantCauses
        let missing = notExercised
        return [
            Check(
                name: "traffic and faults exercised", value: missing.isEmpty ? "all" : missing.joined(separator: "; "),
                passed: missing.isEmpty),
            Check(
                name: "client requests",
                value: "\(clientRequests) (\(requests); \(load.keyedPosts) POST with Idempotency-Key)", passed: nil),
            Check(
                name: "responses (by status)",
                value: "\(responses) (\(statuses)); slowest head \(Self.format(load.slowestHead))", passed: nil),
            Check(name: "client disconnects (deliberate)", value: "\(load.abandoned)", passed: nil),
            Check(
                name: "lost (sent, never answered)",
                value: "\(load.lost + load.connectFailures) (connect failures \(load.connectFailures))",
                passed: load.lost + load.connectFailures == 0),
            Check(name: "hung past total + 1 s", value: "\(load.hung)", passed: load.hung == 0),
            Check(name: "answered twice", value: "\(load.extraResponses)", passed: load.extraResponses == 0),
            Check(
                name: "injected responses (a lying upstream's forged answer reaching a client)",
                value: "\(load.injected) (\(load.lies) honest-length answers from lying upstreams)",
                passed: load.injected == 0),
            Check(
                name: "bodies cut short or stalled", value: "\(load.truncated + load.stalledBodies)",
                passed: load.truncated + load.stalledBodies == 0),
            Check(name: "origin attempts (faults injected)", value: "\(attempts) (\(faults))", passed: nil),
            Check(
                name: "unkeyed POST reaching the origin twice", value: "\(duplicatedUnkeyed) of \(chaos.unkeyed.count)",
                passed: duplicatedUnkeyed == 0),
            Check(
                name: "token grants = first + expiries + revocations",
                value:
                    "\(grants.count) = 1 + \(causes.expiry) + \(causes.revocation), unjustified \(causes.unjustified) (\(revocations.count) revocations, \(failedTokenCalls) token calls failed with 503)",
                passed: grants.count >= 1 && causes.unjustified == 0),
            Check(
                name: "invalid_grant from a reused refresh token", value: "\(rejectedRefreshTokens)",
                passed: rejectedRefreshTokens == 0),
            Check(
                name: "daemon fds, idle after warm-up → idle at end (of which upstream connections)",
                value: "\(baseline.fds) (\(baseline.upstreamConnections)) → \(end.fds) (\(end.upstreamConnections))",
                passed: end.ownFds >= 0 && end.ownFds <= baseline.ownFds + 2
                    && end.upstreamConnections <= concurrency + 4),
            Check(
                name: "daemon RSS, idle after warm-up → idle at end",
                value: String(format: "%.1f → %.1f MiB", Double(baseline.rssKiB) / 1024, Double(end.rssKiB) / 1024),
                passed: Self.withinMargins(baseline: baseline, end: end)),
            Check(
                name: "daemon alive to the end, exit status on SIGTERM",
                value: "\(alive ? "yes" : "no"), \(exitStatus.map(String.init) ?? "none")",
                passed: alive && exitStatus == 0),
            Check(
                name: "secrets in the daemon log",
                value: "\(secretsLogged) of \(secretsChecked) values (\(logLines) lines)",
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
            "injected": load.injected,
            "truncated": load.truncated, "stalled": load.stalledBodies, "abandoned": load.abandoned,
            "faults": Dictionary(uniqueKeysWithValues: chaos.faults.map { ($0.key.rawValue, $0.value) }),
            "origin_attempts": originAttempts, "unkeyed_duplicated": duplicatedUnkeyed,
            "token_grants": grants.count, "grants_after_expiry": grantCauses.expiry,
            "grants_after_revocation": grantCauses.revocation, "grants_unjustified": grantCauses.unjustified,
            "token_calls_failed": failedTokenCalls, "revocations": revocations.count,
            "invalid_grant": rejectedRefreshTokens, "not_exercised": notExercised,
            "fds": ["baseline": baseline.fds, "end": end.fds],
            "upstream_connections": ["baseline": baseline.upstreamConnections, "end": end.upstreamConnections],
            "rss_kib": ["baseline": baseline.rssKiB, "end": end.rssKiB],
            "alive": alive, "exit_status": exitStatus.map { Int($0) } ?? -1, "secrets_logged": secretsLogged,
        ]
        let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])) ?? Data()
        return String(decoding: data, as: UTF8.self)
    }

    private static func format(_ d: Duration) -> String {
        String(format: "%.0f ms", Double(d.components.seconds) * 1000 + Double(d.components.attoseconds) / 1e15)
    }
}
