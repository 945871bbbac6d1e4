import Foundation
import Testing

@testable import BackstopCore

/// What `check` refuses since the second review (docs/reference/config.md, docs/reference/https-clients.md): a value
/// that could not be sent as written, and an intercepting host pattern over a public suffix.
@Suite("Config refusals")
struct ConfigRefusalTests {
    // MARK: control characters

    static let keychain = "keychain: {path: k.bkc, key_file: k.key}\n"

    @Test(
        "a control character in a header name, auth scheme or token request value is an error at that value",
        arguments: [
            ErrorCase(
                ConfigFixture.upstream("auth: {type: static, entry: a/t, scheme: \"Bear\\r\\ner\"}", keychain: true),
                at: "\"Bear", "CR (U+000D) at character 5"),
            ErrorCase(
                ConfigFixture.upstream(
                    "auth: {type: oauth2, token_url: \"https://t.test/t\", keychain_prefix: a, scheme: \"Bearer\\n\"}",
                    keychain: true), at: "\"Bearer", "LF (U+000A) at character 7"),
            ErrorCase(
                ConfigFixture.upstream(
                    "auth: {type: static, entry: a/t, header: \"X-Key\\r\\nX-Evil: 1\"}", keychain: true),
                at: "\"X-Key", "CR (U+000D)"),
            ErrorCase(
                ConfigFixture.upstream("retry: {retry_non_idempotent_with_key: \"Idem\\0Key\"}"), at: "\"Idem",
                "NUL (U+0000)"),
            ErrorCase(
                ConfigFixture.upstream(
                    "auth: {type: oauth2, token_url: \"https://t.test/t\", keychain_prefix: a, client_id: \"c\\x7f\"}",
                    keychain: true), at: "\"c", "DEL (U+007F)"),
            ErrorCase(
                ConfigFixture.upstream(
                    "auth: {type: oauth2, token_url: \"https://t.test/t\", keychain_prefix: a, scope: \"read\\twrite\"}",
                    keychain: true), at: "\"read", "TAB (U+0009)"),
            ErrorCase(
                ConfigFixture.upstream("auth: {type: static, entry: a/t, scheme: \"x\\e[31m\"}", keychain: true),
                at: "\"x", "(U+001B) at character 2"),
        ])
    func controlCharacters(c: ErrorCase) {
        expectSingleError(c)
        for error in ConfigFixture.errors(c.yaml) {
            // The message names the character; it never prints it (a terminal would act on it).
            #expect(!error.message.unicodeScalars.contains { $0.value < 0x20 || $0.value == 0x7F }, "\(error)")
        }
    }

    @Test(
        "every keychain name in the config is held to the keychain's rule, keychain_prefix with room for its longest entry",
        arguments: [
            ErrorCase(
                ConfigFixture.upstream(
                    "auth: {type: oauth2, token_url: \"https://t.test/t\", keychain_prefix: \"a\\nforged\\tx\"}",
                    keychain: true), at: "\"a", "'a\\nforged\\tx' is not a keychain entry name"),
            ErrorCase(
                ConfigFixture.upstream(
                    "auth: {type: oauth2, token_url: \"https://t.test/t\", keychain_prefix: \"a b\"}", keychain: true),
                at: "\"a b", "is not a keychain entry name"),
            ErrorCase(
                ConfigFixture.upstream(
                    "auth: {type: oauth2, token_url: \"https://t.test/t\", keychain_prefix: \"e\\u202E\"}",
                    keychain: true), at: "\"e", "no spaces, control or format characters"),
            ErrorCase(
                ConfigFixture.upstream(
                    "auth: {type: oauth2, token_url: \"https://t.test/t\", keychain_prefix: \(String(repeating: "p", count: 235))}",
                    keychain: true), at: "ppp", "is 235 bytes; at most 234"),
            ErrorCase(
                ConfigFixture.upstream(
                    "auth: {type: oauth2, token_url: \"https://t.test/t\", keychain_prefix: a, grant: client_credentials, "
                        + "client_id: c, client_secret_entry: \"cs\\tx\"}", keychain: true),
                at: "\"cs", "is not a keychain entry name"),
            ErrorCase(
                ConfigFixture.head + keychain + "intercept: {ca_entry: \"ca\\troot\"}\n",
                at: "\"ca", "is not a keychain entry name"),
        ])
    func keychainNames(c: ErrorCase) {
        expectSingleError(c)
    }

    @Test(
        "auth.header naming a field Backstop writes or removes itself is an error at that value",
        arguments: ["Host", "via", "Content-Length", "TRANSFER-ENCODING", "Connection", "Upgrade", "Expect"])
    func managedHeaderNames(name: String) {
        expectSingleError(
            ErrorCase(
                ConfigFixture.upstream("auth: {type: static, entry: a/t, header: \(name)}", keychain: true), at: name,
                "'\(name)' is a header Backstop sets or removes itself"))
    }

    @Test("ordinary values pass: schemes with spaces or none, scopes with spaces, header names")
    func ordinaryValues() throws {
        let config = try ConfigFixture.parse(
            ConfigFixture.upstream(
                "auth: {type: oauth2, token_url: \"https://t.test/t\", keychain_prefix: a, scheme: \"\", scope: \"read write\", "
                    + "header: X-Api-Key, client_id: \"my client\"}\nretry: {retry_non_idempotent_with_key: X-Request-Id}",
                keychain: true))
        guard case .oauth2(let auth) = try #require(config.upstreams.first).auth else {
            Issue.record("not oauth2")
            return
        }
        #expect(
            auth.scheme == "" && auth.scope == "read write" && auth.header == "X-Api-Key"
                && auth.clientID == "my client")
    }

    // MARK: public suffixes

    static func intercepting(_ hosts: String) -> String {
        ConfigFixture.head + keychain + "intercept: {}\nupstreams:\n  - name: a\n    match: {hosts: [\(hosts)]}\n"
            + "    url: https://a.test\n    intercept: true\n"
    }

    @Test(
        "an intercepting host pattern that covers a public suffix is an error at that host (Debian's list)",
        arguments: [
            ErrorCase(intercepting("api.a.test, \"*.com\""), at: "\"*.com\"", "'com' is a public suffix"),
            ErrorCase(intercepting("\"*.co.uk\""), at: "\"*.co.uk\"", "'co.uk' is a public suffix"),
            ErrorCase(intercepting("\"*.github.io\""), at: "\"*.github.io\"", "'github.io' is a public suffix"),
            ErrorCase(intercepting("github.io"), at: "github.io", "'github.io' is a public suffix"),
            ErrorCase(intercepting("\"*.internal\""), at: "\"*.internal\"", "'internal' is a public suffix"),
            ErrorCase(intercepting("\"*.amazonaws.com\""), at: "\"*.amazonaws.com\"", "has the public suffix"),
            ErrorCase(
                intercepting("\"*.xn--55qx5d.cn\""), at: "\"*.xn--55qx5d.cn\"", "'xn--55qx5d.cn' is a public suffix"),
            ErrorCase(intercepting("\"*.ck\""), at: "\"*.ck\"", "public suffix"),
            ErrorCase(intercepting("\"*.x.ck\""), at: "\"*.x.ck\"", "'x.ck' is a public suffix"),
        ])
    func publicSuffixes(c: ErrorCase) throws {
        try #require(
            FileManager.default.fileExists(atPath: PublicSuffixList.systemPath),
            "Debian's publicsuffix package is needed (scripts/install-prerequisites.sh installs it)")
        expectSingleError(c)
    }

    @Test("hosts below a public suffix pass, exceptions of the list included; a plain upstream may match *.com")
    func registrableHosts() throws {
        try #require(FileManager.default.fileExists(atPath: PublicSuffixList.systemPath))
        _ = try ConfigFixture.parse(
            Self.intercepting(
                "api.example.com, \"*.example.co.uk\", \"*.me.github.io\", \"*.www.ck\", bucket.s3.amazonaws.com, \"*.corp.internal\""
            ))
        _ = try ConfigFixture.parse(
            ConfigFixture.head + "upstreams:\n  - name: a\n    match: {hosts: [\"*.com\"]}\n    url: https://a.test\n")
    }

    @Test(
        "without the list, an intercepting upstream is an error naming the file and the fix; without interception the list is never read"
    )
    func missingList() throws {
        let environment = ConfigEnvironment(["BACKSTOP_PUBLIC_SUFFIX_LIST": "/nonexistent/public_suffix_list.dat"])
        let yaml = Self.intercepting("api.example.com")
        do {
            _ = try ConfigLoader.parse(yaml: yaml, file: "t.yaml", baseDirectory: "/etc", environment: environment)
            Issue.record("parsed without the list")
        } catch {
            #expect(error.errors.count == 1)
            let message = try #require(error.errors.first).description
            #expect(message.hasPrefix("t.yaml:9:16: "), "\(message)")
            #expect(
                message.contains("/nonexistent/public_suffix_list.dat cannot be used (No such file or directory)"),
                "\(message)")
            #expect(message.contains("publicsuffix package"), "\(message)")
        }
        _ = try ConfigLoader.parse(
            yaml: ConfigFixture.upstream(), file: "t.yaml", baseDirectory: "/etc", environment: environment)
    }

    @Test("BACKSTOP_PUBLIC_SUFFIX_LIST names another copy of the list")
    func otherList() throws {
        let directory = NSTemporaryDirectory() + "psl-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = directory + "/list.dat"
        try "// a test list\nexample\n".write(toFile: path, atomically: true, encoding: .utf8)
        let environment = ConfigEnvironment(["BACKSTOP_PUBLIC_SUFFIX_LIST": path])
        #expect(throws: ConfigErrors.self) {
            try ConfigLoader.parse(
                yaml: Self.intercepting("\"*.example\""), file: "t.yaml", baseDirectory: "/", environment: environment)
        }
        // github.io is not in this list: only single labels (the default rule) and `example`.
        _ = try ConfigLoader.parse(
            yaml: Self.intercepting("\"*.github.io\""), file: "t.yaml", baseDirectory: "/", environment: environment)
        try "// only comments\n".write(toFile: path, atomically: true, encoding: .utf8)
        #expect(throws: ConfigErrors.self) {
            try ConfigLoader.parse(
                yaml: Self.intercepting("api.example.com"), file: "t.yaml", baseDirectory: "/", environment: environment
            )
        }
    }
}

/// The Public Suffix List algorithm and its Punycode (RFC 3492).
@Suite("Public Suffix List")
struct PublicSuffixListTests {
    static let list = PublicSuffixList(
        text: """
            // comment
            com
            co.uk
            uk
            *.ck
            !www.ck
            github.io
            *.compute.amazonaws.com
            公司.cn
            cn

            """)

    @Test("rules, wildcards, exceptions and the default rule")
    func algorithm() {
        #expect(Self.list.count == 9)
        for name in ["com", "co.uk", "x.ck", "github.io", "a.compute.amazonaws.com", "xn--55qx5d.cn", "anything"] {
            #expect(Self.list.isPublicSuffix(name), "\(name)")
        }
        for name in ["example.com", "www.ck", "ck.example", "compute.amazonaws.com", "a.b.ck", "", "a..b"] {
            #expect(!Self.list.isPublicSuffix(name), "\(name)")
        }
    }

    @Test("what a name constraint for a name would cover")
    func covered() {
        #expect(Self.list.suffixCovered(by: "co.uk") == "co.uk")
        #expect(Self.list.suffixCovered(by: "amazonaws.com") == "*.compute.amazonaws.com")
        #expect(Self.list.suffixCovered(by: "compute.amazonaws.com") == "*.compute.amazonaws.com")
        #expect(Self.list.suffixCovered(by: "example.co.uk") == nil)
        #expect(Self.list.suffixCovered(by: "www.ck") == nil)
    }

    @Test(
        "Punycode as RFC 3492 and the list's own IDN rules give it",
        arguments: [
            ("公司", "55qx5d"), ("中国", "fiqs8s"), ("рф", "p1ai"), ("bücher", "bcher-kva"), ("münchen", "mnchen-3ya"),
            ("ü", "tda"),
        ])
    func punycode(label: String, encoded: String) {
        #expect(Punycode.encode(label) == encoded)
    }
}
