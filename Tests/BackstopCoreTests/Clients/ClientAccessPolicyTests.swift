import BackstopCore
import Testing

/// The `clients` decision (docs/reference/config.md#clients) over every combination of entry kinds, connection facts,
/// presented credentials and targets.
@Suite("Client access policy")
struct ClientAccessPolicyTests {
    static let billingUID: UInt32 = 1001
    static let appsGID: UInt32 = 2000
    static let credentials = Array("ci:s3cret".utf8)
    static let right = "Basic " + Base64.encode(Array("ci:s3cret".utf8))
    static let wrong = "Basic " + Base64.encode(Array("ci:s3creT".utf8))

    static let user = ClientAccessPolicy.Entry(name: "billing", rule: .user(billingUID), upstreams: .only(["api"]))
    static let group = ClientAccessPolicy.Entry(name: "apps", rule: .group(appsGID), upstreams: .only(["events"]))
    static let basic = ClientAccessPolicy.Entry(name: "ci", rule: .basic(credentials: credentials), upstreams: .all)

    enum Connection: CaseIterable {
        case billing, appsMember, other, remote
        var facts: ClientConnection {
            switch self {
            case .billing: ClientConnection(uid: ClientAccessPolicyTests.billingUID, groups: [100])
            case .appsMember: ClientConnection(uid: 1002, groups: [100, ClientAccessPolicyTests.appsGID])
            case .other: ClientConnection(uid: 1003, groups: [100])
            // No uid: a remote client; a group set without a uid must not match a group entry.
            case .remote: ClientConnection(uid: nil, groups: [ClientAccessPolicyTests.appsGID])
            }
        }
    }

    enum Presented: CaseIterable {
        case none, right, wrong, garbage
        var header: String? {
            switch self {
            case .none: nil
            case .right: ClientAccessPolicyTests.right
            case .wrong: ClientAccessPolicyTests.wrong
            case .garbage: "Bearer abc"
            }
        }
    }

    static let targets: [ClientTarget] = [.upstream("api"), .upstream("events"), .upstream("other"), .unrouted]

    /// The rule as the spec states it, written independently of the implementation: the first matching entry
    /// decides; no match → 407 when a proxy_auth entry exists, else 403.
    static func expected(
        _ entries: [ClientAccessPolicy.Entry], _ connection: Connection, _ presented: Presented,
        _ target: ClientTarget
    ) -> ClientDecision {
        for entry in entries {
            let matched: Bool
            switch entry.name {
            case "billing": matched = connection == .billing
            case "apps": matched = connection == .appsMember
            default: matched = presented == .right
            }
            guard matched else { continue }
            let allowed: Bool
            switch (entry.name, target) {
            case ("ci", _): allowed = true
            case ("billing", .upstream("api")), ("apps", .upstream("events")): allowed = true
            default: allowed = false
            }
            return allowed ? .allow(client: entry.name) : .deny
        }
        return entries.contains { $0.name == "ci" } ? .challenge : .deny
    }

    /// Every ordering of every non-empty subset of the three entry kinds.
    static let configurations: [[ClientAccessPolicy.Entry]] = {
        let all = [user, group, basic]
        var out: [[ClientAccessPolicy.Entry]] = []
        func permute(_ chosen: [ClientAccessPolicy.Entry], _ rest: [ClientAccessPolicy.Entry]) {
            if !chosen.isEmpty { out.append(chosen) }
            for (i, next) in rest.enumerated() {
                var remaining = rest
                remaining.remove(at: i)
                permute(chosen + [next], remaining)
            }
        }
        permute([], all)
        return out
    }()

    @Test("every configuration × connection × credential × target decides as the rule says")
    func everyCombination() {
        #expect(Self.configurations.count == 15)
        var checked = 0
        for entries in Self.configurations {
            let policy = ClientAccessPolicy(entries: entries)
            for connection in Connection.allCases {
                for presented in Presented.allCases {
                    for target in Self.targets {
                        let got = policy.decide(
                            connection: connection.facts, proxyAuthorization: presented.header, target: target)
                        let want = Self.expected(entries, connection, presented, target)
                        #expect(got == want, "\(entries.map(\.name)) \(connection) \(presented) \(target)")
                        checked += 1
                    }
                }
            }
        }
        #expect(checked == 15 * 4 * 4 * 4)
    }

    @Test("spot checks: the first matching entry decides even when a later one would allow")
    func firstMatchDecides() {
        let policy = ClientAccessPolicy(entries: [Self.user, Self.basic])
        // billing presents ci's valid credentials, but its unix entry comes first and does not list `events`.
        #expect(
            policy.decide(
                connection: Connection.billing.facts, proxyAuthorization: Self.right,
                target: .upstream("events")) == .deny)
        #expect(
            policy.decide(
                connection: Connection.other.facts, proxyAuthorization: Self.right,
                target: .upstream("events")) == .allow(client: "ci"))
        #expect(
            policy.decide(connection: Connection.other.facts, proxyAuthorization: nil, target: .unrouted) == .challenge)
        #expect(
            ClientAccessPolicy(entries: [Self.user]).decide(
                connection: Connection.other.facts, proxyAuthorization: Self.right, target: .upstream("api")) == .deny)
        #expect(ClientAccessPolicy.challenge.value.hasPrefix("Basic realm="))
    }

    @Test("resolve turns names into ids and entries into credentials, and says what is missing")
    func resolve() throws {
        let clients = [
            ClientConfig(name: "b", match: .unixUser(.name("billing")), upstreams: .only(["api"])),
            ClientConfig(name: "g", match: .unixGroup(.id(7)), upstreams: .all),
            ClientConfig(name: "p", match: .proxyAuth(entry: "p/proxy"), upstreams: .all),
        ]
        let users = ["billing": UInt32(1001)]
        let secrets = ["p/proxy": Array("u:pw".utf8), "bad": Array("nocolon".utf8)]
        let policy = try ClientAccessPolicy.resolve(
            clients, user: { users[$0] }, group: { _ in nil }, secret: { secrets[$0] })
        #expect(policy.entries.map(\.rule) == [.user(1001), .group(7), .basic(credentials: Array("u:pw".utf8))])
        #expect(policy.challenges)
        #expect("\(policy.entries[2].rule)" == "basic(<redacted>)")
        #expect(throws: ClientPolicyError.unknownUser(client: "x", name: "nobody-here")) {
            try ClientAccessPolicy.resolve(
                [ClientConfig(name: "x", match: .unixUser(.name("nobody-here")), upstreams: .all)],
                user: { _ in nil }, group: { _ in nil }, secret: { _ in nil })
        }
        #expect(throws: ClientPolicyError.unknownGroup(client: "x", name: "g")) {
            try ClientAccessPolicy.resolve(
                [ClientConfig(name: "x", match: .unixGroup(.name("g")), upstreams: .all)],
                user: { _ in nil }, group: { _ in nil }, secret: { _ in nil })
        }
        #expect(throws: ClientPolicyError.missingEntry(client: "x", entry: "gone")) {
            try ClientAccessPolicy.resolve(
                [ClientConfig(name: "x", match: .proxyAuth(entry: "gone"), upstreams: .all)],
                user: { _ in nil }, group: { _ in nil }, secret: { secrets[$0] })
        }
        #expect(throws: ClientPolicyError.notCredentials(client: "x", entry: "bad")) {
            try ClientAccessPolicy.resolve(
                [ClientConfig(name: "x", match: .proxyAuth(entry: "bad"), upstreams: .all)],
                user: { _ in nil }, group: { _ in nil }, secret: { secrets[$0] })
        }
    }
}

/// `Proxy-Authorization: Basic`, base64 and the constant-time comparison.
@Suite("Proxy-Authorization")
struct ProxyAuthorizationTests {
    @Test("well-formed Basic credentials decode; the scheme is case-insensitive and whitespace is tolerated")
    func accepted() {
        let encoded = Base64.encode(Array("ci:pa:ss wörd".utf8))
        for value in ["Basic \(encoded)", "basic \(encoded)", "BASIC   \(encoded)", " \tBasic \(encoded) \t"] {
            #expect(ProxyAuthorization.basicCredentials(value) == Array("ci:pa:ss wörd".utf8), "\(value)")
        }
        #expect(ProxyAuthorization.basicCredentials("Basic " + Base64.encode(Array(":".utf8))) == Array(":".utf8))
    }

    @Test(
        "anything else is refused",
        arguments: [
            "", "Basic", "Basic ", "Bearer Y2k6cHc=", "Basic\tY2k6cHc=", "BasicY2k6cHc=", "Basic Y2k6cHc",
            "Basic Y2k6cHc==",
            "Basic Y2k6cH=w", "Basic Y2k6 cHc=", "Basic " + Base64.encode(Array("nocolon".utf8)), "Basic Y2k6cHd=",
            "Digest username=\"ci\"", "Basic " + String(repeating: "A", count: 5000),
        ])
    func refused(value: String) {
        #expect(ProxyAuthorization.basicCredentials(value) == nil)
    }

    @Test("base64 round trips every length, and its url alphabet has no padding")
    func base64() {
        var random = SplitMix64(seed: 28)
        for length in 0..<70 {
            let bytes = (0..<length).map { _ in UInt8.random(in: 0...255, using: &random) }
            #expect(Base64.decode(Array(Base64.encode(bytes).utf8)) == bytes)
            #expect(
                !Base64.encodeURL(bytes).contains("=") && !Base64.encodeURL(bytes).contains("+")
                    && !Base64.encodeURL(bytes).contains("/"))
        }
        #expect(Base64.encode(Array("Man".utf8)) == "TWFu")
        #expect(Base64.encode(Array("Ma".utf8)) == "TWE=")
        #expect(Base64.encodeURL([0xFB, 0xFF]) == "-_8")
        // Non-zero unused bits: a second spelling of the same bytes is refused.
        #expect(Base64.decode(Array("TWF=".utf8)) == nil)
        #expect(Base64.decode(Array("TWE=".utf8)) == Array("Ma".utf8))
    }

    @Test("constant-time equality is equality")
    func constantTime() {
        #expect(ConstantTime.equals(Array("abc".utf8), Array("abc".utf8)))
        #expect(!ConstantTime.equals(Array("abd".utf8), Array("abc".utf8)))
        #expect(!ConstantTime.equals(Array("ab".utf8), Array("abc".utf8)))
        #expect(!ConstantTime.equals(Array("abcd".utf8), Array("abc".utf8)))
        #expect(!ConstantTime.equals([], Array("a".utf8)))
        #expect(ConstantTime.equals([], []))
        // A prefix of the expected bytes padded with what the loop compares against must still differ.
        #expect(!ConstantTime.equals([0x61], [0x61, 0x00]))
        #expect(!ConstantTime.equals([0x61], [0x61, 0xFF]))
    }
}
