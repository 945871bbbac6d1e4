import BackstopCore
import Testing

@Suite("TokenRequestBuilder")
struct TokenRequestBuilderTests {
    static let refreshToken = "a b&c=d+é"
    static let secret = "p\"w\\d/\n\t\u{01}☃"

    static func config(
        grant: OAuth2Grant, format: TokenRequestFormat, scope: String? = "read write:all",
        clientID: String? = "cli~ent_1.0-x"
    ) -> OAuth2Config {
        OAuth2Config(
            tokenURL: "https://auth.example.com/oauth/token", grant: grant, requestFormat: format, clientID: clientID,
            clientSecretEntry: "api/client_secret", scope: scope, keychainPrefix: "api")
    }

    static func body(
        _ config: OAuth2Config, refreshToken: String? = refreshToken, secret: String? = secret
    ) throws
        -> String
    {
        let request = try TokenRequestBuilder.build(config: config, refreshToken: refreshToken, clientSecret: secret)
        return String(decoding: request.body, as: UTF8.self)
    }

    @Test func refreshGrantFormIsByteExact() throws {
        let request = try TokenRequestBuilder.build(
            config: Self.config(grant: .refreshToken, format: .form), refreshToken: Self.refreshToken,
            clientSecret: Self.secret)
        let expected =
            "grant_type=refresh_token&refresh_token=a+b%26c%3Dd%2B%C3%A9&scope=read+write%3Aall"
            + "&client_id=cli~ent_1.0-x&client_secret=p%22w%5Cd%2F%0A%09%01%E2%98%83"
        #expect(request.body == tokenBytes(expected))
        #expect(request.method == "POST")
        #expect(request.url == "https://auth.example.com/oauth/token")
        #expect(request.headers.map(\.name) == ["Content-Type", "Accept"])
        #expect(request.headers.map(\.value) == ["application/x-www-form-urlencoded", "application/json"])
    }

    @Test func refreshGrantJSONIsByteExact() throws {
        let request = try TokenRequestBuilder.build(
            config: Self.config(grant: .refreshToken, format: .json), refreshToken: Self.refreshToken,
            clientSecret: Self.secret)
        let expected =
            #"{"grant_type":"refresh_token","refresh_token":"a b&c=d+é","scope":"read write:all","#
            + #""client_id":"cli~ent_1.0-x","client_secret":"p\"w\\d/\n\t\u0001☃"}"#
        #expect(request.body == tokenBytes(expected))
        #expect(request.headers.map(\.value) == ["application/json", "application/json"])
    }

    @Test func clientCredentialsFormIsByteExact() throws {
        let body = try Self.body(
            Self.config(grant: .clientCredentials, format: .form, clientID: Self.refreshToken), refreshToken: nil)
        #expect(
            body == "grant_type=client_credentials&scope=read+write%3Aall&client_id=a+b%26c%3Dd%2B%C3%A9"
                + "&client_secret=p%22w%5Cd%2F%0A%09%01%E2%98%83")
    }

    @Test func clientCredentialsJSONIsByteExact() throws {
        let body = try Self.body(
            Self.config(grant: .clientCredentials, format: .json, clientID: Self.refreshToken), refreshToken: nil)
        #expect(
            body == #"{"grant_type":"client_credentials","scope":"read write:all","client_id":"a b&c=d+é","#
                + #""client_secret":"p\"w\\d/\n\t\u0001☃"}"#)
    }

    @Test func clientCredentialsIgnoresAnyRefreshToken() throws {
        let body = try Self.body(
            Self.config(grant: .clientCredentials, format: .form, scope: nil, clientID: nil), refreshToken: "rt",
            secret: nil)
        #expect(body == "grant_type=client_credentials")
    }

    @Test func absentAndEmptyOptionalsAreOmitted() throws {
        let none = try Self.body(
            Self.config(grant: .refreshToken, format: .json, scope: nil, clientID: nil), refreshToken: "rt",
            secret: nil)
        #expect(none == #"{"grant_type":"refresh_token","refresh_token":"rt"}"#)
        let empty = try Self.body(
            Self.config(grant: .refreshToken, format: .form, scope: "", clientID: ""), refreshToken: "rt", secret: "")
        #expect(empty == "grant_type=refresh_token&refresh_token=rt")
    }

    @Test func jsonEscapesEveryControlCharacter() throws {
        let secret = "\u{08}\u{0C}\r\u{00}\u{1F}\u{7F}é\u{1F600}"
        let body = try Self.body(
            Self.config(grant: .clientCredentials, format: .json, scope: nil, clientID: nil), secret: secret)
        #expect(body == #"{"grant_type":"client_credentials","client_secret":"\b\f\r\u0000\u001f"# + "\u{7F}é😀\"}")
    }

    @Test func formEscapesEverythingOutsideUnreserved() throws {
        let secret = "AZaz09-._~ !*'()+,/:;=?@[]%#\u{00}\u{7F}"
        let body = try Self.body(
            Self.config(grant: .clientCredentials, format: .form, scope: nil, clientID: nil), secret: secret)
        #expect(
            body == "grant_type=client_credentials&client_secret="
                + "AZaz09-._~+%21%2A%27%28%29%2B%2C%2F%3A%3B%3D%3F%40%5B%5D%25%23%00%7F")
    }

    @Test(arguments: [nil, ""] as [String?], [TokenRequestFormat.form, .json])
    func refreshGrantWithoutRefreshTokenFails(refreshToken: String?, format: TokenRequestFormat) {
        #expect(throws: TokenRequestError.missingRefreshToken) {
            try TokenRequestBuilder.build(
                config: Self.config(grant: .refreshToken, format: format), refreshToken: refreshToken,
                clientSecret: "s")
        }
    }

    @Test func descriptionHidesTheBody() throws {
        let request = try TokenRequestBuilder.build(
            config: Self.config(grant: .refreshToken, format: .form), refreshToken: "SECRET-RT",
            clientSecret: "SECRET-CS")
        for text in [String(describing: request), String(reflecting: request), tokenDumped(request)] {
            #expect(!text.contains("SECRET"))
        }
        #expect(String(describing: request).contains("POST https://auth.example.com/oauth/token"))
    }
}

func tokenDumped(_ value: some Any) -> String {
    var out = ""
    dump(value, to: &out)
    return out
}

/// `client_auth` at the token endpoint (docs/reference/config.md#client-authentication-at-the-token-endpoint).
@Suite("TokenRequestBuilder: client authentication")
struct TokenClientAuthTests {
    static func config(_ method: OAuth2ClientAuth, format: TokenRequestFormat = .form) -> OAuth2Config {
        var config = OAuth2Config(
            tokenURL: "https://idp.example.com/token", grant: .clientCredentials, requestFormat: format,
            clientID: "my client:1", clientSecretEntry: "s", scope: "read", keychainPrefix: "p")
        config.clientAuth = method
        return config
    }

    @Test("client_secret_basic: id and secret form-urlencoded, joined, base64; neither in the body")
    func basic() throws {
        let request = try TokenRequestBuilder.build(
            config: Self.config(.clientSecretBasic), refreshToken: nil, clientSecret: "p@ss w:rd+é")
        #expect(String(decoding: request.body, as: UTF8.self) == "grant_type=client_credentials&scope=read")
        // urlencode("my client:1") = my+client%3A1, urlencode("p@ss w:rd+é") = p%40ss+w%3Ard%2B%C3%A9
        let expected = "Basic " + Base64.encode(Array("my+client%3A1:p%40ss+w%3Ard%2B%C3%A9".utf8))
        #expect(request.headers.map(\.name) == ["Content-Type", "Accept", "Authorization"])
        #expect(request.headers.last?.value == expected)
        #expect(throws: TokenRequestError.missingClientSecret) {
            try TokenRequestBuilder.build(config: Self.config(.clientSecretBasic), refreshToken: nil, clientSecret: nil)
        }
    }

    @Test("private_key_jwt: client_id, assertion type and the assertion, in form and JSON")
    func privateKeyJWT() throws {
        let form = try TokenRequestBuilder.build(
            config: Self.config(.privateKeyJWT), refreshToken: nil, clientSecret: "ignored", clientAssertion: "h.c.s")
        #expect(
            String(decoding: form.body, as: UTF8.self) == "grant_type=client_credentials&scope=read"
                + "&client_id=my+client%3A1&client_assertion_type=urn%3Aietf%3Aparams%3Aoauth%3Aclient-assertion-type"
                + "%3Ajwt-bearer&client_assertion=h.c.s")
        #expect(form.headers.map(\.name) == ["Content-Type", "Accept"])
        let json = try TokenRequestBuilder.build(
            config: Self.config(.privateKeyJWT, format: .json), refreshToken: nil, clientSecret: nil,
            clientAssertion: "h.c.s")
        #expect(
            String(decoding: json.body, as: UTF8.self) == #"{"grant_type":"client_credentials","scope":"read","#
                + #""client_id":"my client:1","client_assertion_type":"urn:ietf:params:oauth:client-assertion-type:jwt-bearer","#
                + #""client_assertion":"h.c.s"}"#)
        #expect(throws: TokenRequestError.missingClientAssertion) {
            try TokenRequestBuilder.build(config: Self.config(.privateKeyJWT), refreshToken: nil, clientSecret: nil)
        }
    }

    @Test("tls_client_auth: client_id only, never the secret")
    func tlsClientAuth() throws {
        let request = try TokenRequestBuilder.build(
            config: Self.config(.tlsClientAuth), refreshToken: nil, clientSecret: "not-sent")
        #expect(
            String(decoding: request.body, as: UTF8.self)
                == "grant_type=client_credentials&scope=read&client_id=my+client%3A1")
    }

    @Test("JSON object writer: strings escaped, integers bare, order kept")
    func jsonWriter() {
        let bytes = JSONObjectWriter.object([
            ("b", .string("q\"\n")), ("a", .integer(-5)), ("c", .integer(1_700_000_000)),
        ])
        #expect(String(decoding: bytes, as: UTF8.self) == #"{"b":"q\"\n","a":-5,"c":1700000000}"#)
    }
}
