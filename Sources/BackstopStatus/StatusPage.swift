import BackstopCore
import Crypto
import Foundation

/// `/status`: the snapshot as one self-contained HTML page for people (docs/reference/operations.md#status-page).
/// No script, no external asset; one inline style block whose hash is the only style the Content-Security-Policy
/// allows. Every string from the config or from a failure is HTML-escaped.
public enum StatusPage {
    /// How often the page reloads itself (`<meta http-equiv="refresh">`), in seconds.
    public static let refreshSeconds = 10

    static let style = """
        body{font:14px/1.4 system-ui,sans-serif;margin:1.5rem;color:#1b1b1b;background:#fff}
        h1{font-size:1.4rem;margin:0 0 .3rem}h2{font-size:1.1rem;margin:1.6rem 0 .4rem}
        table{border-collapse:collapse;margin:.3rem 0 1rem;min-width:40rem}
        caption{text-align:left;font-weight:600;padding:.3rem 0}
        th,td{border:1px solid #c8c8c8;padding:.25rem .6rem;text-align:left;vertical-align:top}
        thead th{background:#f0f0f0}th[scope=row]{white-space:nowrap}td.n{text-align:right;font-variant-numeric:tabular-nums}
        .ok{color:#0a6b2c}.bad{color:#a3140c;font-weight:600}.warn{color:#8a5a00}
        dl{display:grid;grid-template-columns:max-content auto;gap:.1rem 1rem;margin:.5rem 0}dt{font-weight:600}dd{margin:0}
        """

    /// The page's response headers' policy: nothing may load, only the page's own style block applies.
    public static let contentSecurityPolicy: String = {
        let digest = SHA256.hash(data: Array(style.utf8))
        let hash = Data(digest).base64EncodedString()
        return "default-src 'none'; style-src 'sha256-\(hash)'; base-uri 'none'; form-action 'none'; "
            + "frame-ancestors 'none'"
    }()

    public static func render(_ s: StatusSnapshot) -> String {
        var h = ""
        h.reserveCapacity(8192 + s.failures.count * 200)
        h += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        h += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        h += "<meta http-equiv=\"refresh\" content=\"\(refreshSeconds)\">\n"
        h += "<title>Backstop status</title>\n<style>\(style)</style>\n</head>\n<body>\n<main>\n"
        h += "<h1>Backstop status</h1>\n"
        h += "<p>Taken \(escape(formatTime(s.generatedAt))); rates cover the last \(s.windowSeconds) s. "
        h += "This page reloads every \(refreshSeconds) s; the same facts are at "
        h += "<a href=\"status.json\">status.json</a>.</p>\n"
        h += "<dl id=\"summary\">\n"
        h += "<dt>Version</dt><dd>\(escape(s.version))</dd>\n"
        h += "<dt>Up for</dt><dd>\(escape(formatDuration(s.uptimeSeconds)))</dd>\n"
        let readiness =
            s.draining
            ? "<span class=\"warn\">draining</span>"
            : s.ready ? "<span class=\"ok\">ready</span>" : "<span class=\"bad\">not ready</span>"
        h += "<dt>State</dt><dd>\(readiness)</dd>\n"
        h += "<dt>Requests in flight</dt><dd>\(s.inflightRequests)</dd>\n"
        h += "<dt>Client connections</dt><dd>\(s.clientConnections)</dd>\n"
        h += "<dt>Tunnels open</dt><dd>\(s.tunnelsOpen)</dd>\n"
        if let t = s.tracing {
            h += "<dt>Tracing</dt><dd>to \(escape(t.endpoint)), sample ratio \(formatNumber(t.sampleRatio)); "
            h += "\(t.exported) spans exported, \(t.dropped) dropped, \(t.queued) queued</dd>\n"
        } else {
            h += "<dt>Tracing</dt><dd>off</dd>\n"
        }
        h += "</dl>\n"
        upstreams(s, into: &h)
        endpoints(s, into: &h)
        tokens(s, into: &h)
        failures(s, into: &h)
        h += "</main>\n</body>\n</html>\n"
        return h
    }

    static func upstreams(_ s: StatusSnapshot, into h: inout String) {
        h += "<h2 id=\"upstreams-heading\">Upstreams</h2>\n"
        openTable(
            "upstreams", caption: "Traffic of the last \(s.windowSeconds) s, retry budget and circuit per upstream",
            columns: [
                "Upstream", "Requests/s", "Success ratio", "Attempts/request", "Retry budget left",
                "Budget exhausted (total)", "Circuit",
            ], into: &h)
        if s.upstreams.isEmpty {
            h += "<tr><td colspan=\"7\">No upstream is configured.</td></tr>\n"
        }
        for u in s.upstreams {
            let name = escape(u.name)
            h += "<tr data-upstream=\"\(name)\"><th scope=\"row\">\(name)</th>"
            h += "<td class=\"n\">\(formatNumber(u.requestsPerSecond))</td>"
            h += "<td class=\"n\">\(u.successRatio.map(formatPercent) ?? "–")</td>"
            h += "<td class=\"n\">\(u.attemptsPerRequest.map(formatNumber) ?? "–")</td>"
            h += "<td class=\"n\">\(u.retryBudget.retriesLeft)</td>"
            h += "<td class=\"n\">\(u.retryBudget.exhaustedTotal)</td>"
            let circuitClass = u.circuit == .closed ? "ok" : u.circuit == .open ? "bad" : "warn"
            h += "<td class=\"\(circuitClass)\">\(u.circuit.rawValue)</td></tr>\n"
        }
        h += "</tbody>\n</table>\n"
    }

    static func endpoints(_ s: StatusSnapshot, into h: inout String) {
        h += "<h2 id=\"endpoints-heading\">Endpoints</h2>\n"
        openTable(
            "endpoints", caption: "Every endpoint of every upstream and whether it takes requests",
            columns: ["Upstream", "Endpoint", "State", "Consecutive failures", "Next probe in"], into: &h)
        for u in s.upstreams {
            for e in u.endpoints {
                let stateClass = e.state == .healthy ? "ok" : e.state == .ejected ? "bad" : "warn"
                h += "<tr data-upstream=\"\(escape(u.name))\" data-endpoint-state=\"\(e.state.rawValue)\">"
                h += "<th scope=\"row\">\(escape(u.name))</th><td>\(escape(e.url))</td>"
                h += "<td class=\"\(stateClass)\">\(e.state.rawValue)</td>"
                h += "<td class=\"n\">\(e.consecutiveFailures.map { String($0) } ?? "–")</td>"
                h += "<td>\(e.probeInSeconds.map { escape(formatDuration($0)) } ?? "–")</td></tr>\n"
            }
        }
        h += "</tbody>\n</table>\n"
    }

    static func tokens(_ s: StatusSnapshot, into h: inout String) {
        let managed = s.upstreams.filter { $0.token != nil }
        h += "<h2 id=\"tokens-heading\">Tokens</h2>\n"
        guard !managed.isEmpty else {
            h += "<p id=\"tokens\">No upstream has managed auth.</p>\n"
            return
        }
        openTable(
            "tokens", caption: "Credentials Backstop injects (their state only, never their value)",
            columns: ["Upstream", "Kind", "Present", "Expires in", "Last refresh"], into: &h)
        for u in managed {
            guard let t = u.token else { continue }
            h += "<tr data-upstream=\"\(escape(u.name))\"><th scope=\"row\">\(escape(u.name))</th>"
            h += "<td>\(escape(t.kind))</td>"
            h += t.present ? "<td class=\"ok\">yes</td>" : "<td class=\"bad\">no</td>"
            if let expires = t.expiresInSeconds {
                h +=
                    expires <= 0
                    ? "<td class=\"bad\">expired \(escape(formatDuration(-expires))) ago</td>"
                    : "<td>\(escape(formatDuration(expires)))</td>"
            } else {
                h += "<td>–</td>"
            }
            if let r = t.lastRefresh {
                let cls = r.outcome == "failure" ? "bad" : "ok"
                h += "<td><span class=\"\(cls)\">\(escape(r.outcome))</span>, "
                h += "\(escape(formatDuration(max(0, s.generatedAt - r.at)))) ago</td></tr>\n"
            } else {
                h += "<td>none since start</td></tr>\n"
            }
        }
        h += "</tbody>\n</table>\n"
    }

    static func failures(_ s: StatusSnapshot, into h: inout String) {
        h += "<h2 id=\"failures-heading\">Recent failures</h2>\n"
        openTable(
            "failures", caption: "The last \(FailureLog.defaultCapacity) failed requests, newest first",
            columns: ["Time (UTC)", "Upstream", "Endpoint", "Status", "Cause"], into: &h)
        if s.failures.isEmpty { h += "<tr><td colspan=\"5\">No failure since start.</td></tr>\n" }
        for f in s.failures {
            h += "<tr data-upstream=\"\(escape(f.upstream))\"><th scope=\"row\">\(escape(formatTime(f.at)))</th>"
            h += "<td>\(escape(f.upstream))</td><td>\(escape(f.endpoint))</td><td class=\"n\">\(f.status)</td>"
            h += "<td>\(escape(f.cause))</td></tr>\n"
        }
        h += "</tbody>\n</table>\n"
    }

    /// A table labelled by the `<h2 id="ID-heading">` before it, with a caption and one column header per name
    /// (the caption and names are the page's own text, not escaped).
    static func openTable(_ id: String, caption: String, columns: [String], into h: inout String) {
        h += "<table id=\"\(id)\" aria-labelledby=\"\(id)-heading\">\n<caption>\(caption)</caption>\n<thead><tr>"
        for column in columns { h += "<th scope=\"col\">\(column)</th>" }
        h += "</tr></thead>\n<tbody>\n"
    }

    // MARK: formatting

    /// Text made safe for HTML content and quoted attribute values.
    public static func escape(_ text: String) -> String {
        var out = ""
        out.reserveCapacity(text.utf8.count)
        for scalar in text.unicodeScalars {
            switch scalar {
            case "&": out += "&amp;"
            case "<": out += "&lt;"
            case ">": out += "&gt;"
            case "\"": out += "&quot;"
            case "'": out += "&#39;"
            default:
                // Control characters would be invisible or break the layout; show them as U+FFFD.
                if scalar.value < 0x20 || scalar.value == 0x7F {
                    out += "\u{FFFD}"
                } else {
                    out.unicodeScalars.append(scalar)
                }
            }
        }
        return out
    }

    /// ISO 8601 in UTC, whole seconds (`2026-11-25T18:59:55Z`), as `keychain list` writes times.
    static func formatTime(_ epochSeconds: Double) -> String {
        guard epochSeconds.isFinite else { return "–" }
        return ISO8601Time.format(epochSeconds: epochSeconds)
    }

    /// `45s`, `12m 5s`, `3h 4m`, `2d 1h`.
    static func formatDuration(_ seconds: Double) -> String {
        guard seconds.isFinite else { return "–" }
        let s = Int64(seconds.rounded(.down))
        if s < 60 { return "\(max(0, s))s" }
        if s < 3600 { return "\(s / 60)m \(s % 60)s" }
        if s < 86_400 { return "\(s / 3600)h \(s / 60 % 60)m" }
        return "\(s / 86_400)d \(s / 3600 % 24)h"
    }

    /// At most two decimals, no trailing zeros (`12`, `0.5`, `1.25`).
    static func formatNumber(_ value: Double) -> String {
        guard value.isFinite else { return "–" }
        let hundredths = Int64((value * 100).rounded())
        let whole = hundredths / 100
        let fraction = abs(hundredths % 100)
        let sign = hundredths < 0 && whole == 0 ? "-" : ""
        if fraction == 0 { return "\(sign)\(whole)" }
        if fraction % 10 == 0 { return "\(sign)\(whole).\(fraction / 10)" }
        return "\(sign)\(whole).\(fraction < 10 ? "0" : "")\(fraction)"
    }

    /// `99.5%`.
    static func formatPercent(_ ratio: Double) -> String { formatNumber(ratio * 100) + "%" }
}
