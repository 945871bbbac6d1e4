import BackstopCore
import Testing

private let H = ConfigFixture.head
private func U(_ extra: String = "", keychain: Bool = false) -> String {
    ConfigFixture.upstream(extra, keychain: keychain)
}

/// Every kind of config error names the exact line and column of the offending node: the key for unknown keys,
/// the value for bad values, the later node for duplicates and overlaps, the mapping for missing keys.
@Suite("Config error positions")
struct ConfigErrorPositionTests {
    @Test(
        "top level: unknown keys, version, listen presence",
        arguments: [
            ErrorCase(H + "lisen: []\n", at: "lisen", "did you mean 'listen'"),
            ErrorCase(H + "upstream: []\n", at: "upstream:", "did you mean 'upstreams'"),
            ErrorCase(H + "frobnicate: 1\n", at: "frobnicate", "unknown key 'frobnicate' in 'config'"),
            ErrorCase("version: 2\nlisten: [127.0.0.1:8080]\n", at: "2", "version"),
            ErrorCase("version: one\nlisten: [127.0.0.1:8080]\n", at: "one", "whole number"),
            ErrorCase("version: [1]\nlisten: [127.0.0.1:8080]\n", at: "[1]", "single value"),
            ErrorCase("listen: [127.0.0.1:8080]\n", at: "listen", "missing required key 'version'"),
            ErrorCase("version: 1\n", at: "version", "missing required key 'listen'"),
            ErrorCase("- 1\n", at: "-", "must be a mapping"),
            ErrorCase("", at: "", "empty"),
            ErrorCase("# only a comment\n", at: "#", "empty"),
        ])
    func topLevel(c: ErrorCase) { expectSingleError(c) }

    @Test("YAML syntax errors carry Yams's position")
    func syntax() {
        let cases: [(String, Int, Int)] = [
            ("version: 1\nlisten: [127.0.0.1:8080\n", 3, 1),
            ("version: 1\nlisten:\n\t- 127.0.0.1:8080\n", 3, 1),
            ("version: 1\nlisten: [127.0.0.1:8080]\nlog: {level: \"info}\n", 4, 1),
            ("version: 1\n  listen: x\n", 2, 9),
        ]
        for (yaml, line, column) in cases {
            let found = ConfigFixture.errors(yaml)
            #expect(found.count == 1, "\(found)")
            #expect(found.first?.location == SourceLocation(file: "t.yaml", line: line, column: column), "\(found)")
            #expect(found.first?.message.contains("YAML syntax error") == true, "\(found)")
        }
    }

    @Test(
        "duplicate keys point at the later key",
        arguments: [
            ErrorCase(H + "version: 1\n", at: "version", 2, "duplicate key 'version'"),
            ErrorCase(H + "log: {level: info, level: debug}\n", at: "level", 2, "duplicate key 'level'"),
            ErrorCase(U("url: http://b.test"), at: "url", 2, "duplicate key 'url'"),
            ErrorCase(H + "log:\n  level: info\n  # comment\n\n  level: debug\n", at: "level", 2, "first at line 4"),
        ])
    func duplicateKeys(c: ErrorCase) { expectSingleError(c) }

    @Test(
        "listen",
        arguments: [
            ErrorCase("version: 1\nlisten: []\n", at: "[]", "at least one"),
            ErrorCase("version: 1\nlisten: 127.0.0.1:8080\n", at: "127", "must be a list"),
            ErrorCase("version: 1\nlisten: [127.0.0.1:70000]\n", at: "127", "0 to 65535"),
            ErrorCase("version: 1\nlisten: [127.0.0.1]\n", at: "127", "HOST:PORT"),
            ErrorCase("version: 1\nlisten: [\"127.0.0.1:\"]\n", at: "\"127", "port"),
            ErrorCase("version: 1\nlisten: [\"[zz::1]:80\"]\n", at: "\"[zz", "not an IPv6 address"),
            ErrorCase("version: 1\nlisten: [\"::1:80\"]\n", at: "\"::1", "[::1]:8080"),
            ErrorCase("version: 1\nlisten: [example.com:80]\n", at: "example", "not an IP address or localhost"),
            ErrorCase("version: 1\nlisten: [\"unix:\"]\n", at: "\"unix", "socket path"),
            ErrorCase("version: 1\nlisten: [0.0.0.0:8080]\n", at: "0.0.0.0", "allow_remote"),
            ErrorCase("version: 1\nlisten: [\"[::]:8080\"]\n", at: "\"[::]", "allow_remote"),
            ErrorCase("version: 1\nlisten: [10.1.2.3:80]\n", at: "10.1", "not loopback"),
            ErrorCase(
                "version: 1\nlisten:\n  - address: 10.1.2.3:80\n    allow_remote: false\n", at: "10.1", "allow_remote"),
            ErrorCase(
                "version: 1\nlisten:\n  - {address: 10.1.2.3:80, allow_remote: true, allow_clients: [300.0.0.0/8]}\n",
                at: "300", "not a CIDR"),
            ErrorCase(
                "version: 1\nlisten:\n  - {address: 127.0.0.1:80, allow_clients: [10.0.0.0/33]}\n", at: "10.0", "CIDR"),
            ErrorCase(
                "version: 1\nlisten:\n  - {address: 127.0.0.1:80, allow_remote: maybe}\n", at: "maybe", "true or false"),
            ErrorCase(
                "version: 1\nlisten:\n  - {address: 127.0.0.1:80, allow_remot: true}\n", at: "allow_remot",
                "did you mean 'allow_remote'"),
            ErrorCase("version: 1\nlisten:\n  - {allow_remote: true}\n", at: "{", "needs 'address'"),
            ErrorCase(
                "version: 1\nlisten: [127.0.0.1:80, localhost:81, 127.0.0.1:80]\n", at: "127.0.0.1:80", 2,
                "duplicate listen address"),
            ErrorCase(
                "version: 1\nlisten:\n  - unix:/run/p.sock\n  - {address: unix:/run/p.sock}\n", at: "unix", 2,
                "duplicate listen address unix:/run/p.sock"),
            ErrorCase(
                "version: 1\nlisten: [\"unix:/run/\(String(repeating: "s", count: 110)).sock\"]\n", at: "\"unix", 1,
                "a unix socket's path holds at most 107"),
            ErrorCase("version: 1\nlisten: [\"unix:rel.sock\\0x\"]\n", at: "\"unix", 1, "NUL (U+0000)"),
            ErrorCase(
                "version: 1\nlisten: [127.0.0.1:80]\nkeychain: {path: s/x, key_file: s/./x}\n", at: "s/./x", 1,
                "names the keychain file itself"),
            // Written differently, bound the same: the bind would fail at run.
            ErrorCase(
                "version: 1\nlisten: [\"[::1]:80\", \"[0:0:0:0:0:0:0:1]:80\"]\n", at: "\"[0:0", 1,
                "duplicate listen address [0:0:0:0:0:0:0:1]:80 (it binds what [::1]:80 binds)"),
            ErrorCase(
                "version: 1\nlisten: [127.0.0.1:80, localhost:80]\n", at: "localhost", 1,
                "(it binds what 127.0.0.1:80 binds)"),
            ErrorCase(
                "version: 1\nlisten: [127.0.0.1:80, {address: 0.0.0.0:80, allow_remote: true}]\n", at: "0.0.0.0", 1,
                "(it binds what 127.0.0.1:80 binds)"),
        ])
    func listen(c: ErrorCase) { expectSingleError(c) }

    @Test(
        "admin, log, keychain, limits, unmatched",
        arguments: [
            ErrorCase(H + "admin: {listen: 0.0.0.0:9901}\n", at: "0.0.0.0", "allow_remote"),
            ErrorCase(H + "admin: {allow_remote: true}\n", at: "{", "needs 'listen'"),
            ErrorCase(H + "admin: {listen: 127.0.0.1:9901, lisen: x}\n", at: "lisen", "did you mean 'listen'"),
            ErrorCase(H + "admin: {listen: 127.0.0.1:8080}\n", at: "127.0.0.1:8080", 2, "also a proxy listener"),
            ErrorCase(
                H + "admin: {listen: \"localhost:8080\"}\n", at: "\"localhost", 1,
                "also a proxy listener (it binds what 127.0.0.1:8080 binds)"),
            ErrorCase(H + "admin: 127.0.0.1:9901\n", at: "127.0.0.1:9901", "must be a mapping"),
            ErrorCase(H + "log: {level: loud}\n", at: "loud", "trace | debug | info | notice | warning | error"),
            ErrorCase(H + "log: {format: xml}\n", at: "xml", "logfmt | json"),
            ErrorCase(H + "log: {access_log: sometimes}\n", at: "sometimes", "true or false"),
            ErrorCase(H + "keychain: {path: k, key_file: a, key_credential: b}\n", at: "key_credential", "not both"),
            ErrorCase(H + "keychain: {path: k}\n", at: "{", "needs 'key_file'"),
            ErrorCase(H + "keychain: {key_file: a}\n", at: "{", "needs 'path'"),
            ErrorCase(H + "keychain: {path: k, key_credential: a/b}\n", at: "a/b", "not a path"),
            ErrorCase(H + "keychain: {path: k, key_file: a, key_fil: b}\n", at: "key_fil:", "did you mean 'key_file'"),
            ErrorCase(H + "keychain: {path: \"\", key_file: a}\n", at: "\"\"", "must not be empty"),
            ErrorCase(H + "limits: {retry_buffer: lots}\n", at: "lots", "not a size"),
            ErrorCase(H + "limits: {max_request_body: -1}\n", at: "-1", "not a size"),
            ErrorCase(H + "limits: {max_header_bytes: 100}\n", at: "100", "at least 1KiB"),
            ErrorCase(H + "limits: {max_header_bytes: 65MiB}\n", at: "65MiB", "at most 64MiB"),
            ErrorCase(H + "limits: {client_idle_timeout: 5}\n", at: "5", "not a duration"),
            ErrorCase(H + "limits: {client_idle_timeout: 0s}\n", at: "0s", "above 0"),
            ErrorCase(H + "limits: {max_connections: 0}\n", at: "0}", "between 1 and 1000000"),
            ErrorCase(H + "limits: {max_connection: 5}\n", at: "max_connection", "did you mean 'max_connections'"),
            ErrorCase(H + "unmatched: allow\n", at: "allow", "reject | passthrough"),
        ])
    func sections(c: ErrorCase) { expectSingleError(c) }

    @Test(
        "upstream shape, name, url",
        arguments: [
            ErrorCase(H + "upstreams: {a: 1}\n", at: "{", "must be a list"),
            ErrorCase(H + "upstreams: [api]\n", at: "api", "must be a mapping"),
            ErrorCase(H + "upstreams:\n  - match: {hosts: [a]}\n    url: http://a\n", at: "match", "needs 'name'"),
            ErrorCase(
                H + "upstreams:\n  - name: Bad\n    match: {hosts: [a]}\n    url: http://a\n", at: "Bad", "[a-z0-9_-]+"),
            ErrorCase(H + "upstreams:\n  - name: a\n    url: http://a\n", at: "name", "needs 'match'"),
            ErrorCase(H + "upstreams:\n  - name: a\n    match: {hosts: [a]}\n", at: "name", "needs 'url'"),
            ErrorCase(U("tsl: {}"), at: "tsl", "did you mean 'tls'"),
            ErrorCase(
                H + "upstreams:\n  - name: a\n    match: {hosts: [a]}\n    url: ftp://a\n", at: "ftp",
                "http:// or https://"),
            ErrorCase(
                H + "upstreams:\n  - name: a\n    match: {hosts: [a]}\n    url: a.test\n", at: "a.test",
                "http:// or https://"),
            ErrorCase(
                H + "upstreams:\n  - name: a\n    match: {hosts: [a]}\n    url: http://a/x?y=1\n", at: "http://a/",
                "?query"),
            ErrorCase(
                H + "upstreams:\n  - name: a\n    match: {hosts: [a]}\n    url: http://a/x#f\n", at: "http://a/",
                "fragment"),
            ErrorCase(
                H + "upstreams:\n  - name: a\n    match: {hosts: [a]}\n    url: http://u:p@a/\n", at: "http://u", "user"
            ),
            ErrorCase(
                H + "upstreams:\n  - name: a\n    match: {hosts: [a]}\n    url: \"http://\"\n", at: "\"http", "host"),
            ErrorCase(
                H + "upstreams:\n  - name: a\n    match: {hosts: [a]}\n    url: http://a:99999/\n", at: "http://a:",
                "host"),
            ErrorCase(
                H + "upstreams:\n  - name: a\n    match: {hosts: [a]}\n    url: \"http://a /x\"\n", at: "\"http",
                "spaces"),
        ])
    func upstreamShape(c: ErrorCase) { expectSingleError(c) }

    @Test(
        "match",
        arguments: [
            ErrorCase(
                H + "upstreams:\n  - name: a\n    match: {hosts: [a.test:80]}\n    url: http://a\n", at: "a.test:80",
                "no port"),
            ErrorCase(
                H + "upstreams:\n  - name: a\n    match: {hosts: [a.*.com]}\n    url: http://a\n", at: "a.*", "wildcard"
            ),
            ErrorCase(
                H + "upstreams:\n  - name: a\n    match: {hosts: [\"*\"]}\n    url: http://a\n", at: "\"*\"", "wildcard"
            ),
            ErrorCase(
                H + "upstreams:\n  - name: a\n    match: {hosts: [\"*.*.a\"]}\n    url: http://a\n", at: "\"*.*",
                "wildcard"),
            ErrorCase(
                H + "upstreams:\n  - name: a\n    match: {hosts: [a..b]}\n    url: http://a\n", at: "a..b", "host name"),
            ErrorCase(
                H + "upstreams:\n  - name: a\n    match: {hosts: [a.test, A.TEST]}\n    url: http://a\n", at: "A.TEST",
                "twice"),
            ErrorCase(
                H + "upstreams:\n  - name: a\n    match: {hosts: a.test}\n    url: http://a\n", at: "a.test}",
                "must be a list"),
            ErrorCase(
                H + "upstreams:\n  - name: a\n    match: {path_prefix: api}\n    url: http://a\n", at: "api",
                "start with '/'"),
            ErrorCase(
                H + "upstreams:\n  - name: a\n    match: {path_prefix: /a?b}\n    url: http://a\n", at: "/a?b",
                "no query"),
            ErrorCase(
                H + "upstreams:\n  - name: a\n    match: {path_prefix: /a, strip_prefix: 2}\n    url: http://a\n",
                at: "2}", "true or false"),
            ErrorCase(H + "upstreams:\n  - name: a\n    match: {}\n    url: http://a\n", at: "{}", "at least one of"),
            ErrorCase(
                H + "upstreams:\n  - name: a\n    match: {hosts: []}\n    url: http://a\n", at: "{hosts",
                "at least one of"),
            ErrorCase(
                H + "upstreams:\n  - name: a\n    match: {host: [a]}\n    url: http://a\n", at: "host:",
                "did you mean 'hosts'"),
        ])
    func match(c: ErrorCase) { expectSingleError(c) }

    @Test(
        "tls and timeouts",
        arguments: [
            ErrorCase(U("tls: {insecure_skip_verify: maybe}"), at: "maybe", "true or false"),
            ErrorCase(U("tls: {http2: h2}"), at: "h2}", "true or false"),
            ErrorCase(U("tls: {ca: x}"), at: "ca:", "unknown key 'ca'"),
            ErrorCase(U("timeouts: {connect: 0s}"), at: "0s", "above 0"),
            ErrorCase(U("timeouts: {connect: fast}"), at: "fast", "not a duration"),
            ErrorCase(U("timeouts: {connect: 1s, per_try: 5s, total: 1s}"), at: "5s", "longer than timeouts.total"),
            ErrorCase(U("timeouts: {total: 5s}"), at: "5s", "per_try (10.0 seconds) is longer"),
            ErrorCase(U("timeouts: {connect: 5s, per_try: 1s, total: 2s}"), at: "5s", "connect"),
            ErrorCase(U("timeouts: {per_try: 1h, total: 2m, connect: 1s}"), at: "1h", "per_try"),
            ErrorCase(U("timeouts: {per_tries: 1s}"), at: "per_tries", "did you mean 'per_try'"),
        ])
    func timeouts(c: ErrorCase) { expectSingleError(c) }

    @Test(
        "retry",
        arguments: [
            ErrorCase(U("retry: {attempts: 0}"), at: "0}", "between 1 and 100"),
            ErrorCase(U("retry: {attempts: 101}"), at: "101", "between 1 and 100"),
            ErrorCase(U("retry: {attempts: three}"), at: "three", "whole number"),
            ErrorCase(U("retry: {on: [teapot]}"), at: "teapot", "connect-failure, reset, timeout"),
            ErrorCase(U("retry: {on: [503, 600]}"), at: "600", "100-599"),
            ErrorCase(U("retry: {on: [99]}"), at: "99", "100-599"),
            ErrorCase(U("retry: {on: 503}"), at: "503", "must be a list"),
            ErrorCase(U("retry: {methods: [GET, \"GE T\"]}"), at: "\"GE T\"", "not an HTTP method"),
            ErrorCase(U("retry: {methods: [\"GET/\"]}"), at: "\"GET/\"", "not an HTTP method"),
            ErrorCase(U("retry: {retry_non_idempotent_with_key: \"Bad Key\"}"), at: "\"Bad", "header name"),
            ErrorCase(U("retry: {backoff: {base: 2s, max: 1s}}"), at: "2s", "larger than"),
            ErrorCase(U("retry: {backoff: {base: 20s}}"), at: "20s", "larger than"),
            ErrorCase(U("retry: {backoff: {max: 10ms}}"), at: "10ms", "larger than"),
            ErrorCase(U("retry: {backoff: {multiplier: 0.5}}"), at: "0.5", "at least 1"),
            ErrorCase(U("retry: {backoff: {multiplier: big}}"), at: "big", "must be a number"),
            ErrorCase(
                U("retry: {backoff: {strategy: linear}}"), at: "linear",
                "constant | exponential | fibonacci | decorrelated"),
            ErrorCase(U("retry: {backoff: {jitter: half}}"), at: "half", "none | full | equal"),
            ErrorCase(U("retry: {backoff: {jiter: full}}"), at: "jiter", "did you mean 'jitter'"),
            ErrorCase(U("retry: {budget: {ratio: -0.1}}"), at: "-0.1", "at least 0"),
            ErrorCase(U("retry: {budget: {min_per_second: -1}}"), at: "-1", "at least 0"),
            ErrorCase(U("retry: {retry_after: {max: forever}}"), at: "forever", "not a duration"),
            ErrorCase(U("retry: {retry_after: {max: -1s}}"), at: "-1s", "not a duration"),
            ErrorCase(U("retry: {retry_after: {honor: sure}}"), at: "sure", "true or false"),
            ErrorCase(U("retry: {retries: 3}"), at: "retries", "unknown key 'retries'"),
        ])
    func retry(c: ErrorCase) { expectSingleError(c) }

    @Test(
        "auth",
        arguments: [
            ErrorCase(U("auth: {type: magic}", keychain: true), at: "magic", "none | static | oauth2"),
            ErrorCase(U("auth: oauth2", keychain: true), at: "oauth2", "must be a mapping"),
            ErrorCase(U("auth: {type: none, header: X}", keychain: true), at: "header", "unknown key 'header'"),
            ErrorCase(U("auth: {type: static}", keychain: true), at: "{type", "needs 'entry'"),
            ErrorCase(U("auth: {type: static, entry: e, tokn: x}", keychain: true), at: "tokn", "unknown key 'tokn'"),
            ErrorCase(
                U("auth: {type: static, entry: e, header: \"X Key\"}", keychain: true), at: "\"X Key\"", "header name"),
            ErrorCase(
                U("auth: {type: static, entry: e, client_auth_header: drop}", keychain: true), at: "drop",
                "replace | keep"),
            ErrorCase(U("auth: {type: oauth2, keychain_prefix: a}", keychain: true), at: "{type", "needs 'token_url'"),
            ErrorCase(
                U("auth: {type: oauth2, token_url: https://t}", keychain: true), at: "{type", "needs 'keychain_prefix'"),
            ErrorCase(
                U("auth: {type: oauth2, token_url: ftp://t, keychain_prefix: a}", keychain: true), at: "ftp", "http://"),
            ErrorCase(
                U("auth: {type: oauth2, token_url: \"https://t/#x\", keychain_prefix: a}", keychain: true),
                at: "\"http", "fragment"),
            ErrorCase(
                U("auth: {type: oauth2, token_url: https://t, keychain_prefix: a, grant: implicit}", keychain: true),
                at: "implicit", "refresh_token | client_credentials"),
            ErrorCase(
                U(
                    "auth: {type: oauth2, token_url: https://t, keychain_prefix: a, grant: client_credentials}",
                    keychain: true), at: "client_credentials", "needs 'client_id'"),
            ErrorCase(
                U(
                    "auth: {type: oauth2, token_url: https://t, keychain_prefix: a, refresh_on: [401, 99]}",
                    keychain: true),
                at: "99", "between 100 and 599"),
            ErrorCase(
                U(
                    "auth: {type: oauth2, token_url: https://t, keychain_prefix: a, refresh_on: [unauthorized]}",
                    keychain: true), at: "unauthorized", "whole number"),
            ErrorCase(
                U(
                    "auth: {type: oauth2, token_url: https://t, keychain_prefix: a, request_format: xml}",
                    keychain: true),
                at: "xml", "form | json"),
            ErrorCase(
                U(
                    "auth: {type: oauth2, token_url: https://t, keychain_prefix: a, refresh_ahead: soon}",
                    keychain: true),
                at: "soon", "not a duration"),
            ErrorCase(
                U("auth: {type: oauth2, token_url: https://t, keychain_prefix: a, fields: {token: t}}", keychain: true),
                at: "token:", "unknown key 'token'"),
            ErrorCase(
                U("auth: {type: oauth2, token_url: https://t, keychain_prefix: a}"), at: "oauth2",
                "no 'keychain' section"),
            ErrorCase(U("auth: {type: static, entry: e}"), at: "static", "no 'keychain' section"),
            // The token endpoint gets the client secret and refresh token: https, or plain http to loopback only.
            ErrorCase(
                U("auth: {type: oauth2, token_url: http://auth.example, keychain_prefix: a}", keychain: true),
                at: "http://auth", "must be https"),
            // Verification of the token endpoint cannot be switched off.
            ErrorCase(
                U(
                    "auth: {type: oauth2, token_url: https://t, keychain_prefix: a, tls: {insecure_skip_verify: true}}",
                    keychain: true), at: "insecure_skip_verify", "unknown key 'insecure_skip_verify'"),
        ])
    func auth(c: ErrorCase) { expectSingleError(c) }
}
