import BackstopCore
import Foundation
import Testing

/// What a valid config turns into: defaults, every key read into the model, paths resolved, the shipped configs.
@Suite("Config values")
struct ConfigValuesTests {
    @Test("a minimal config gets every default")
    func defaults() throws {
        let config = try ConfigFixture.parse(ConfigFixture.upstream())
        #expect(config.version == 1)
        #expect(config.sourceFile == "t.yaml")
        #expect(config.listeners == [ListenerConfig(address: .tcp(host: "127.0.0.1", port: 8080))])
        #expect(config.admin == nil)
        #expect(config.keychain == nil)
        #expect(config.log == LogConfig(level: .info, format: .logfmt, accessLog: true))
        #expect(
            config.limits
                == Limits(
                    maxRequestBody: 8 << 20, retryBuffer: 1 << 20, maxHeaderBytes: 64 << 10,
                    clientIdleTimeout: .seconds(60), maxConnections: 4096))
        #expect(config.unmatched == .reject)
        let upstream = try #require(config.upstreams.first)
        #expect(upstream.name == "a")
        #expect(upstream.match.hosts == ["a.test"] && upstream.match.pathPrefix == nil && upstream.match.stripPrefix)
        #expect(upstream.url == UpstreamURL(scheme: "http", host: "a.test", port: nil, basePath: ""))
        #expect(upstream.tls == TLSConfig(caFile: nil, insecureSkipVerify: false, http2: false))
        #expect(upstream.timeouts == Timeouts(connect: .seconds(2), perTry: .seconds(10), total: .seconds(30)))
        #expect(upstream.retry.attempts == 3)
        #expect(
            upstream.retry.on == [
                .connectFailure, .reset, .timeout, .status(429), .status(502), .status(503),
                .status(504),
            ])
        #expect(upstream.retry.methods == ["GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"])
        #expect(upstream.retry.retryNonIdempotentWithKey == "Idempotency-Key")
        #expect(
            upstream.retry.backoff
                == BackoffConfig(
                    strategy: .exponential, base: .milliseconds(100),
                    max: .seconds(10), multiplier: 2, jitter: .full))
        #expect(upstream.retry.retryAfter == RetryAfterConfig(honor: true, max: .seconds(60)))
        #expect(upstream.retry.budget == BudgetConfig(ratio: 0.2, minPerSecond: 10))
        #expect(upstream.auth == .none)
        #expect(upstream.location == SourceLocation(file: "t.yaml", line: 4, column: 5))
        #expect(upstream.match.hostLocations == [SourceLocation(file: "t.yaml", line: 5, column: 21)])
    }

    @Test("every key is read into the model")
    func everyKey() throws {
        let config = try ConfigFixture.parse(
            """
            version: 1
            listen:
              - "[::1]:9000"
              - unix:/run/p.sock
              - {address: 0.0.0.0:0, allow_remote: yes, allow_clients: [10.0.0.0/8, "fd00::/8", 192.168.1.7]}
              - LOCALHOST:65535
            admin: {listen: "[::]:9901", allow_remote: true, allow_clients: [10.1.0.0/16]}
            log: {level: debug, format: json, access_log: false}
            keychain: {path: /k.bkc, key_credential: keychain.key}
            limits: {max_request_body: 1MB, retry_buffer: 512KiB, max_header_bytes: 2048, client_idle_timeout: 1.5s,
                     max_connections: 7}
            unmatched: passthrough
            upstreams:
              - name: api_2-x
                match: {hosts: [API.Example.com, "*.Example.COM", "[::1]", 10.0.0.1], path_prefix: /v1//, strip_prefix: off}
                url: HTTPS://Api.Example.com:8443/base//
                tls: {ca_file: ./ca.pem, insecure_skip_verify: true, http2: true}
                timeouts: {connect: 250ms, per_try: 1s, total: 5m, idle: 90s}
                retry:
                  attempts: 5
                  on: [reset, 500]
                  methods: [get, post, M-SEARCH]
                  retry_non_idempotent_with_key: ""
                  backoff: {strategy: decorrelated, base: 50us, max: 1h, multiplier: 1.5, jitter: equal}
                  retry_after: {honor: false, max: 0s}
                  budget: {ratio: 0, min_per_second: 0.5}
                auth:
                  type: oauth2
                  token_url: https://auth.example.com/token?aud=x
                  tls: {ca_file: auth-ca.pem}
                  grant: client_credentials
                  request_format: json
                  client_id: me
                  client_secret_entry: api/secret
                  scope: ""
                  keychain_prefix: api
                  fields: {access_token: at, refresh_token: rt, expires_in: ttl}
                  header: X-Token
                  scheme: ""
                  refresh_on: [401, 403]
                  refresh_ahead: 0s
                  client_auth_header: keep
              - name: s
                match: {path_prefix: /}
                url: http://[::1]:80
                auth: {type: static, entry: s/token}
            """)
        #expect(
            config.listeners == [
                ListenerConfig(address: .tcp(host: "::1", port: 9000)),
                ListenerConfig(address: .unix(path: "/run/p.sock")),
                ListenerConfig(
                    address: .tcp(host: "0.0.0.0", port: 0), allowRemote: true,
                    allowClients: [
                        CIDR(address: [10, 0, 0, 0], prefixLength: 8),
                        CIDR(address: [0xfd] + Array(repeating: 0, count: 15), prefixLength: 8),
                        CIDR(address: [192, 168, 1, 7], prefixLength: 32),
                    ]),
                ListenerConfig(address: .tcp(host: "localhost", port: 65535)),
            ])
        #expect(
            config.admin
                == AdminConfig(
                    address: .tcp(host: "::", port: 9901), allowRemote: true,
                    allowClients: [CIDR(address: [10, 1, 0, 0], prefixLength: 16)]))
        #expect(config.log == LogConfig(level: .debug, format: .json, accessLog: false))
        #expect(config.keychain?.path == "/k.bkc")
        #expect(config.keychain?.key == .credential(name: "keychain.key"))
        #expect(config.keychain?.keyLocation == SourceLocation(file: "t.yaml", line: 9, column: 42))
        #expect(
            config.limits
                == Limits(
                    maxRequestBody: 1_000_000, retryBuffer: 524_288, maxHeaderBytes: 2048,
                    clientIdleTimeout: .milliseconds(1500), maxConnections: 7))
        #expect(config.unmatched == .passthrough)
        #expect(config.upstreams.count == 2)
        let api = config.upstreams[0]
        #expect(api.name == "api_2-x")
        #expect(api.match.hosts == ["api.example.com", "*.example.com", "::1", "10.0.0.1"])
        #expect(api.match.pathPrefix == "/v1")
        #expect(api.match.pathPrefixLocation == SourceLocation(file: "t.yaml", line: 15, column: 88))
        #expect(!api.match.stripPrefix)
        #expect(api.url == UpstreamURL(scheme: "https", host: "api.example.com", port: 8443, basePath: "/base"))
        #expect(api.tls == TLSConfig(caFile: "/etc/backstop/ca.pem", insecureSkipVerify: true, http2: true))
        #expect(
            api.timeouts
                == Timeouts(connect: .milliseconds(250), perTry: .seconds(1), total: .seconds(300), idle: .seconds(90)))
        #expect(
            api.retry
                == RetryConfig(
                    attempts: 5, on: [.reset, .status(500)], methods: ["GET", "POST", "M-SEARCH"],
                    retryNonIdempotentWithKey: nil,
                    backoff: BackoffConfig(
                        strategy: .decorrelated, base: .microseconds(50), max: .seconds(3600), multiplier: 1.5,
                        jitter: .equal),
                    retryAfter: RetryAfterConfig(honor: false, max: .zero),
                    budget: BudgetConfig(ratio: 0, minPerSecond: 0.5)))
        #expect(
            api.auth
                == .oauth2(
                    OAuth2Config(
                        tokenURL: "https://auth.example.com/token?aud=x", grant: .clientCredentials,
                        requestFormat: .json,
                        clientID: "me", clientSecretEntry: "api/secret", scope: "", keychainPrefix: "api",
                        fields: TokenFields(accessToken: "at", refreshToken: "rt", expiresIn: "ttl"), header: "X-Token",
                        scheme: "",
                        refreshOn: [401, 403], refreshAhead: .zero, clientAuthHeader: .keep,
                        tls: TokenEndpointTLS(caFile: "/etc/backstop/auth-ca.pem"))))
        let s = config.upstreams[1]
        #expect(s.match.pathPrefix == "/" && s.match.stripPrefix)
        #expect(s.url == UpstreamURL(scheme: "http", host: "::1", port: 80, basePath: ""))
        #expect(s.url.hostHeader == "[::1]")
        #expect(
            s.auth
                == .staticToken(
                    StaticAuthConfig(
                        entry: "s/token", header: "Authorization", scheme: "Bearer",
                        clientAuthHeader: .replace)))
    }

    @Test("relative paths resolve against the config's directory")
    func relativePaths() throws {
        let config = try ConfigFixture.parse(
            """
            version: 1
            listen: [127.0.0.1:8080, unix:run/p.sock, "unix:./q.sock"]
            keychain: {path: state/k.bkc, key_file: ././k.key}
            upstreams:
              - name: a
                match: {hosts: [a.test]}
                url: https://a.test
                tls: {ca_file: ../ca.pem}
            """)
        #expect(config.listeners[1].address == .unix(path: "/etc/backstop/run/p.sock"))
        #expect(config.listeners[2].address == .unix(path: "/etc/backstop/q.sock"))
        #expect(
            config.keychain
                == KeychainConfig(
                    path: "/etc/backstop/state/k.bkc", key: .file(path: "/etc/backstop/k.key"),
                    keyLocation: SourceLocation(file: "t.yaml", line: 3, column: 41)))
        #expect(config.upstreams[0].tls.caFile == "/etc/backstop/../ca.pem")
        let root = try ConfigLoader.parse(yaml: "version: 1\nlisten: [unix:p.sock]\n", file: "x", baseDirectory: "/")
        #expect(root.listeners[0].address == .unix(path: "/p.sock"))
    }

    @Test("load reads a file and resolves paths against its directory; a relative directory becomes absolute")
    func loadFromDisk() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("backstop-config-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let file = dir.appendingPathComponent("b.yaml").path
        try "version: 1\nlisten: [unix:s.sock]\n".write(toFile: file, atomically: true, encoding: .utf8)
        let config = try ConfigLoader.load(path: file)
        #expect(config.sourceFile == file)
        #expect(config.listeners[0].address == .unix(path: dir.path + "/s.sock"))

        let relative = try ConfigLoader.parse(
            yaml: "version: 1\nlisten: [unix:s.sock]\n", file: "x", baseDirectory: "sub")
        let cwd = FileManager.default.currentDirectoryPath
        #expect(relative.listeners[0].address == .unix(path: cwd + "/sub/s.sock"))
    }

    @Test("an unreadable file is one error at 1:1 naming the problem")
    func unreadable() {
        for (path, reason) in [("/nonexistent-dir/backstop.yaml", "No such file"), ("/", "Is a directory")] {
            do {
                _ = try ConfigLoader.load(path: path)
                Issue.record("expected an error for \(path)")
            } catch {
                #expect(error.errors.count == 1)
                #expect(error.errors.first?.location == SourceLocation(file: path, line: 1, column: 1))
                #expect(error.errors.first?.message.contains("cannot read config file") == true)
                #expect(error.errors.first?.message.contains(reason) == true, "\(error)")
            }
        }
    }

    @Test("check output format is FILE:LINE:COLUMN: message")
    func errorFormat() {
        do {
            _ = try ConfigLoader.parse(
                yaml: "version: 1\nlisten: [127.0.0.1:8080]\nlog: {level: loud}\n",
                file: "/etc/backstop/backstop.yaml", baseDirectory: "/etc/backstop")
            Issue.record("expected an error")
        } catch {
            #expect(error.description.hasPrefix("/etc/backstop/backstop.yaml:3:14: 'log.level' must be one of"))
        }
    }

    static let repository = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    @Test("config/backstop.reference.yaml loads and shows every default")
    func referenceConfig() throws {
        let path = Self.repository.appendingPathComponent("config/backstop.reference.yaml").path
        let config = try ConfigLoader.load(path: path)
        #expect(config.log == LogConfig())
        #expect(config.limits == Limits())
        #expect(config.unmatched == .reject)
        #expect(config.admin == AdminConfig(address: .tcp(host: "127.0.0.1", port: 9901), allowRemote: false))
        let api = try #require(config.upstreams.first)
        #expect(api.match.stripPrefix)
        #expect(api.tls.insecureSkipVerify == false)
        #expect(api.timeouts == Timeouts())
        #expect(api.retry == RetryConfig())
        #expect(api.balance == .failover && api.circuit == CircuitConfig() && api.hedge == HedgeConfig())
        guard case .oauth2(let oauth) = api.auth else {
            Issue.record("reference upstream should use oauth2")
            return
        }
        let defaults = OAuth2Config(tokenURL: oauth.tokenURL, keychainPrefix: oauth.keychainPrefix)
        #expect(oauth.grant == defaults.grant && oauth.requestFormat == defaults.requestFormat)
        #expect(oauth.fields == defaults.fields && oauth.header == defaults.header && oauth.scheme == defaults.scheme)
        #expect(oauth.refreshOn == defaults.refreshOn && oauth.refreshAhead == defaults.refreshAhead)
        #expect(oauth.clientAuthHeader == defaults.clientAuthHeader)
    }

    @Test("config/backstop.yaml, when present, loads")
    func sampleConfig() throws {
        let path = Self.repository.appendingPathComponent("config/backstop.yaml").path
        guard FileManager.default.fileExists(atPath: path) else { return }
        let config = try ConfigLoader.load(path: path)
        #expect(!config.listeners.isEmpty)
    }
}
