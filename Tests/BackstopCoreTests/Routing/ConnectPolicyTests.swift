import BackstopCore
import Testing

/// Every rule of `ConnectPolicy` and `ConnectTarget` (docs/reference/https-clients.md).
@Suite("ConnectPolicy")
struct ConnectPolicyTests {
    private static func policy(
        allow: [String]? = nil, deny: [String]? = nil, intercept: [(String, [String])] = [],
        plain: [(String, [String])] = []
    ) -> ConnectPolicy {
        var config = Config()
        for (name, hosts) in plain {
            config.upstreams.append(
                UpstreamConfig(
                    name: name, match: MatchConfig(hosts: hosts), url: UpstreamURL(scheme: "https", host: "\(name).up"))
            )
        }
        for (name, hosts) in intercept {
            config.upstreams.append(
                UpstreamConfig(
                    name: name, match: MatchConfig(hosts: hosts), url: UpstreamURL(scheme: "https", host: "\(name).up"),
                    intercept: true))
        }
        if let allow {
            var tunnels = TunnelsConfig(
                allow: allow.map {
                    let parts = $0.split(separator: "|")
                    return TunnelPattern(host: String(parts[0]), port: Int(parts[1])!)
                })
            if let deny { tunnels.denyAddresses = deny.map { CIDRParser.parse($0)! } }
            config.tunnels = tunnels
        }
        return ConnectPolicy(config: config, router: Router(upstreams: config.upstreams, unmatched: .reject))
    }

    @Test(
        "targets: host:port with a DNS name or IP literal; anything else is malformed",
        arguments: [
            ("api.example.com:443", ConnectTarget(host: "api.example.com", port: 443)),
            ("API.Example.COM:8443", ConnectTarget(host: "api.example.com", port: 8443)),
            ("10.1.2.3:443", ConnectTarget(host: "10.1.2.3", port: 443, address: [10, 1, 2, 3])),
            ("[::1]:443", ConnectTarget(host: "::1", port: 443, address: Array(repeating: 0, count: 15) + [1])),
            ("under_score.test:1", ConnectTarget(host: "under_score.test", port: 1)),
        ])
    func wellFormed(text: String, expected: ConnectTarget) {
        #expect(ConnectTarget.parse(text) == expected)
    }

    @Test(
        "malformed targets",
        arguments: [
            "api.example.com", "api.example.com:", "api.example.com:0", "api.example.com:65536", ":443", "a..b:443",
            ".a.b:443", "a.b.:443", "a b:443", "a%2eb:443", "user@a.b:443", "http://a.b:443", "[::1", "[::1]443",
            "2130706433:443", "0x7f.1:443", "a.0x7f000001:443", "a.123:443",
            String(repeating: "a", count: 64) + ".test:443", String(repeating: "a.", count: 150) + "test:443",
        ])
    func malformed(text: String) {
        #expect(ConnectTarget.parse(text) == nil)
        #expect(Self.policy(allow: ["*.test|443"]).decide(authority: text) == .refuse(.badRequest))
    }

    @Test("no tunnels and no intercepting upstream: 405 connect-not-supported for every well-formed target")
    func notSupported() {
        let policy = Self.policy(plain: [("a", ["a.test"])])
        #expect(!policy.acceptsConnect)
        #expect(policy.decide(authority: "a.test:443") == .refuse(.connectNotSupported))
        #expect(policy.decide(authority: "10.0.0.1:443") == .refuse(.connectNotSupported))
    }

    @Test("interception: the host's best match intercepts; port ignored; a better plain match wins")
    func intercept() {
        let policy = Self.policy(intercept: [("i", ["api.test", "*.wild.test"])], plain: [("p", ["exact.wild.test"])])
        #expect(
            policy.decide(authority: "api.test:443")
                == .intercept(upstream: 1, target: ConnectTarget(host: "api.test", port: 443)))
        #expect(
            policy.decide(authority: "API.TEST:8443")
                == .intercept(upstream: 1, target: ConnectTarget(host: "api.test", port: 8443)))
        #expect(
            policy.decide(authority: "x.y.wild.test:443")
                == .intercept(upstream: 1, target: ConnectTarget(host: "x.y.wild.test", port: 443)))
        // The exact plain upstream beats the intercepting wildcard; with no tunnels, that is a denial.
        #expect(policy.decide(authority: "exact.wild.test:443") == .refuse(.tunnelDenied))
        #expect(policy.decide(authority: "wild.test:443") == .refuse(.tunnelDenied))
        #expect(policy.decide(authority: "other.test:443") == .refuse(.tunnelDenied))
    }

    @Test("tunnels: exact and wildcard names at their port; literal IPs only when named")
    func tunnels() {
        let policy = Self.policy(allow: ["*.github.com|443", "registry.npmjs.org|443", "10.1.2.3|8443", "fd00::1|22"])
        let allowed = [
            "api.github.com:443", "a.b.github.com:443", "registry.npmjs.org:443", "10.1.2.3:8443",
            "[fd00::1]:22", "[::ffff:10.1.2.3]:8443",
        ]
        for text in allowed {
            #expect(policy.decide(authority: text) == .tunnel(ConnectTarget.parse(text)!), "\(text)")
        }
        let denied = [
            "github.com:443", "api.github.com:22", "registry.npmjs.org:80", "evilgithub.com:443",
            "api.github.com.evil.test:443", "10.1.2.3:443", "10.1.2.4:8443", "[fd00::2]:22", "8.8.8.8:443",
        ]
        for text in denied {
            #expect(policy.decide(authority: text) == .refuse(.tunnelDenied), "\(text)")
        }
    }

    @Test("a wildcard pattern never matches an IP literal")
    func wildcardNeverMatchesIP() {
        let policy = Self.policy(allow: ["*.0.0.1|443", "*.2.3|443"])
        #expect(policy.decide(authority: "127.0.0.1:443") == .refuse(.tunnelDenied))
        #expect(policy.decide(authority: "10.1.2.3:443") == .refuse(.tunnelDenied))
    }

    @Test("resolved addresses: the default deny list, IPv4-mapped IPv6 judged as IPv4, a replaced list")
    func addresses() {
        let policy = Self.policy(allow: ["a.test|443"])
        let denied: [[UInt8]] = [
            [127, 0, 0, 1], [10, 9, 8, 7], [172, 16, 0, 1], [172, 31, 255, 255], [192, 168, 1, 1],
            [169, 254, 169, 254],
            [100, 64, 0, 1], [100, 127, 255, 255], [0, 0, 0, 0], [0, 1, 2, 3],
            Array(repeating: 0, count: 15) + [1], [0xfe, 0x80] + Array(repeating: 0, count: 13) + [1],
            [0xfd, 0x00] + Array(repeating: 0, count: 13) + [1], [0xfc] + Array(repeating: 0, count: 15),
            Array(repeating: 0, count: 10) + [0xff, 0xff, 127, 0, 0, 1],
            Array(repeating: 0, count: 10) + [0xff, 0xff, 10, 0, 0, 1],
        ]
        for address in denied { #expect(!policy.allowsAddress(address), "\(address)") }
        let allowed: [[UInt8]] = [
            [8, 8, 8, 8], [172, 32, 0, 1], [100, 128, 0, 1], [1, 1, 1, 1],
            [0x20, 0x01, 0x0d, 0xb8] + Array(repeating: 0, count: 12),
            Array(repeating: 0, count: 10) + [0xff, 0xff, 8, 8, 8, 8],
        ]
        for address in allowed { #expect(policy.allowsAddress(address), "\(address)") }
        let loopbackOnly = Self.policy(allow: ["a.test|443"], deny: ["127.0.0.0/8"])
        #expect(loopbackOnly.allowsAddress([10, 0, 0, 1]))
        #expect(!loopbackOnly.allowsAddress([127, 0, 0, 2]))
        #expect(!Self.policy().allowsAddress([8, 8, 8, 8]))
    }
}
