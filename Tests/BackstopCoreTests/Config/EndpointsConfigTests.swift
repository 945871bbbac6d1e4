import BackstopCore
import Testing

private let H = ConfigFixture.head

/// An upstream `a` matching `a.test` with `lines` (indented 4) and no url of its own.
private func E(_ lines: String) -> String {
    H + "upstreams:\n  - name: a\n    match: {hosts: [a.test]}\n"
        + lines.split(separator: "\n").map { "    " + $0 }.joined(separator: "\n") + "\n"
}

/// `endpoints`, `balance`, `circuit`, `hedge` and `retry.on_network_change` (docs/reference/config.md#endpoints).
@Suite("Config: endpoints, circuit, hedge")
struct EndpointsConfigTests {
    @Test("url: X is endpoints: [X], with the defaults of every new section")
    func urlIsOneEndpoint() throws {
        let upstream = try ConfigFixture.parse(ConfigFixture.upstream()).upstreams[0]
        let a = UpstreamURL(scheme: "http", host: "a.test")
        #expect(upstream.endpoints == [a])
        #expect(upstream.url == a)
        #expect(upstream.balance == .failover)
        #expect(upstream.circuit == CircuitConfig(failures: 5, openFor: .seconds(30), maxInflight: 1024))
        #expect(
            upstream.hedge
                == HedgeConfig(after: .fixed(.milliseconds(250)), max: 0, methods: ["GET", "HEAD", "OPTIONS"]))
        #expect(upstream.retry.onNetworkChange)
        #expect(try ConfigFixture.parse(E("endpoints: [http://a.test]")).upstreams[0] == upstream)
    }

    @Test("every setting read")
    func values() throws {
        let config = try ConfigFixture.parse(
            E(
                """
                endpoints:
                  - https://eu.api.test/v2
                  - "https://US.api.test:8443/v2/"
                  - https://[2001:db8::1]/v2
                balance: round_robin
                circuit: {failures: 0, open_for: 5m, max_inflight: 7}
                retry: {attempts: 4, on_network_change: false}
                hedge: {after: p95, max: 3, methods: [get, head, PUT]}
                """))
        let upstream = config.upstreams[0]
        #expect(
            upstream.endpoints == [
                UpstreamURL(scheme: "https", host: "eu.api.test", basePath: "/v2"),
                UpstreamURL(scheme: "https", host: "us.api.test", port: 8443, basePath: "/v2"),
                UpstreamURL(scheme: "https", host: "2001:db8::1", basePath: "/v2"),
            ])
        #expect(
            upstream.endpoints.map(\.endpointKey) == [
                "https://eu.api.test:443", "https://us.api.test:8443", "https://[2001:db8::1]:443",
            ])
        #expect(upstream.url == upstream.endpoints[0])
        #expect(upstream.balance == .roundRobin)
        #expect(upstream.circuit == CircuitConfig(failures: 0, openFor: .seconds(300), maxInflight: 7))
        #expect(upstream.hedge == HedgeConfig(after: .p95, max: 3, methods: ["GET", "HEAD", "PUT"]))
        #expect(!upstream.retry.onNetworkChange)
        let fixed = try ConfigFixture.parse(E("url: http://a.test\nhedge: {after: 40ms, max: 1}")).upstreams[0]
        #expect(fixed.hedge == HedgeConfig(after: .fixed(.milliseconds(40)), max: 1))
    }

    @Test("setting url replaces every endpoint")
    func urlSetter() {
        var upstream = UpstreamConfig(
            name: "a", match: MatchConfig(hosts: ["a"]),
            endpoints: [UpstreamURL(scheme: "http", host: "x"), UpstreamURL(scheme: "http", host: "y")])
        upstream.url = UpstreamURL(scheme: "http", host: "z")
        #expect(upstream.endpoints == [UpstreamURL(scheme: "http", host: "z")])
    }

    @Test(
        "bad endpoint lists",
        arguments: [
            ErrorCase(
                E("url: http://a.test\nendpoints: [http://b.test]"), at: "endpoints", "both 'url' and 'endpoints'"),
            ErrorCase(E("endpoints: []"), at: "[]", "at least one url"),
            ErrorCase(E("endpoints: http://a.test"), at: "http", "must be a list"),
            ErrorCase(
                E("endpoints: [http://a.test, \"http://A.TEST:80/\"]"), at: "\"http://A", "http://a.test:80 twice"),
            ErrorCase(E("endpoints: [\"http://[::1]:8080\", \"http://[0::1]:8080\"]"), at: "\"http://[0", "twice"),
            ErrorCase(E("endpoints: [http://a.test, https://b.test]"), at: "https://b", "mix http and https"),
            ErrorCase(E("endpoints: [http://a.test/v2, http://b.test/v3]"), at: "http://b", "same base path"),
            ErrorCase(E("endpoints: [http://a.test/v2, http://b.test]"), at: "http://b", "no base path"),
            ErrorCase(E("endpoints: [http://a.test, ftp://b.test]"), at: "ftp", "http:// or https://"),
            ErrorCase(E("endpoints: [http://a.test, \"http://b.test/?q\"]"), at: "\"http://b", "?query"),
            ErrorCase(E("endpoints: [http://a.test, [http://b.test]]"), at: "[http://b", "single value"),
        ])
    func badEndpoints(c: ErrorCase) { expectSingleError(c) }

    @Test(
        "bad balance, circuit and hedge settings",
        arguments: [
            ErrorCase(E("url: http://a.test\nbalance: random"), at: "random", "failover | round_robin"),
            ErrorCase(E("url: http://a.test\ncircuit: {failures: -1}"), at: "-1", "between 0 and 1000"),
            ErrorCase(E("url: http://a.test\ncircuit: {open_for: 6m}"), at: "6m", "at most 5m"),
            ErrorCase(E("url: http://a.test\ncircuit: {open_for: 0s}"), at: "0s", "above 0"),
            ErrorCase(
                E("url: http://a.test\ncircuit: {max_inflight: 0}"), at: "0}",
                "upstream 'a': 'circuit.max_inflight' must be between 1 and 1000000"),
            ErrorCase(E("url: http://a.test\ncircuit: {failure: 3}"), at: "failure", "did you mean 'failures'"),
            ErrorCase(E("url: http://a.test\nhedge: {methods: [GET, POST]}"), at: "POST", "not idempotent"),
            ErrorCase(E("url: http://a.test\nhedge: {methods: [patch]}"), at: "patch", "PATCH is not idempotent"),
            ErrorCase(E("url: http://a.test\nhedge: {methods: [\"GE T\"]}"), at: "\"GE", "not an HTTP method"),
            ErrorCase(E("url: http://a.test\nhedge: {max: 3}"), at: "3}", "more than retry.attempts - 1 (2)"),
            ErrorCase(
                E("url: http://a.test\nretry: {attempts: 1}\nhedge: {max: 1}"), at: "1}", 2, "retry.attempts - 1 (0)"),
            ErrorCase(E("url: http://a.test\nhedge: {after: 10s}"), at: "10s", "not shorter than timeouts.per_try"),
            ErrorCase(
                E("url: http://a.test\ntimeouts: {per_try: 1s}\nhedge: {after: 1500ms}"), at: "1500ms",
                "per_try (1.0 seconds)"),
            ErrorCase(E("url: http://a.test\nhedge: {after: 0ms}"), at: "0ms", "above 0 (or p95)"),
            ErrorCase(E("url: http://a.test\nhedge: {after: p99}"), at: "p99", "not a duration"),
            ErrorCase(E("url: http://a.test\nhedge: {copies: 1}"), at: "copies", "unknown key"),
            ErrorCase(E("url: http://a.test\nretry: {on_network_change: sometimes}"), at: "sometimes", "true or false"),
        ])
    func badSettings(c: ErrorCase) { expectSingleError(c) }

    @Test("hedge.max up to retry.attempts - 1 is fine")
    func hedgeWithinAttempts() throws {
        let upstream = try ConfigFixture.parse(E("url: http://a.test\nretry: {attempts: 4}\nhedge: {max: 3}"))
            .upstreams[0]
        #expect(upstream.hedge.max == 3)
    }

    @Test("interception needs every endpoint on https (or loopback)")
    func interception() {
        let yaml =
            H + "keychain: {path: k.bkc, key_file: k.key}\nintercept: {ca_entry: ca/root}\n"
            + "upstreams:\n  - name: a\n    match: {hosts: [a.test]}\n"
            + "    endpoints: [http://127.0.0.1:8080, http://b.test]\n    intercept: true\n"
        let errors = ConfigFixture.errors(yaml)
        #expect(errors.count == 1, "\(errors)")
        #expect(errors.first?.message.contains("its endpoint http://b.test:80 must be https") == true, "\(errors)")
    }

    @Test("redirects naming any endpoint are rewritten")
    func redirects() throws {
        let upstream = try ConfigFixture.parse(E("endpoints: [http://a.test/v2, \"http://b.test:8080/v2\"]")).upstreams[
            0]
        let target = RequestTarget.parse("http://app.test/x")!
        let rewriter = RedirectRewriter(upstream: upstream, target: target)
        #expect(rewriter.rewrite("http://b.test:8080/v2/login") == "http://app.test/login")
        #expect(rewriter.rewrite("http://a.test/v2/login") == "http://app.test/login")
        #expect(rewriter.rewrite("http://c.test/v2/login") == nil)
    }
}
