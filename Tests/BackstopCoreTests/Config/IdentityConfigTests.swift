import BackstopCore
import Foundation
import Testing

private let H = ConfigFixture.head
private let K = "keychain: {path: k.bkc, key_file: k.key}\n"

/// An oauth2 upstream over https with `lines` (indented under `auth`) added.
private func oauth(_ lines: String, url: String = "https://idp.test/token") -> String {
    H + K + "upstreams:\n  - name: p\n    match: {hosts: [p.test]}\n    url: https://p.test\n    auth:\n"
        + "      type: oauth2\n      token_url: \(url)\n      keychain_prefix: p\n      grant: client_credentials\n"
        + lines.split(separator: "\n").map { "      " + $0 }.joined(separator: "\n") + "\n"
}

/// An aws_sigv4 upstream with `lines` under `auth`.
private func aws(_ lines: String, url: String = "https://abc.execute-api.eu-west-1.amazonaws.com/prod") -> String {
    H + K
        + "upstreams:\n  - name: aws\n    match: {hosts: [aws.test]}\n    url: \(url)\n    auth:\n      type: aws_sigv4\n"
        + lines.split(separator: "\n").map { "      " + $0 }.joined(separator: "\n") + "\n"
}

private let awsKeys = "access_key_entry: aws/id\nsecret_key_entry: aws/secret"

/// Upstream identity (client certificates, client_auth, aws_sigv4), `clients` and `upgrades`
/// (docs/reference/config.md#upstream-identity).
@Suite("Config: identity")
struct IdentityConfigTests {
    @Test("every identity key is read into the model, and each keychain entry is recorded with what it must hold")
    func fullModel() throws {
        let yaml =
            H + K + """
                upstreams:
                  - name: partner
                    match: {hosts: [partner.test]}
                    url: https://partner.test
                    upgrades: false
                    tls: {client_cert_entry: partner/client}
                    auth:
                      type: oauth2
                      token_url: https://idp.test/oauth/token
                      grant: client_credentials
                      client_id: backstop-prod
                      client_auth: private_key_jwt
                      client_key_entry: idp/signing-key
                      client_key_id: key-2026-11
                      keychain_prefix: partner
                      tls: {client_cert_entry: idp/client}
                  - name: aws
                    match: {hosts: [aws.test]}
                    url: https://abc.execute-api.eu-west-1.amazonaws.com/prod
                    auth:
                      type: aws_sigv4
                      region: eu-west-1
                      service: execute-api
                      access_key_entry: aws/access_key_id
                      secret_key_entry: aws/secret_access_key
                      session_token_entry: aws/session_token
                      payload: unsigned
                clients:
                  - {name: billing-app, match: {unix_user: billing}, upstreams: [partner, aws]}
                  - {name: ops, match: {unix_group: "1000"}, upstreams: "*"}
                  - {name: ci, match: {proxy_auth: ci/proxy}, upstreams: [aws]}

                """
        let config = try ConfigFixture.parse(yaml)
        let partner = config.upstreams[0]
        #expect(partner.upgrades == false)
        #expect(config.upstreams[1].upgrades == true)
        #expect(partner.tls.clientCertEntry == "partner/client")
        guard case .oauth2(let parsed) = partner.auth else {
            Issue.record("not oauth2: \(partner.auth)")
            return
        }
        #expect(parsed.clientAuth == .privateKeyJWT)
        #expect(parsed.clientKeyEntry == "idp/signing-key")
        #expect(parsed.clientKeyID == "key-2026-11")
        #expect(parsed.tls == TokenEndpointTLS(caFile: nil, clientCertEntry: "idp/client"))
        #expect(
            config.upstreams[1].auth
                == .awsSigV4(
                    AWSSigV4Config(
                        region: "eu-west-1", service: "execute-api", accessKeyEntry: "aws/access_key_id",
                        secretKeyEntry: "aws/secret_access_key", sessionTokenEntry: "aws/session_token",
                        payload: .unsigned)))
        #expect(config.clients?.map(\.name) == ["billing-app", "ops", "ci"])
        #expect(
            config.clients?.map(\.match) == [
                .unixUser(.name("billing")), .unixGroup(.id(1000)), .proxyAuth(entry: "ci/proxy"),
            ])
        #expect(config.clients?.map(\.upstreams) == [.only(["partner", "aws"]), .all, .only(["aws"])])
        #expect(
            config.keychainReferences.map(\.entry) == [
                "partner/client", "idp/client", "idp/signing-key", "aws/access_key_id", "aws/secret_access_key",
                "aws/session_token", "ci/proxy",
            ])
        #expect(
            config.keychainReferences.map(\.content) == [
                .clientCertificate, .clientCertificate, .assertionSigningKey, .headerValue, .headerValue, .headerValue,
                .proxyCredentials,
            ])
        let at = try #require(ConfigFixture.position(of: "idp/signing-key", in: yaml))
        #expect(
            config.keychainReferences[2].location == SourceLocation(file: "t.yaml", line: at.line, column: at.column))
        #expect(config.keychainReferences[2].key == "upstream 'partner': auth.client_key_entry")
    }

    @Test("defaults: client_secret_post, signed payload, no clients section, upgrades on")
    func defaults() throws {
        let config = try ConfigFixture.parse(oauth("client_id: c\nclient_secret_entry: p/secret"))
        guard case .oauth2(let parsed) = config.upstreams[0].auth else { throw ConfigErrors([]) }
        #expect(parsed.clientAuth == .clientSecretPost)
        #expect(parsed.tls.clientCertEntry == nil)
        #expect(config.clients == nil)
        #expect(config.upstreams[0].upgrades)
        // Without an explicit client_auth the secret keeps its old meaning: nothing for check --online to require.
        #expect(config.keychainReferences.isEmpty)
        let signed = try ConfigFixture.parse(aws("region: us-east-1\nservice: s3\n" + awsKeys))
        guard case .awsSigV4(let sigv4) = signed.upstreams[0].auth else { throw ConfigErrors([]) }
        #expect(sigv4.payload == .signed)
        #expect(sigv4.sessionTokenEntry == nil)
        let basic = try ConfigFixture.parse(
            oauth("client_id: c\nclient_auth: client_secret_basic\nclient_secret_entry: p/s"))
        #expect(basic.keychainReferences.map(\.entry) == ["p/s"])
        #expect(basic.keychainReferences.map(\.content) == [.secret])
    }

    @Test(
        "client_auth mistakes are reported at the key the rule is about",
        arguments: [
            ErrorCase(oauth("client_id: c\nclient_auth: private_key_jwt"), at: "private_key_jwt", "client_key_entry"),
            ErrorCase(oauth("client_id: c\nclient_auth: tls_client_auth"), at: "tls_client_auth", "client_cert_entry"),
            ErrorCase(
                oauth("client_id: c\nclient_auth: client_secret_basic"), at: "client_secret_basic",
                "client_secret_entry"),
            ErrorCase(oauth("client_id: c\nclient_auth: client_secret_jwt"), at: "client_secret_jwt", "one of"),
            ErrorCase(
                oauth(
                    "client_id: c\nclient_auth: private_key_jwt\nclient_key_entry: key/x\nclient_secret_entry: sec/x"),
                at: "sec/x", "not used"),
            ErrorCase(
                oauth("client_id: c\nclient_secret_entry: sec/x\nclient_key_entry: key/x"), at: "key/x", "only used"),
            ErrorCase(oauth("client_id: c\nclient_key_id: kid-1"), at: "kid-1", "only used"),
            ErrorCase(
                oauth(
                    "client_id: c\nclient_auth: tls_client_auth\ntls: {client_cert_entry: idp/c}",
                    url: "http://127.0.0.1:9/token"), at: "idp/c", "https"),
            ErrorCase(oauth("client_id: c\ntls: {client_cert_entry: idp c}"), at: "idp c", "entry name"),
            ErrorCase(oauth("client_id: c\ntls: {client_cert_file: x}"), at: "client_cert_file", "client_cert_entry"),
        ])
    func clientAuthErrors(c: ErrorCase) { expectSingleError(c) }

    @Test("client_auth methods that identify the client need client_id")
    func clientIDRequired() {
        let yaml =
            H + K + "upstreams:\n  - name: p\n    match: {hosts: [p.test]}\n    url: https://p.test\n    auth:\n"
            + "      type: oauth2\n      token_url: https://idp.test/t\n      keychain_prefix: p\n"
            + "      client_auth: tls_client_auth\n      tls: {client_cert_entry: c}\n"
        let errors = ConfigFixture.errors(yaml)
        #expect(errors.map(\.message) == ["upstream 'p': auth: client_auth tls_client_auth needs 'client_id'"])
    }

    @Test(
        "aws_sigv4 mistakes",
        arguments: [
            ErrorCase(aws("service: s3\n" + awsKeys), at: "type", "region"),
            ErrorCase(aws("region: us-east-1\n" + awsKeys), at: "type", "service"),
            ErrorCase(aws("region: us-east-1\nservice: s3\naccess_key_entry: a"), at: "type", "secret_key_entry"),
            ErrorCase(aws("region: US East\nservice: s3\n" + awsKeys), at: "US East", "region"),
            ErrorCase(aws("region: us-east-1\nservice: s3\npayload: streaming\n" + awsKeys), at: "streaming", "signed"),
            ErrorCase(aws("region: us-east-1\nservice: s3\nheader: X-Auth\n" + awsKeys), at: "header", "unknown key"),
            ErrorCase(
                aws("region: us-east-1\nservice: s3\n" + awsKeys, url: "http://s3.example.com"), at: "aws_sigv4",
                "https"),
        ])
    func awsErrors(c: ErrorCase) { expectSingleError(c) }

    @Test("aws_sigv4 over plain http is fine to a loopback host")
    func awsLoopback() throws {
        let config = try ConfigFixture.parse(
            aws("region: us-east-1\nservice: s3\n" + awsKeys, url: "http://127.0.0.1:9000"))
        #expect(config.upstreams.count == 1)
    }

    @Test(
        "upstream client certificates need https and a keychain; upgrades is a boolean",
        arguments: [
            ErrorCase(ConfigFixture.upstream("tls: {client_cert_entry: a/c}", keychain: true), at: "a/c", "https"),
            ErrorCase(
                H + "upstreams:\n  - name: a\n    match: {hosts: [a.test]}\n    url: https://a.test\n"
                    + "    tls: {client_cert_entry: a/c}\n", at: "a/c", "keychain"),
            ErrorCase(ConfigFixture.upstream("upgrades: sometimes"), at: "sometimes", "true or false"),
        ])
    func upstreamErrors(c: ErrorCase) { expectSingleError(c) }

    static let two =
        H + K + "upstreams:\n  - {name: api, match: {hosts: [api.test]}, url: http://api.test}\n"
        + "  - {name: events, match: {hosts: [ev.test]}, url: http://ev.test}\n"

    @Test(
        "clients mistakes",
        arguments: [
            ErrorCase(
                two + "clients:\n  - {name: a, match: {unix_user: billing}, upstreams: [api, evnets]}\n",
                at: "evnets", "did you mean 'events'"),
            ErrorCase(
                two + "clients:\n  - {name: cl1, match: {unix_user: x}, upstreams: [api]}\n"
                    + "  - {name: cl1, match: {unix_user: y}, upstreams: [api]}\n", at: "cl1", 2,
                "duplicate client name"),
            ErrorCase(
                two + "clients:\n  - {name: a, match: {unix_user: x, proxy_auth: p}, upstreams: [api]}\n",
                at: "proxy_auth", "one of"),
            ErrorCase(two + "clients:\n  - {name: a, match: {}, upstreams: [api]}\n", at: "{}", "needs one of"),
            ErrorCase(
                two + "clients:\n  - {name: a, match: {unix_uid: 5}, upstreams: [api]}\n", at: "unix_uid",
                "unknown key 'unix_uid'"),
            ErrorCase(two + "clients:\n  - {name: a, match: {unix_user: x}, upstreams: []}\n", at: "[]", "empty"),
            ErrorCase(two + "clients:\n  - {name: a, match: {unix_user: x}, upstreams: all}\n", at: "all", "'*'"),
            ErrorCase(
                two + "clients:\n  - {name: a, match: {unix_user: x}, upstreams: [api, \"*\"]}\n", at: "\"*\"",
                "'*' alone"),
            ErrorCase(
                two + "clients:\n  - {name: a, match: {unix_user: x}, upstreams: [api, api]}\n", at: "api", 5,
                "twice"),
            ErrorCase(
                two + "clients:\n  - {name: A B, match: {unix_user: x}, upstreams: [api]}\n", at: "A B", "[a-z0-9_-]+"),
            ErrorCase(
                two + "clients:\n  - {name: a, match: {unix_user: \"x y\"}, upstreams: [api]}\n", at: "\"x y\"",
                "not a user"),
            ErrorCase(
                two + "clients:\n  - {name: a, match: {unix_group: \"4294967295\"}, upstreams: [api]}\n",
                at: "\"4294967295\"", "valid id"),
            ErrorCase(two + "clients:\n  - {name: a, upstreams: [api]}\n", at: "{name", 3, "needs 'match'"),
            ErrorCase(two + "clients: []\n", at: "[]", "at least one"),
            ErrorCase(
                H.replacingOccurrences(
                    of: "[127.0.0.1:8080]", with: "[127.0.0.1:8080, {address: 0.0.0.0:8081, allow_remote: true}]")
                    + K + "upstreams:\n  - {name: api, match: {hosts: [api.test]}, url: http://api.test}\n"
                    + "clients:\n  - {name: a, match: {proxy_auth: a/p}, upstreams: [api]}\n", at: "a/p", "in clear"),
            ErrorCase(
                H + "upstreams:\n  - {name: api, match: {hosts: [api.test]}, url: http://api.test}\n"
                    + "clients:\n  - {name: a, match: {proxy_auth: a/p}, upstreams: [api]}\n", at: "a/p", "keychain"),
        ])
    func clientErrors(c: ErrorCase) { expectSingleError(c) }

    @Test("proxy_auth is fine with unix-socket and loopback listeners; unix matches on any listener")
    func proxyAuthListeners() throws {
        let yaml =
            H.replacingOccurrences(of: "[127.0.0.1:8080]", with: "[\"[::1]:8080\", \"unix:/run/b.sock\"]") + K
            + "upstreams:\n  - {name: api, match: {hosts: [api.test]}, url: http://api.test}\n"
            + "clients:\n  - {name: a, match: {proxy_auth: a/p}, upstreams: [api]}\n"
        #expect(try ConfigFixture.parse(yaml).clients?.count == 1)
        let remote =
            H.replacingOccurrences(of: "[127.0.0.1:8080]", with: "[{address: 0.0.0.0:8081, allow_remote: true}]")
            + "upstreams:\n  - {name: api, match: {hosts: [api.test]}, url: http://api.test}\n"
            + "clients:\n  - {name: a, match: {unix_user: \"0\"}, upstreams: [api]}\n"
        #expect(try ConfigFixture.parse(remote).clients?.first?.match == .unixUser(.id(0)))
    }
}
