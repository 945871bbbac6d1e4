import BackstopCore
import Testing

private let H = ConfigFixture.head

/// Cross-section rules: unique names, no overlapping matches, all errors reported at once.
@Suite("Config semantic checks")
struct ConfigSemanticTests {
    private static func two(_ first: String, _ second: String) -> String {
        H + "upstreams:\n  - name: a\n    match: \(first)\n    url: http://a\n"
            + "  - name: b\n    match: \(second)\n    url: http://b\n"
    }

    @Test(
        "duplicates and overlaps are reported at the later node",
        arguments: [
            ErrorCase(
                H + "upstreams:\n  - {name: a, match: {hosts: [x]}, url: http://x}\n"
                    + "  - {name: a, match: {hosts: [y]}, url: http://y}\n", at: "a,", 2, "duplicate upstream name 'a'"),
            ErrorCase(two("{hosts: [x.test]}", "{hosts: [y.test, X.test]}"), at: "X.test", "both match host 'x.test'"),
            ErrorCase(two("{hosts: [\"*.x.test\"]}", "{hosts: [\"*.X.TEST\"]}"), at: "\"*.X", "host '*.x.test'"),
            ErrorCase(two("{path_prefix: /api}", "{path_prefix: /api/}"), at: "/api/", "path_prefix '/api'"),
            ErrorCase(
                two("{hosts: [x], path_prefix: /p}", "{hosts: [y], path_prefix: /p}"), at: "/p}", 2,
                "both match path_prefix '/p'"),
            // hosts and path_prefix are independent ways in: sharing either one is an overlap.
            ErrorCase(
                two("{hosts: [x.test]}", "{hosts: [x.test], path_prefix: /api}"), at: "x.test]", 2,
                "both match host 'x.test'"),
            ErrorCase(
                two("{path_prefix: /api}", "{hosts: [x.test], path_prefix: /api}"), at: "/api}", 2,
                "both match path_prefix '/api'"),
            ErrorCase(two("{path_prefix: /}", "{path_prefix: /}"), at: "/}", 2, "overlaps upstream 'a'"),
        ])
    func overlaps(c: ErrorCase) { expectSingleError(c) }

    @Test("matches that the router can tell apart are not overlaps")
    func distinguishable() throws {
        let pairs = [
            ("{hosts: [x.test]}", "{hosts: [\"*.x.test\"]}"),
            ("{hosts: [\"*.x.test\"]}", "{hosts: [\"*.y.x.test\"]}"),
            ("{hosts: [x.test], path_prefix: /a}", "{hosts: [y.test], path_prefix: /b}"),
            ("{path_prefix: /api}", "{path_prefix: /api/v2}"),
            ("{path_prefix: /api}", "{hosts: [x.test], path_prefix: /api/v2}"),
            ("{hosts: [x.test]}", "{path_prefix: /x}"),
        ]
        for (first, second) in pairs {
            let config = try ConfigFixture.parse(Self.two(first, second))
            #expect(config.upstreams.map(\.name) == ["a", "b"])
        }
    }

    @Test("every error is reported, sorted by position, not just the first")
    func allErrors() {
        let found = ConfigFixture.errors(
            """
            version: 3
            listen: [0.0.0.0:80]
            log: {level: loud, format: xml}
            limits: {max_connections: 0}
            upstreams:
              - name: a
                match: {hosts: [a]}
                url: ftp://a
                retry: {attempts: 0, on: [teapot]}
                auth: {type: static, entry: e}
              - name: a
                match: {hosts: [a]}
                url: http://a
            """)
        let positions = found.map { "\($0.location.line):\($0.location.column)" }
        #expect(
            positions == ["1:10", "2:10", "3:14", "3:28", "4:27", "8:10", "9:23", "9:31", "10:18", "11:11", "12:21"],
            "\(found)")
        #expect(found.allSatisfy { $0.location.file == "t.yaml" })
    }

    @Test("oauth2 upstreams share a keychain_prefix only with the same token endpoint, client and grant")
    func sharedKeychainPrefix() throws {
        func config(_ secondTokenURL: String, clientID: String = "c") -> String {
            H + "keychain: {path: k.bkc, key_file: k.key}\nupstreams:\n"
                + "  - {name: a, match: {hosts: [a.test]}, url: http://a, auth: {type: oauth2, token_url: https://idp-a/t, "
                + "client_id: c, keychain_prefix: shared}}\n"
                + "  - {name: b, match: {hosts: [b.test]}, url: http://b, auth: {type: oauth2, token_url: \(secondTokenURL), "
                + "client_id: \(clientID), keychain_prefix: shared}}\n"
        }
        // The same grant: one set of tokens for both (as before).
        #expect(throws: Never.self) { try ConfigFixture.parse(config("https://idp-a/t")) }
        for yaml in [config("https://idp-b/t"), config("https://idp-a/t", clientID: "other")] {
            let errors = ConfigFixture.errors(yaml)
            #expect(errors.count == 1, "\(errors)")
            #expect(
                errors.first?.message.hasPrefix("upstream 'b' shares auth.keychain_prefix 'shared' with upstream 'a'")
                    == true, "\(errors)")
        }
    }

    @Test("an auth upstream with a keychain section is fine; without auth no keychain is needed")
    func keychainOptional() throws {
        let config = try ConfigFixture.parse(ConfigFixture.upstream("auth: {type: static, entry: e}", keychain: true))
        #expect(config.keychain?.path == "/etc/backstop/k.bkc")
        #expect(try ConfigFixture.parse(ConfigFixture.upstream("auth: {type: none}")).keychain == nil)
    }
}
