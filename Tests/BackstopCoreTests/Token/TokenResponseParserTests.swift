import BackstopCore
import Testing

@Suite("TokenResponseParser")
struct TokenResponseParserTests {
    struct Case: Sendable, CustomTestStringConvertible {
        var name: String
        var body: String
        var fields = TokenFields()
        var expected: Result<TokenResponse, TokenResponseError>
        var testDescription: String { name }
    }

    static let max = TokenResponseParser.maxExpiresIn
    static let camel = TokenFields(accessToken: "accessToken", refreshToken: "refreshToken", expiresIn: "expiresIn")

    static func ok(
        _ access: String, _ refresh: String? = nil, _ expires: Double? = nil
    )
        -> Result<TokenResponse, TokenResponseError>
    {
        .success(TokenResponse(accessToken: access, refreshToken: refresh, expiresIn: expires))
    }

    static func expires(_ json: String, _ expected: Double?) -> Case {
        Case(
            name: "expires_in \(json)", body: #"{"access_token":"A","expires_in":"# + json + "}",
            expected: ok("A", nil, expected))
    }

    static let cases: [Case] = [
        Case(name: "minimal", body: #"{"access_token":"A"}"#, expected: ok("A")),
        Case(
            name: "full RFC 6749 §5.1",
            body: #"{"access_token":"A","token_type":"Bearer","refresh_token":"R","expires_in":3600,"scope":"x"}"#,
            expected: ok("A", "R", 3600)),
        Case(
            name: "whitespace and nested extras",
            body: " \r\n\t{ \"x\" : {\"y\":[1,-2.5e3,{\"z\":null},true,false]} , \"access_token\" : \"A\" } \n",
            expected: ok("A")),
        Case(name: "duplicate key: last wins", body: #"{"access_token":"A","access_token":"B"}"#, expected: ok("B")),
        expires("3600", 3600),
        expires("0", nil),
        expires("3600.5", 3600.5),
        expires(#""3600""#, 3600),
        expires(#""3600.25""#, 3600.25),
        expires(#""1e3""#, 1000),
        expires("-5", nil),
        expires(#""-5""#, nil),
        expires("-1e400", nil),
        expires("0.25", 0.25),
        expires(#""-0""#, nil),
        expires("1e300", max),
        expires("9999999999999", max),
        expires(#""9999999999999""#, max),
        expires("1e400", max),
        expires("315360000", max),
        expires("315359999", 315_359_999),
        expires(#""soon""#, nil),
        expires(#"" 3600""#, nil),
        expires(#""3600s""#, nil),
        expires(#""0x10""#, nil),
        expires(#""1e""#, nil),
        expires(#""""#, nil),
        expires(#""nan""#, nil),
        expires(#""inf""#, nil),
        expires("true", nil),
        expires("null", nil),
        expires("{}", nil),
        expires("[3600]", nil),
        Case(name: "refresh_token null", body: #"{"access_token":"A","refresh_token":null}"#, expected: ok("A")),
        Case(name: "refresh_token empty", body: #"{"access_token":"A","refresh_token":""}"#, expected: ok("A")),
        Case(
            name: "refresh_token number", body: #"{"access_token":"A","refresh_token":5}"#,
            expected: .failure(.refreshTokenNotString(field: "refresh_token"))),
        Case(
            name: "missing access_token", body: #"{"token_type":"Bearer","expires_in":60}"#,
            expected: .failure(.missingAccessToken(field: "access_token"))),
        Case(
            name: "access_token number", body: #"{"access_token":42}"#,
            expected: .failure(.accessTokenNotString(field: "access_token"))),
        Case(
            name: "access_token null", body: #"{"access_token":null}"#,
            expected: .failure(.accessTokenNotString(field: "access_token"))),
        Case(
            name: "access_token object", body: #"{"access_token":{"v":"A"}}"#,
            expected: .failure(.accessTokenNotString(field: "access_token"))),
        Case(
            name: "access_token empty", body: #"{"access_token":""}"#,
            expected: .failure(.emptyAccessToken(field: "access_token"))),
        Case(
            name: "access_token with CRLF", body: #"{"access_token":"A\r\nX-Evil: 1"}"#,
            expected: .failure(.accessTokenInvalidCharacters(field: "access_token"))),
        Case(
            name: "access_token with NUL", body: #"{"access_token":"A\u0000"}"#,
            expected: .failure(.accessTokenInvalidCharacters(field: "access_token"))),
        Case(name: "unicode raw", body: #"{"access_token":"tøkén-☃-😀"}"#, expected: ok("tøkén-☃-😀")),
        Case(
            name: "unicode escapes incl. surrogate pair", body: #"{"access_token":"\u00e9\ud83d\ude00\/\"\\"}"#,
            expected: ok("é😀/\"\\")),
        Case(name: "lone high surrogate", body: #"{"access_token":"\ud83d"}"#, expected: .failure(.notJSON)),
        Case(name: "lone low surrogate", body: #"{"access_token":"\ude00x"}"#, expected: .failure(.notJSON)),
        Case(name: "bad escape", body: #"{"access_token":"\x41"}"#, expected: .failure(.notJSON)),
        Case(name: "raw control char in string", body: "{\"access_token\":\"A\tB\"}", expected: .failure(.notJSON)),
        Case(
            name: "camelCase fields", body: #"{"accessToken":"A","refreshToken":"R","expiresIn":"60"}"#,
            fields: camel, expected: ok("A", "R", 60)),
        Case(
            name: "camelCase body, default fields", body: #"{"accessToken":"A","expiresIn":60}"#,
            expected: .failure(.missingAccessToken(field: "access_token"))),
        Case(
            name: "default body, camelCase fields", body: #"{"access_token":"A"}"#, fields: camel,
            expected: .failure(.missingAccessToken(field: "accessToken"))),
        Case(
            name: "OAuth error body", body: #"{"error":"invalid_grant","error_description":"refresh token revoked"}"#,
            expected: .failure(.errorResponse(code: "invalid_grant"))),
        Case(
            name: "malformed OAuth error code", body: #"{"error":"bad\ncode"}"#,
            expected: .failure(.missingAccessToken(field: "access_token"))),
        Case(name: "empty body", body: "", expected: .failure(.notJSON)),
        Case(name: "whitespace only", body: "  \n", expected: .failure(.notJSON)),
        Case(name: "form body", body: "access_token=A&expires_in=60", expected: .failure(.notJSON)),
        Case(name: "HTML", body: "<html>502 Bad Gateway</html>", expected: .failure(.notJSON)),
        Case(name: "truncated", body: #"{"access_token":"A""#, expected: .failure(.notJSON)),
        Case(name: "trailing comma", body: #"{"access_token":"A",}"#, expected: .failure(.notJSON)),
        Case(name: "trailing garbage", body: #"{"access_token":"A"} x"#, expected: .failure(.notJSON)),
        Case(name: "two documents", body: #"{"access_token":"A"}{}"#, expected: .failure(.notJSON)),
        Case(name: "single quotes", body: "{'access_token':'A'}", expected: .failure(.notJSON)),
        Case(name: "leading zero", body: #"{"access_token":"A","expires_in":0123}"#, expected: .failure(.notJSON)),
        Case(name: "bare dot", body: #"{"access_token":"A","expires_in":1.}"#, expected: .failure(.notJSON)),
        Case(name: "plus sign", body: #"{"access_token":"A","expires_in":+1}"#, expected: .failure(.notJSON)),
        Case(name: "NaN literal", body: #"{"access_token":"A","expires_in":NaN}"#, expected: .failure(.notJSON)),
        Case(name: "tru", body: #"{"access_token":"A","x":tru}"#, expected: .failure(.notJSON)),
        Case(name: "array", body: #"[{"access_token":"A"}]"#, expected: .failure(.notAnObject)),
        Case(name: "string", body: #""A""#, expected: .failure(.notAnObject)),
        Case(name: "number", body: "42", expected: .failure(.notAnObject)),
        Case(name: "null", body: "null", expected: .failure(.notAnObject)),
    ]

    @Test(arguments: cases)
    func parses(_ testCase: Case) {
        let result = Result { () throws(TokenResponseError) in
            try TokenResponseParser.parse(tokenBytes(testCase.body), fields: testCase.fields)
        }
        #expect(result == testCase.expected)
    }

    @Test func invalidUTF8IsNotJSON() {
        let body: [UInt8] = tokenBytes(#"{"access_token":""#) + [0xFF, 0xFE] + tokenBytes(#""}"#)
        #expect(throws: TokenResponseError.notJSON) { try TokenResponseParser.parse(body) }
        let overlong: [UInt8] = tokenBytes(#"{"access_token":""#) + [0xC0, 0xAF] + tokenBytes(#""}"#)
        #expect(throws: TokenResponseError.notJSON) { try TokenResponseParser.parse(overlong) }
    }

    @Test func deepNestingIsRejectedWithoutCrashing() {
        let deep =
            #"{"access_token":"A","x":"# + String(repeating: "[", count: 100_000)
            + String(repeating: "]", count: 100_000) + "}"
        #expect(throws: TokenResponseError.notJSON) { try TokenResponseParser.parse(tokenBytes(deep)) }
        let allowed =
            #"{"access_token":"A","x":"# + String(repeating: "[", count: 60)
            + String(repeating: "]", count: 60) + "}"
        #expect((try? TokenResponseParser.parse(tokenBytes(allowed)))?.accessToken == "A")
    }

    @Test func expiryIsAbsolute() throws {
        let response = try TokenResponseParser.parse(tokenBytes(#"{"access_token":"A","expires_in":3600}"#))
        #expect(response.expiry(now: 1_700_000_000) == 1_700_003_600)
        #expect(TokenResponse(accessToken: "A").expiry(now: 5) == nil)
        #expect(TokenResponseParser.maxExpiresIn == 315_360_000)
    }

    @Test func errorsAndDescriptionsNeverContainTheBody() {
        let bodies = [
            #"{"access_token":"SECRET\r\n","refresh_token":"SECRET"}"#, #"{"access_token":5,"x":"SECRET"}"#,
            #"{"access_token":"","refresh_token":"SECRET"}"#, #"["SECRET"]"#, "SECRET", #"{"SECRET":1}"#,
            #"{"error":"invalid_grant","error_description":"SECRET"}"#,
            #"{"access_token":"A","refresh_token":["SECRET"]}"#,
        ]
        for body in bodies {
            do {
                _ = try TokenResponseParser.parse(tokenBytes(body))
                Issue.record("expected an error for a case")
            } catch {
                #expect(!String(describing: error).contains("SECRET"))
                #expect(!String(reflecting: error).contains("SECRET"))
            }
        }
        let response = TokenResponse(accessToken: "SECRET-A", refreshToken: "SECRET-R", expiresIn: 60)
        for text in [String(describing: response), String(reflecting: response), tokenDumped(response)] {
            #expect(!text.contains("SECRET"))
        }
    }

    @Test(
        arguments: [
            (#"{"error":"invalid_grant","error_description":"revoked"}"#, "invalid_grant"),
            (#"{"error":"invalid_client"}"#, "invalid_client"),
            (#"{"error":"slow down please!"}"#, "slow down please!"),
            (#"{"error":"a\nb"}"#, nil),
            (#"{"error":"a\"b"}"#, nil),
            (#"{"error":"a\\b"}"#, nil),
            (#"{"error":"é"}"#, nil),
            (#"{"error":""}"#, nil),
            (#"{"error":7}"#, nil),
            (#"{"error_description":"x"}"#, nil),
            (#"{"access_token":"A"}"#, nil),
            ("not json", nil),
            (#"["invalid_grant"]"#, nil),
            (#"{"error":""# + String(repeating: "x", count: 64) + #""}"#, String(repeating: "x", count: 64)),
            (#"{"error":""# + String(repeating: "x", count: 65) + #""}"#, nil),
        ] as [(String, String?)])
    func oauthErrorCode(body: String, expected: String?) {
        #expect(TokenResponseParser.oauthErrorCode(tokenBytes(body)) == expected)
    }
}
