import BackstopCore
import Testing

/// `ConfigLoader`: defaults, paths, and that every kind of error names the right line and column.
@Suite("Config loader")
struct ConfigLoaderCoreTests {
    private func load(_ yaml: String) throws(ConfigErrors) -> Config {
        try ConfigLoader.parse(yaml: yaml, file: "t.yaml", baseDirectory: "/etc/backstop")
    }

    /// The errors of `yaml`, as "LINE:COLUMN message" strings.
    private func errors(_ yaml: String) -> [ConfigError] {
        do {
            _ = try load(yaml)
            return []
        } catch {
            return error.errors
        }
    }

    private func expectError(_ yaml: String, at line: Int, _ column: Int, mentioning word: String,
                             sourceLocation: Testing.SourceLocation = #_sourceLocation) {
        let found = errors(yaml)
        #expect(!found.isEmpty, "expected an error", sourceLocation: sourceLocation)
        guard let first = found.first else { return }
        #expect(first.location.line == line && first.location.column == column,
                "got \(first)", sourceLocation: sourceLocation)
        #expect(first.message.lowercased().contains(word.lowercased()), "got \(first)", sourceLocation: sourceLocation)
    }

    @Test("a minimal config gets every default")
    func defaults() throws {
        let config = try load("version: 1\nlisten: [127.0.0.1:8080]\nupstreams:\n  - name: a\n    match: {hosts: [A.test]}\n    url: https://a.test/base/\n")
        #expect(config.listeners == [ListenerConfig(address: .tcp(host: "127.0.0.1", port: 8080))])
        #expect(config.admin == nil)
        #expect(config.log == LogConfig())
        #expect(config.limits == Limits())
        #expect(config.unmatched == .reject)
        let upstream = try #require(config.upstreams.first)
        #expect(upstream.match.hosts == ["a.test"])
        #expect(upstream.url == UpstreamURL(scheme: "https", host: "a.test", port: nil, basePath: "/base"))
        #expect(upstream.timeouts == Timeouts())
        #expect(upstream.retry == RetryConfig())
        #expect(upstream.auth == .none)
    }

    @Test("relative paths resolve against the config's directory")
    func relativePaths() throws {
        let config = try load("""
            version: 1
            listen: [127.0.0.1:8080, unix:run/p.sock]
            keychain: {path: state/k.bkc, key_file: ./k.key}
            upstreams:
              - name: a
                match: {hosts: [a.test]}
                url: https://a.test
                tls: {ca_file: ca.pem}
            """)
        #expect(config.listeners[1].address == .unix(path: "/etc/backstop/run/p.sock"))
        #expect(config.keychain?.path == "/etc/backstop/state/k.bkc")
        #expect(config.keychain?.key == .file(path: "/etc/backstop/k.key"))
        #expect(config.upstreams[0].tls.caFile == "/etc/backstop/ca.pem")
    }

    @Test("IPv6 listeners, long form with allow_remote and CIDRs")
    func listeners() throws {
        let config = try load("""
            version: 1
            listen:
              - "[::1]:9000"
              - {address: 0.0.0.0:8081, allow_remote: true, allow_clients: [10.0.0.0/8, "fd00::/8"]}
            """)
        #expect(config.listeners[0].address == .tcp(host: "::1", port: 9000))
        #expect(config.listeners[1].allowRemote)
        #expect(config.listeners[1].allowClients.map(\.description) == ["10.0.0.0/8", "fd00:0:0:0:0:0:0:0/8"])
    }

    @Test("error positions", arguments: [
        ("version: 1\nlisten: [127.0.0.1:8080\n", 3, 1, "syntax"),
        ("version: 1\nlisten: [127.0.0.1:8080]\nlisen: []\n", 3, 1, "did you mean 'listen'"),
        ("version: 1\nlisten: [127.0.0.1:8080]\nlog: {level: loud}\n", 3, 14, "level"),
        ("version: 2\nlisten: [127.0.0.1:8080]\n", 1, 10, "version"),
        ("listen: [127.0.0.1:8080]\n", 1, 1, "version"),
        ("version: 1\nlisten: [10.1.2.3:80]\n", 2, 10, "allow_remote"),
        ("version: 1\nlisten:\n  - {address: 10.1.2.3:80, allow_clients: [300.0.0.0/8]}\n", 3, 15, "allow_remote"),
        ("version: 1\nlisten: [127.0.0.1:8080]\nlimits: {retry_buffer: lots}\n", 3, 24, "size"),
        ("version: 1\nlisten: [127.0.0.1:8080]\nlimits: {client_idle_timeout: 5}\n", 3, 31, "duration"),
        ("version: 1\nlisten: [127.0.0.1:8080]\nkeychain: {path: k, key_file: a, key_credential: b}\n", 3, 34, "not both"),
        ("version: 1\nlisten: [127.0.0.1:8080]\nupstreams:\n  - name: Bad\n    match: {hosts: [a]}\n    url: http://a\n", 4, 11, "[a-z0-9_-]+"),
        ("version: 1\nlisten: [127.0.0.1:8080]\nupstreams:\n  - name: a\n    match: {hosts: [a]}\n    url: ftp://a\n", 6, 10, "http"),
        ("version: 1\nlisten: [127.0.0.1:8080]\nupstreams:\n  - name: a\n    match: {path_prefix: api}\n    url: http://a\n", 5, 26, "start with '/'"),
        ("version: 1\nlisten: [127.0.0.1:8080]\nupstreams:\n  - name: a\n    match: {hosts: [a.*.com]}\n    url: http://a\n", 5, 21, "wildcard"),
        ("version: 1\nlisten: [127.0.0.1:8080]\nupstreams:\n  - name: a\n    match: {hosts: [a]}\n    url: http://a\n    retry: {attempts: 101}\n", 7, 23, "between 1 and 100"),
        ("version: 1\nlisten: [127.0.0.1:8080]\nupstreams:\n  - name: a\n    match: {hosts: [a]}\n    url: http://a\n    retry: {on: [teapot]}\n", 7, 18, "teapot"),
        ("version: 1\nlisten: [127.0.0.1:8080]\nupstreams:\n  - name: a\n    match: {hosts: [a]}\n    url: http://a\n    timeouts: {per_try: 5s, total: 1s}\n", 7, 25, "longer than"),
        ("version: 1\nlisten: [127.0.0.1:8080]\nupstreams:\n  - name: a\n    match: {hosts: [a]}\n    url: http://a\n    auth: {type: oauth2, token_url: http://t, keychain_prefix: a}\n", 4, 5, "keychain"),
        ("version: 1\nlisten: [127.0.0.1:8080]\nupstreams:\n  - name: a\n    match: {hosts: [a]}\n    url: http://a\n    auth: {type: magic}\n", 7, 18, "magic"),
    ])
    func positions(yaml: String, line: Int, column: Int, word: String) {
        expectError(yaml, at: line, column, mentioning: word)
    }

    @Test("every error is reported, sorted by position")
    func allErrors() {
        let found = errors("""
            version: 1
            listen: [127.0.0.1:8080]
            log: {level: loud, format: xml}
            limits: {max_connections: 0}
            """)
        #expect(found.count == 3)
        #expect(found.map(\.location.line) == [3, 3, 4])
        #expect(found.allSatisfy { $0.location.file == "t.yaml" })
    }

    @Test("duration, size and CIDR parsers", arguments: [
        ("250ms", Duration.milliseconds(250)), ("2s", .seconds(2)), ("1.5s", .milliseconds(1500)), ("5m", .seconds(300)),
        ("1h", .seconds(3600)), ("100us", .microseconds(100)), ("0s", .zero),
    ])
    func durations(text: String, value: Duration) {
        #expect(DurationParser.parse(text) == value)
    }

    @Test("malformed values are rejected")
    func malformed() {
        for text in ["", "s", "5", "-1s", "1.2.3s", "1 parsec", "∞s"] { #expect(DurationParser.parse(text) == nil, "\(text)") }
        #expect(SizeParser.parse("512KiB") == 524_288)
        #expect(SizeParser.parse("8MiB") == 8_388_608)
        #expect(SizeParser.parse("1GiB") == 1_073_741_824)
        #expect(SizeParser.parse("10KB") == 10_000)
        #expect(SizeParser.parse("1048576") == 1_048_576)
        for text in ["", "lots", "-1", "1.5.5MiB", "99999999999999999GiB"] { #expect(SizeParser.parse(text) == nil, "\(text)") }
        #expect(CIDRParser.parse("10.0.0.0/8") == CIDR(address: [10, 0, 0, 0], prefixLength: 8))
        #expect(CIDRParser.parse("10.0.0.0/33") == nil)
        #expect(CIDRParser.parse("::1/128")?.address == Array(repeating: 0, count: 15) + [1])
        #expect(IPAddressParser.isLoopback("127.1.2.3"))
        #expect(IPAddressParser.isLoopback("::1"))
        #expect(IPAddressParser.isLoopback("localhost"))
        #expect(!IPAddressParser.isLoopback("0.0.0.0"))
        #expect(!IPAddressParser.isLoopback("::"))
    }
}
