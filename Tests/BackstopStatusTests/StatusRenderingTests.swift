import Foundation
import Testing

@testable import BackstopStatus

/// `/status` and `/status.json` from one snapshot: the same facts, every string escaped, accessible tables.
@Suite("Status page rendering")
struct StatusRenderingTests {
    static let hostile = "<script>alert('x')</script>&\"q\""

    static func snapshot(failures: [FailureRecord] = []) -> StatusSnapshot {
        StatusSnapshot(
            generatedAt: 1_800_000_000, version: "1.0.0", uptimeSeconds: 3725, ready: true, draining: false,
            inflightRequests: 3, clientConnections: 7, tunnelsOpen: 2, windowSeconds: 60,
            upstreams: [
                UpstreamStatus(
                    name: "api", requestsPerSecond: 12.5, successRatio: 0.995, attemptsPerRequest: 1.25,
                    retryBudget: RetryBudgetStatus(retriesLeft: 30, ratio: 0.2, minPerSecond: 10, exhaustedTotal: 4),
                    endpoints: [EndpointStatus(url: "https://api.test")],
                    token: TokenStatus(
                        kind: "oauth2", present: true, expiresInSeconds: 3540,
                        lastRefresh: RefreshStatus(at: 1_799_999_820, outcome: "success"))),
                UpstreamStatus(
                    name: "billing", requestsPerSecond: 0, successRatio: nil, attemptsPerRequest: nil,
                    retryBudget: RetryBudgetStatus(retriesLeft: 100, ratio: 0.2, minPerSecond: 10, exhaustedTotal: 0),
                    circuit: .open,
                    endpoints: [
                        EndpointStatus(
                            url: "https://eu.billing.test", state: .ejected, consecutiveFailures: 5,
                            probeInSeconds: 12),
                        EndpointStatus(url: "https://us.billing.test", state: .probing, consecutiveFailures: 5),
                    ],
                    token: TokenStatus(kind: "static", present: false)),
            ],
            tracing: TracingStatus(
                endpoint: "http://127.0.0.1:4318", sampleRatio: 0.5, exported: 10, dropped: 1, queued: 0),
            failures: failures)
    }

    @Test("every upstream, endpoint state, token and failure is on the page, in captioned tables with th scopes")
    func content() {
        let html = StatusPage.render(
            Self.snapshot(failures: [
                FailureRecord(
                    at: 1_800_000_000, upstream: "billing", endpoint: "https://eu.billing.test", status: 504,
                    cause: "upstream-timeout: per_try 10s")
            ]))
        #expect(html.hasPrefix("<!DOCTYPE html>\n<html lang=\"en\">"))
        #expect(html.contains("<meta http-equiv=\"refresh\" content=\"10\">"))
        #expect(
            html.contains(
                "<tr data-upstream=\"api\"><th scope=\"row\">api</th><td class=\"n\">12.5</td>"
                    + "<td class=\"n\">99.5%</td><td class=\"n\">1.25</td><td class=\"n\">30</td><td class=\"n\">4</td>"
                    + "<td class=\"ok\">closed</td></tr>"))
        #expect(html.contains("<td class=\"bad\">open</td>"))
        #expect(
            html.contains(
                "<tr data-upstream=\"billing\" data-endpoint-state=\"ejected\"><th scope=\"row\">billing</th>"
                    + "<td>https://eu.billing.test</td><td class=\"bad\">ejected</td><td class=\"n\">5</td><td>12s</td></tr>"
            ))
        #expect(html.contains("data-endpoint-state=\"probing\""))
        #expect(
            html.contains(
                "<td>oauth2</td><td class=\"ok\">yes</td><td>59m 0s</td>"
                    + "<td><span class=\"ok\">success</span>, 3m 0s ago</td>"))
        #expect(html.contains("<td>static</td><td class=\"bad\">no</td>"))
        #expect(
            html.contains(
                "<th scope=\"row\">2027-01-15T08:00:00Z</th><td>billing</td>"
                    + "<td>https://eu.billing.test</td><td class=\"n\">504</td><td>upstream-timeout: per_try 10s</td>"))
        #expect(html.contains("<dt>Up for</dt><dd>1h 2m</dd>"))
        #expect(html.contains("<dt>Tunnels open</dt><dd>2</dd>"))
        for id in ["upstreams", "endpoints", "tokens", "failures"] {
            #expect(html.contains("<table id=\"\(id)\" aria-labelledby=\"\(id)-heading\">\n<caption>"))
        }
        #expect(!html.contains("<script"))
        #expect(!html.contains("src=") && !html.contains("<link"))
    }

    @Test("no failure and no managed auth render as sentences, not empty tables")
    func empty() {
        var snapshot = Self.snapshot()
        snapshot.upstreams = snapshot.upstreams.map {
            var u = $0; u.token = nil; return u
        }
        let html = StatusPage.render(snapshot)
        #expect(html.contains("<tr><td colspan=\"5\">No failure since start.</td></tr>"))
        #expect(html.contains("<p id=\"tokens\">No upstream has managed auth.</p>"))
    }

    @Test("every string from config or failures is escaped, control characters included")
    func escaping() {
        var snapshot = Self.snapshot(failures: [
            FailureRecord(
                at: 0, upstream: Self.hostile, endpoint: "http://x/\"><img src=x>", status: 502,
                cause: "reset:\r\nSet-Cookie: a=b\u{7}")
        ])
        snapshot.upstreams[0].name = Self.hostile
        snapshot.version = "<b>"
        let html = StatusPage.render(snapshot)
        #expect(!html.contains("<script>alert"))
        #expect(!html.contains("<img"))
        #expect(!html.contains("<b>"))
        #expect(html.contains("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;q&quot;"))
        #expect(html.contains("data-upstream=\"&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;q&quot;\""))
        #expect(html.contains("reset:\u{FFFD}\u{FFFD}Set-Cookie: a=b\u{FFFD}"))
        #expect(StatusPage.escape("a&b<c>d\"e'f") == "a&amp;b&lt;c&gt;d&quot;e&#39;f")
    }

    @Test("the policy allows exactly the page's own style block, by hash")
    func contentSecurityPolicy() throws {
        let csp = StatusPage.contentSecurityPolicy
        #expect(csp.hasPrefix("default-src 'none'; style-src 'sha256-"))
        #expect(csp.hasSuffix("'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"))
        #expect(!csp.contains("unsafe"))
        let html = StatusPage.render(Self.snapshot())
        let start = try #require(html.range(of: "<style>")).upperBound
        let end = try #require(html.range(of: "</style>")).lowerBound
        #expect(String(html[start..<end]) == StatusPage.style)
        #expect(html.components(separatedBy: "<style>").count == 2)
        #expect(!html.contains("style=\""))
    }

    @Test("JSON carries the same facts with snake_case keys; unknown values are left out")
    func json() throws {
        let text = StatusJSON.render(
            Self.snapshot(failures: [
                FailureRecord(
                    at: 1_800_000_000, upstream: "billing", endpoint: "https://eu.billing.test", status: 503,
                    cause: "upstream answered 503")
            ]))
        let object = try #require(try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any])
        #expect(object["tunnels_open"] as? Int == 2)
        #expect(object["window_seconds"] as? Int == 60)
        let upstreams = try #require(object["upstreams"] as? [[String: Any]])
        #expect(upstreams.map { $0["name"] as? String } == ["api", "billing"])
        #expect(upstreams[0]["success_ratio"] as? Double == 0.995)
        #expect(upstreams[1]["success_ratio"] == nil)
        #expect(upstreams[1]["circuit"] as? String == "open")
        let endpoints = try #require(upstreams[1]["endpoints"] as? [[String: Any]])
        #expect(endpoints.map { $0["state"] as? String } == ["ejected", "probing"])
        let token = try #require(upstreams[0]["token"] as? [String: Any])
        #expect(token["present"] as? Bool == true)
        #expect((token["last_refresh"] as? [String: Any])?["outcome"] as? String == "success")
        let budget = try #require(upstreams[0]["retry_budget"] as? [String: Any])
        #expect(budget["retries_left"] as? Int == 30)
        let failures = try #require(object["failures"] as? [[String: Any]])
        #expect(failures.first?["cause"] as? String == "upstream answered 503")
        #expect((object["tracing"] as? [String: Any])?["dropped"] as? Int == 1)
    }

    @Test("times, durations and numbers are formatted for people")
    func formatting() {
        #expect(StatusPage.formatTime(0) == "1970-01-01T00:00:00Z")
        #expect(StatusPage.formatTime(951_782_400) == "2000-02-29T00:00:00Z")
        #expect(StatusPage.formatTime(1_800_000_000.9) == "2027-01-15T08:00:00Z")
        #expect(StatusPage.formatDuration(59.9) == "59s")
        #expect(StatusPage.formatDuration(3599) == "59m 59s")
        #expect(StatusPage.formatDuration(90_000) == "1d 1h")
        #expect(StatusPage.formatDuration(.infinity) == "–")
        #expect(StatusPage.formatNumber(0.5) == "0.5")
        #expect(StatusPage.formatNumber(1.256) == "1.26")
        #expect(StatusPage.formatNumber(1.05) == "1.05")
        #expect(StatusPage.formatNumber(3) == "3")
        #expect(StatusPage.formatPercent(1) == "100%")
    }
}

/// The failure ring and the activity window that feed the page.
@Suite("Status recording")
struct StatusRecordingTests {
    @Test("the failure log keeps the newest `capacity`, newest first, and counts every one")
    func failureRing() {
        let log = FailureLog(capacity: 3)
        #expect(log.recent.isEmpty)
        for n in 1...5 {
            log.record(FailureRecord(at: Double(n), upstream: "u", endpoint: "e", status: 502, cause: "c\(n)"))
        }
        #expect(log.recent.map(\.cause) == ["c5", "c4", "c3"])
        #expect(log.total == 5)
        log.record(FailureRecord(at: 6, upstream: "u", endpoint: "e", status: 502, cause: "c6"))
        #expect(log.recent.map(\.cause) == ["c6", "c5", "c4"])
        #expect(FailureLog().capacity == 50)
    }

    @Test("the activity window sums the last `seconds` seconds and forgets older buckets")
    func activityWindow() {
        var window = ActivityWindow(seconds: 10)
        #expect(window.rates(now: 100) == (0, nil, nil))
        window.record(second: 100, success: true, attempts: 1)
        window.record(second: 100, success: false, attempts: 3)
        window.record(second: 105, success: true, attempts: 2)
        let rates = window.rates(now: 105)
        #expect(rates.perSecond == 0.3)
        #expect(rates.successRatio == 2.0 / 3.0)
        #expect(rates.attemptsPerRequest == 2)
        #expect(window.totals(now: 109).requests == 3)
        #expect(window.totals(now: 110).requests == 1)  // second 100 left the window
        window.record(second: 110, success: true, attempts: 1)  // reuses second 100's bucket
        #expect(window.totals(now: 110) == (requests: 2, successes: 2, attempts: 3))
        #expect(window.totals(now: 200).requests == 0)
    }
}
