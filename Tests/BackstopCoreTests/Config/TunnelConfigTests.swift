import Testing
import Yams

@testable import BackstopCore

private let H = ConfigFixture.head
private let K = "keychain: {path: k.bkc, key_file: k.key}\n"

/// The `tunnels` and `intercept` sections and the `intercept: true` rules (docs/reference/config.md#tunnels).
@Suite("Config: tunnels and interception")
struct TunnelConfigTests {
    @Test("tunnels: patterns with and without ports, defaults for deny_addresses and idle_timeout")
    func tunnelDefaults() throws {
        let config = try ConfigFixture.parse(
            H
                + "tunnels:\n  allow: [\"*.GitHub.com:443\", registry.npmjs.org, \"10.1.2.3:8443\", \"[fd00::1]:22\", \"::1\"]\n"
        )
        let tunnels = try #require(config.tunnels)
        #expect(
            tunnels.allow == [
                TunnelPattern(host: "*.github.com", port: 443), TunnelPattern(host: "registry.npmjs.org", port: 443),
                TunnelPattern(host: "10.1.2.3", port: 8443), TunnelPattern(host: "fd00::1", port: 22),
                TunnelPattern(host: "::1", port: 443),
            ])
        #expect(tunnels.denyAddresses == TunnelsConfig.defaultDenyAddresses)
        #expect(
            tunnels.denyAddresses.map(\.description) == [
                "127.0.0.0/8", "0:0:0:0:0:0:0:1/128", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16",
                "fe80:0:0:0:0:0:0:0/10", "fc00:0:0:0:0:0:0:0/7", "100.64.0.0/10", "0.0.0.0/8", "0:0:0:0:0:0:0:0/128",
            ])
        #expect(tunnels.idleTimeout == .seconds(300))
    }

    @Test("tunnels: deny_addresses replaces the default list; idle_timeout is read")
    func tunnelOverrides() throws {
        let config = try ConfigFixture.parse(
            H + "tunnels:\n  allow: [a.test]\n  deny_addresses: [127.0.0.0/8]\n  idle_timeout: 30s\n")
        #expect(config.tunnels?.denyAddresses.map(\.description) == ["127.0.0.0/8"])
        #expect(config.tunnels?.idleTimeout == .seconds(30))
    }

    @Test("IPv6 values unquoted in flow lists, as the docs write the default, read as YAML 1.2 reads them")
    func unquotedIPv6InFlowLists() throws {
        let config = try ConfigFixture.parse(
            H + "tunnels:\n  allow: [a.test, ::1, \"[::1]:22\"]   # a comment: [::2]\n"
                + "  deny_addresses: [127.0.0.0/8, ::1/128, 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, 169.254.0.0/16,\n"
                + "    fe80::/10, fc00::/7, 100.64.0.0/10, 0.0.0.0/8, ::/128]\n")
        let tunnels = try #require(config.tunnels)
        #expect(tunnels.denyAddresses == TunnelsConfig.defaultDenyAddresses)
        #expect(tunnels.allow.map(\.host) == ["a.test", "::1", "::1"])
        // Values that are not addresses are left to the YAML parser, which reports them where they are.
        let errors = ConfigFixture.errors(H + "tunnels:\n  allow: [a.test, ::x y]\n")
        #expect(errors.first?.location.line == 4, "\(errors)")
    }

    @Test("the placeholder swap keeps every position, skips quotes, comments and block scalars, and undoes itself")
    func flowColonScalars() {
        let text = "a: [::1, 'x, ::2', \"::3\", {k: ::4}]  # [::5\nb: |\n  [::6]\nc:\n  - ::7\nd: [fe80::1, :x:]\n"
        let protected = FlowColonScalars.protect(text)
        let placeholder = FlowColonScalars.placeholder
        #expect(protected?.unicodeScalars.count == text.unicodeScalars.count)
        let swapped = protected.map { Array($0.unicodeScalars) } ?? []
        let original = Array(text.unicodeScalars)
        let at = swapped.indices.filter { swapped[$0] != original[$0] }
        #expect(at.allSatisfy { swapped[$0] == placeholder && original[$0] == ":" })
        // `::1`, `::4` in the flow mapping, and `:x:`; not inside quotes, the comment, the block scalar, the block
        // value, nor the colons inside `fe80::1`.
        #expect(at.map { String(String.UnicodeScalarView(original[$0..<$0 + 3])) } == ["::1", "::4", ":x:"])
        #expect(FlowColonScalars.protect("a: [b, c]\n") == nil)
        #expect(FlowColonScalars.protect("a: [::1, \u{E000}]\n") == nil)
    }

    @Test(
        "whatever the pre-pass takes for structure, a document libyaml reads is read the same",
        arguments: [
            "desc: see\n  [a, ::1 b]\n", "note: &n |\n  [a, ::1 b]\n", "note: !!str >\n  [a, ::1 b]\n",
            "a: [!!str \"x, ::1 y\"]\n", "a: &x \"k: [z, ::1 w]\"\n", "desc: see\n  [notes\nb: x, ::1\n",
            "a: 'it''s [::1'\nb: [c]\n", "a: \"\\\" [\"\nb: x, ::1\n", "a: [fe80::1, \"::2\"]\n", "? [a]\n: b\n",
        ])
    func preservesWhatLibyamlReads(text: String) throws {
        let plain = try Yams.compose(yaml: text)
        let protected = FlowColonScalars.protect(text)
        let viaProtection = try protected.map { try Yams.compose(yaml: $0).map(FlowColonScalars.restore) } ?? plain
        #expect(viaProtection == plain)
    }

    @Test("anchored and tagged flow lists are read too; a trailing colon still needs quotes")
    func anchoredAndTagged() throws {
        for (text, quoted) in [
            ("a: &l [::1, ::2]\n", "a: &l [\"::1\", \"::2\"]\n"), ("a: !!seq [::1]\n", "a: !!seq [\"::1\"]\n"),
            ("a: [!!str ::1]\n", "a: [!!str \"::1\"]\n"), ("- &e [::1]\n", "- &e [\"::1\"]\n"),
        ] {
            let protected = try #require(FlowColonScalars.protect(text), "\(text)")
            let node = try Yams.compose(yaml: protected).map(FlowColonScalars.restore)
            #expect(node == (try Yams.compose(yaml: quoted)), "\(text)")
        }
        #expect(throws: (any Error).self) {
            try Yams.compose(yaml: FlowColonScalars.protect("a: [0.0.0.0/8, ::]\n") ?? "")
        }
    }

    @Test("intercept: defaults and values")
    func interceptSection() throws {
        let config = try ConfigFixture.parse(
            H + K + "intercept: {leaf_lifetime: 12h}\n"
                + "upstreams:\n  - {name: a, match: {hosts: [a.test]}, url: https://a.test, intercept: true}\n")
        #expect(config.intercept == InterceptConfig(caEntry: "ca/root", leafLifetime: .seconds(12 * 3600)))
        #expect(config.upstreams.first?.intercept == true)
    }

    @Test(
        "bad tunnels and intercept values are reported where they are written",
        arguments: [
            ErrorCase(H + "tunnels:\n  allow: [\"a.test:0\"]\n", at: "\"a.test:0", "HOST[:PORT]"),
            ErrorCase(H + "tunnels:\n  allow: [\"a.test:99999\"]\n", at: "\"a.test:99999", "HOST[:PORT]"),
            ErrorCase(H + "tunnels:\n  allow: [\"a b:443\"]\n", at: "\"a b", "HOST[:PORT]"),
            ErrorCase(H + "tunnels:\n  allow: [\"a.test:443\", a.test]\n", at: "a.test]", "twice"),
            ErrorCase(H + "tunnels:\n  idle_timeout: 5m\n", at: "idle_timeout", "needs 'allow'"),
            ErrorCase(
                H + "tunnels:\n  allow: [a.test]\n  deny_addresses: [10.0.0.0/33]\n", at: "10.0.0.0/33", "not a CIDR"),
            ErrorCase(H + "tunnels:\n  allow: [a.test]\n  idle_timeout: 0s\n", at: "0s", "above 0"),
            ErrorCase(H + "tunnels:\n  allow: [a.test]\n  alow: []\n", at: "alow", "alow"),
            ErrorCase(H + K + "intercept: {leaf_lifetime: 10s}\n", at: "10s", "leaf_lifetime"),
            ErrorCase(H + "intercept: {}\n", at: "{}", "keychain"),
        ])
    func badValues(c: ErrorCase) { expectSingleError(c) }

    @Test(
        "intercept: true needs the intercept section, a keychain, host names, verification on and an https url",
        arguments: [
            ErrorCase(
                H + K + "upstreams:\n  - {name: a, match: {hosts: [a.test]}, url: https://a.test, intercept: true}\n",
                at: "true", "no 'intercept' section"),
            ErrorCase(
                H + "intercept: {}\n"
                    + "upstreams:\n  - {name: a, match: {hosts: [a.test]}, url: https://a.test, intercept: true}\n",
                at: "intercept:", "keychain"),
            ErrorCase(
                H + K + "intercept: {}\n"
                    + "upstreams:\n  - {name: a, match: {path_prefix: /a}, url: https://a.test, intercept: true}\n",
                at: "true", "no match.hosts"),
            ErrorCase(
                H + K + "intercept: {}\n"
                    + "upstreams:\n  - {name: a, match: {hosts: [10.0.0.1]}, url: https://a.test, intercept: true}\n",
                at: "10.0.0.1", "host names"),
            ErrorCase(
                H + K + "intercept: {}\nupstreams:\n  - {name: a, match: {hosts: [a.test]}, url: https://a.test, "
                    + "tls: {insecure_skip_verify: true}, intercept: true}\n", at: "true}", 2, "insecure_skip_verify"),
            ErrorCase(
                H + K + "intercept: {}\n"
                    + "upstreams:\n  - {name: a, match: {hosts: [a.test]}, url: http://a.test, intercept: true}\n",
                at: "true", "must be https"),
        ])
    func interceptRules(c: ErrorCase) {
        // The keychain-less case reports twice (the section and the upstream): check the first, at the section.
        if !c.yaml.contains("keychain:") {
            let found = ConfigFixture.errors(c.yaml)
            #expect(found.count == 2)
            #expect(found.allSatisfy { $0.message.contains("keychain") })
            return
        }
        expectSingleError(c)
    }

    @Test("an intercepting upstream with a loopback http url is allowed (a local test origin)")
    func loopbackHTTP() throws {
        let config = try ConfigFixture.parse(
            H + K + "intercept: {}\n"
                + "upstreams:\n  - {name: a, match: {hosts: [a.test]}, url: http://127.0.0.1:9000, intercept: true}\n")
        #expect(config.upstreams.first?.intercept == true)
    }
}
