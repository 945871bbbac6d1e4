import BackstopTestSupport
import Foundation
import Testing

@testable import BackstopIdentity

/// AWS Signature Version 4 (docs/reference/aws-sigv4.md): AWS's published test suite (the signatures its
/// `aws4_testsuite` lists for each request), botocore's signer on the requests Backstop signs, and the shape of
/// what one attempt gets.
@Suite("SigV4 signer")
struct SigV4SignerTests {
    static let credentials = SigV4Credentials(
        accessKeyID: "AKIDEXAMPLE", secretAccessKey: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
    static let empty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    static let form = "9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e"

    /// One vector of AWS's SigV4 test suite (region us-east-1, service `service`, 20150830T123600Z).
    struct Vector: Sendable, CustomTestStringConvertible {
        var name: String
        var method = "GET"
        var path = "/"
        var query = ""
        var headers: [(String, String)] = []
        var payload = SigV4SignerTests.empty
        var signature: String
        var testDescription: String { name }
    }

    static let vectors: [Vector] = [
        Vector(name: "get-vanilla", signature: "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"),
        Vector(
            name: "get-header-key-duplicate",
            headers: [("my-header1", "value2"), ("my-header1", "value2"), ("my-header1", "value1")],
            signature: "c9d5ea9f3f72853aea855b47ea873832890dbdd183b4468f858259531a5138ea"),
        Vector(
            name: "get-header-value-multiline", headers: [("my-header1", "value1\n  value2\n     value3")],
            signature: "cfd34249e4b1c8d6b91ef74165d41a32e5fab3306300901bb65a51a73575eefd"),
        Vector(
            name: "get-header-value-order",
            headers: [
                ("my-header1", "value4"), ("my-header1", "value1"), ("my-header1", "value3"),
                ("my-header1", "value2"),
            ],
            signature: "08c7e5a9acfcfeb3ab6b2185e75ce8b1deb5e634ec47601a50643f830c755c01"),
        Vector(
            name: "get-header-value-trim", headers: [("my-header1", " value1"), ("my-header2", "\"a   b   c\"")],
            signature: "acc3ed3afb60bb290fc8d2dd0098b9911fcaa05412b367055dee359757a9c736"),
        Vector(
            name: "get-unreserved", path: "/-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz",
            signature: "07ef7494c76fa4850883e2b006601f940f8a34d404d0cfa977f52a65bbf5f24f"),
        Vector(
            name: "get-utf8", path: "/ሴ", signature: "8318018e0b0f223aa2bbf98705b62bb787dc9c0e678f255a891fd03141be5d85"),
        Vector(
            name: "get-vanilla-empty-query-key", query: "Param1=value1",
            signature: "a67d582fa61cc504c4bae71f336f98b97f1ea3c7a6bfe1b6e45aec72011b9aeb"),
        Vector(
            name: "get-vanilla-query-order-encoded", query: "Param-3=Value3&Param=Value2&%E1%88%B4=Value1",
            signature: "371d3713e185cc334048618a97f809c9ffe339c62934c032af5a0e595648fcac"),
        Vector(
            name: "get-vanilla-query-order-key-case", query: "Param2=value2&Param1=value1",
            signature: "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500"),
        Vector(
            name: "get-vanilla-query-order-key", query: "Param1=value2&Param1=Value1",
            signature: "eedbc4e291e521cf13422ffca22be7d2eb8146eecf653089df300a15b2382bd1"),
        Vector(
            name: "get-vanilla-query-order-value", query: "Param1=value2&Param1=value1",
            signature: "5772eed61e12b33fae39ee5e7012498b51d56abc0abb7c60486157bd471c4694"),
        Vector(
            name: "get-vanilla-query-unreserved",
            query: "-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz="
                + "-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz",
            signature: "9c3e54bfcdf0b19771a7f523ee5669cdf59bc7cc0884027167c21bb143a40197"),
        Vector(
            name: "get-vanilla-utf8-query", query: "ሴ=bar",
            signature: "2cdec8eed098649ff3a119c94853b13c643bcf08f8b0a1d91e12c9027818dd04"),
        Vector(
            name: "get-vanilla-with-session-token",
            headers: [("x-amz-security-token", "6e86291e8372ff2a2260956d9b8aae1d763fbf315fa00fa31553b73ebf194267")],
            signature: "07ec1639c89043aa0e3e2de82b96708f198cceab042d4a97044c66dd9f74e7f8"),
        Vector(
            name: "get-relative-relative", path: "/example1/example2/../..",
            signature: "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"),
        Vector(
            name: "get-relative", path: "/example/..",
            signature: "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"),
        Vector(
            name: "get-slash-dot-slash", path: "/./",
            signature: "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"),
        Vector(
            name: "get-slash-pointless-dot", path: "/./example",
            signature: "ef75d96142cf21edca26f06005da7988e4f8dc83a165a80865db7089db637ec5"),
        Vector(
            name: "get-slash", path: "//", signature: "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
        ),
        Vector(
            name: "get-slashes", path: "//example//",
            signature: "9a624bd73a37c9a373b5312afbebe7a714a789de108f0bdfe846570885f57e84"),
        Vector(
            name: "get-space", path: "/example space/",
            signature: "652487583200325589f1fba4c7e578f72c47cb61beeca81406b39ddec1366741"),
        Vector(
            name: "get-special-character", path: "/example/$delete",
            signature: "a853c9b21b528b19643d00910d35b83a10c366a10833ceefb45edd6c80e40f27"),
        Vector(
            name: "post-vanilla", method: "POST",
            signature: "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b"),
        Vector(
            name: "post-header-key-sort", method: "POST", headers: [("my-header1", "value1")],
            signature: "c5410059b04c1ee005303aed430f6e6645f61f4dc9e1461ec8f8916fdf18852c"),
        Vector(
            name: "post-header-value-case", method: "POST", headers: [("my-header1", "VALUE1")],
            signature: "cdbc9802e29d2942e5e10b5bccfdd67c5f22c7c4e8ae67b53629efa58b974b7d"),
        Vector(
            name: "post-sts-header-before", method: "POST",
            headers: [
                (
                    "x-amz-security-token",
                    "AQoDYXdzEPT//////////wEXAMPLEtc764bNrC9SAPBSM22wDOk4x4HIZ8j4FZTwdQW"
                        + "LWsKWHGBuFqwAeMicRXmxfpSPfIeoIYRqTflfKD8YUuwthAx7mSEI/qkPpKPi/kMcGdQrmGdeehM4IC1NtBmUpp2wUE8phUZampKsb"
                        + "urEDy0KPkyQDYwT7WZ0wq5VSXDvp75YU9HFvlRd8Tx6q6fE8YQcHNVXAkiY9q6d+xo0rKwT38xVqr7ZD0u0iPPkUL64lIZbqBAz+scq"
                        + "Kmlzm8FDrypNC9Yjc8fPOLn9FX9KSYvKTr4rvx3iSIlTJabIQwj2ICCR/oLxBA=="
                )
            ],
            signature: "85d96828115b5dc0cfc3bd16ad9e210dd772bbebba041836c64533a82be05ead"),
        Vector(
            name: "post-vanilla-query", method: "POST", query: "Param1=value1",
            signature: "28038455d6de14eafc1f9222cf5aa6f1a96197d7deb8263271d420d138af7f11"),
        Vector(
            name: "post-x-www-form-urlencoded", method: "POST",
            headers: [("content-type", "application/x-www-form-urlencoded")], payload: form,
            signature: "ff11897932ad3f4e8b18135d722051e5ac45fc38421b1da7b9d196a0fe09473a"),
        Vector(
            name: "post-x-www-form-urlencoded-parameters", method: "POST",
            headers: [("content-type", "application/x-www-form-urlencoded; charset=utf8")], payload: form,
            signature: "1a72ec8f64bd914b0e42e42607c7fbce7fb2c7465f63e3092b3b0d39fa77a6fe"),
    ]

    @Test("AWS's published SigV4 test suite", arguments: vectors)
    func published(vector: Vector) {
        let signer = SigV4Signer(region: "us-east-1", service: "service")
        let headers = [("host", "example.amazonaws.com"), ("x-amz-date", "20150830T123600Z")] + vector.headers
        let result = signer.signature(
            method: vector.method, path: vector.path, query: vector.query, headers: headers,
            payloadHash: vector.payload,
            credentials: Self.credentials, amzDate: "20150830T123600Z")
        #expect(result.signature == vector.signature, "\(result.canonicalRequest)")
    }

    /// Requests as Backstop signs them: the signed-header set of the spec, repeated and reserved query characters,
    /// paths with spaces and UTF-8, S3's single encoding, session tokens, unsigned payloads, a host with a port.
    static let botocoreCases:
        [(
            method: String, host: String, path: String, query: String, service: String,
            token: String?, payload: SigV4Signer.Payload
        )] = [
            ("GET", "abc.execute-api.eu-west-1.amazonaws.com", "/prod/items", "", "execute-api", nil, .signed([])),
            ("GET", "abc.execute-api.eu-west-1.amazonaws.com", "/prod/a%20b/c d", "", "execute-api", nil, .signed([])),
            (
                "GET", "localhost:8443", "/p", "b=2&a=1&a=0&x=%2F%3D%26&e=&sp=a%20b&plus=a+b&flag&%E2%98%83=snow",
                "execute-api",
                nil, .signed([])
            ),
            ("GET", "localhost:8443", "/p", "q=a/b:c@d!$'()*,;", "execute-api", nil, .signed([])),
            (
                "PUT", "bucket.s3.eu-west-1.amazonaws.com", "/key%20with%20spaces/%E2%98%83", "x-id=PutObject", "s3",
                nil,
                .signed(Array("hello".utf8))
            ),
            ("PUT", "bucket.s3.eu-west-1.amazonaws.com", "/big", "", "s3", nil, .unsigned),
            (
                "POST", "sqs.eu-west-1.amazonaws.com", "/", "Action=SendMessage", "sqs", "FQoGZXIvYXdzE//token+/=",
                .signed(Array("{\"a\":1}".utf8))
            ),
            (
                "DELETE", "x.execute-api.eu-west-1.amazonaws.com", "//double//slash/./dot/../up", "", "execute-api",
                nil,
                .signed([])
            ),
        ]

    @Test("botocore computes the same signature for the requests Backstop signs")
    func botocore() throws {
        let date: Int64 = 1_767_225_600  // 2026-01-01T00:00:00Z
        var inputs: [[String: String]] = []
        var expected: [SigV4Signer.Signature] = []
        for c in Self.botocoreCases {
            let signer = SigV4Signer(region: "eu-west-1", service: c.service)
            let credentials = SigV4Credentials(
                accessKeyID: "AKIDEXAMPLE", secretAccessKey: Self.credentials.secretAccessKey, sessionToken: c.token)
            let signature = signer.sign(
                SigV4Signer.Request(method: c.method, path: c.path, query: c.query, host: c.host), payload: c.payload,
                credentials: credentials, date: date)
            expected.append(signature)
            var input = [
                "method": c.method, "host": c.host, "path": c.path, "query": c.query, "service": c.service,
                "region": "eu-west-1", "access_key": "AKIDEXAMPLE", "secret_key": Self.credentials.secretAccessKey,
                "amz_date": "20260101T000000Z", "payload_hash": c.payload.headerValue,
            ]
            if let token = c.token { input["token"] = token }
            inputs.append(input)
        }
        #expect(expected[0].headers.map(\.value)[0] == "20260101T000000Z")
        let answers = try BotocoreSigner.sign(inputs)
        #expect(answers.count == Self.botocoreCases.count)
        for (i, answer) in answers.enumerated() {
            #expect(
                answer.signature == expected[i].signature,
                "case \(i): ours\n\(expected[i].canonicalRequest)\nbotocore's\n\(answer.canonicalRequest)")
        }
    }

    @Test("the client's x-amz-* headers are signed beside the signature's own (S3's rule); botocore agrees")
    func clientAmzHeaders() throws {
        let signer = SigV4Signer(region: "eu-west-1", service: "s3")
        let request = SigV4Signer.Request(
            method: "PUT", path: "/bucket/copy", host: "bucket.s3.eu-west-1.amazonaws.com")
        let client: [(name: String, value: String)] = [
            ("x-amz-meta-owner", "  a   b "), ("x-amz-copy-source", "/bucket/original"), ("x-amz-acl", "private"),
            ("x-amz-meta-owner", "c"),
            // The signature's own names: never signed from the client.
            ("x-amz-date", "20000101T000000Z"), ("x-amz-security-token", "the-clients-own"),
            ("x-amz-content-sha256", "UNSIGNED-PAYLOAD"),
        ]
        for token in [nil, "FQoGZXIvYXdzE//token+/="] as [String?] {
            var credentials = Self.credentials
            credentials.sessionToken = token
            let date: Int64 = 1_767_225_600  // 2026-01-01T00:00:00Z
            let signature = signer.sign(
                request, payload: .signed(Array("x".utf8)), credentials: credentials, date: date, clientHeaders: client)
            let signedHeaders =
                "host;x-amz-acl;x-amz-content-sha256;x-amz-copy-source;x-amz-date;x-amz-meta-owner"
                + (token == nil ? "" : ";x-amz-security-token")
            #expect(signature.headers.last?.value.contains("SignedHeaders=\(signedHeaders),") == true)
            #expect(signature.canonicalRequest.contains("\nx-amz-meta-owner:a b,c\n"))
            #expect(!signature.canonicalRequest.contains("the-clients-own"))
            #expect(!signature.canonicalRequest.contains("20000101T000000Z"))
            let signedClient = [
                ["x-amz-meta-owner", "a b,c"], ["x-amz-copy-source", "/bucket/original"], ["x-amz-acl", "private"],
            ]
            var input = [
                "method": "PUT", "host": request.host, "path": request.path, "query": "", "service": "s3",
                "region": "eu-west-1", "access_key": "AKIDEXAMPLE", "secret_key": Self.credentials.secretAccessKey,
                "amz_date": "20260101T000000Z", "payload_hash": SigV4Signer.Payload.signed(Array("x".utf8)).headerValue,
                "client_headers": String(
                    decoding: try JSONSerialization.data(withJSONObject: signedClient), as: UTF8.self),
            ]
            if let token { input["token"] = token }
            let answers = try BotocoreSigner.sign([input])
            #expect(
                answers.first?.signature == signature.signature,
                "ours\n\(signature.canonicalRequest)\nbotocore's\n\(answers.first?.canonicalRequest ?? "")")
        }
    }

    @Test("one attempt's headers: date, payload hash, token when set, then Authorization over exactly those")
    func attemptHeaders() {
        let signer = SigV4Signer(region: "eu-west-1", service: "execute-api")
        let request = SigV4Signer.Request(method: "get", path: "/prod", query: nil, host: "api.example.com")
        let plain = signer.sign(request, payload: .unsigned, credentials: Self.credentials, date: 0)
        #expect(plain.headers.map(\.name) == ["X-Amz-Date", "X-Amz-Content-SHA256", "Authorization"])
        #expect(plain.headers[0].value == "19700101T000000Z")
        #expect(plain.headers[1].value == "UNSIGNED-PAYLOAD")
        #expect(
            plain.headers[2].value == "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/19700101/eu-west-1/execute-api/"
                + "aws4_request, SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature=\(plain.signature)")
        #expect(plain.canonicalRequest.hasPrefix("GET\n/prod\n\nhost:api.example.com\n"))
        var withToken = Self.credentials
        withToken.sessionToken = "tok"
        let temporary = signer.sign(request, payload: .signed(Array("x".utf8)), credentials: withToken, date: 86_399)
        #expect(
            temporary.headers.map(\.name)
                == ["X-Amz-Date", "X-Amz-Content-SHA256", "X-Amz-Security-Token", "Authorization"])
        #expect(temporary.headers[0].value == "19700101T235959Z")
        #expect(temporary.headers[1].value == "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881")
        #expect(
            temporary.headers[3].value.contains(
                "SignedHeaders=host;x-amz-content-sha256;x-amz-date;x-amz-security-token"))
        // Each attempt signs anew: another second, another signature.
        #expect(
            signer.sign(request, payload: .unsigned, credentials: Self.credentials, date: 1).signature
                != plain.signature)
        #expect("\(withToken)" == "SigV4Credentials(<redacted>)")
    }

    @Test("the wire target: query (and S3 path) in AWS's encoding, the client's order; stable; signs as the original")
    func wireTarget() {
        let api = SigV4Signer(region: "r", service: "execute-api")
        let s3 = SigV4Signer(region: "r", service: "s3")
        let cases: [(SigV4Signer, String, String)] = [
            (api, "/a%20b?q=a/b:c&flag&&x=a+b&b=%2f", "/a%20b?q=a%2Fb%3Ac&flag&x=a%20b&b=%2F"),
            (api, "/a!b/./c?", "/a!b/./c"),
            (api, "/x?&&", "/x"),
            (api, "/x", "/x"),
            (api, "/x?%E2%98%83=%e2%98%83&bad=%zz", "/x?%E2%98%83=%E2%98%83&bad=%25zz"),
            (s3, "/photos/a!b+c/%7e?prefix=photos/&acl", "/photos/a%21b%2Bc/~?prefix=photos%2F&acl"),
            (s3, "/a%2Fb/c%20d", "/a%2Fb/c%20d"),
        ]
        for (signer, target, expected) in cases {
            let wire = signer.wireTarget(target)
            #expect(wire == expected, "\(target)")
            #expect(signer.wireTarget(wire) == wire, "\(target): stable")
            func signed(_ target: String) -> String {
                let parts = target.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false)
                return signer.sign(
                    SigV4Signer.Request(
                        method: "GET", path: String(parts[0]), query: parts.count > 1 ? String(parts[1]) : nil,
                        host: "h"), payload: .unsigned,
                    credentials: SigV4Credentials(accessKeyID: "a", secretAccessKey: "s"), date: 0
                ).canonicalRequest
            }
            #expect(signed(wire) == signed(target), "\(target): signs as the original")
        }
    }

    @Test("query and path canonicalisation, piece by piece")
    func canonicalisation() {
        #expect(
            SigV4Signer.canonicalQuery("b=2&a=1&a=0&x=%2f%3D&e=&flag&sp=a+b%20c")
                == "a=0&a=1&b=2&e=&flag=&sp=a%20b%20c&x=%2F%3D")
        #expect(SigV4Signer.canonicalQuery("") == "")
        #expect(SigV4Signer.canonicalQuery("&&a=1&") == "a=1")
        #expect(SigV4Signer.canonicalQuery("bad=%zz%4") == "bad=%25zz%254")
        let api = SigV4Signer(region: "r", service: "execute-api")
        #expect(api.canonicalURI("/a%20b/c d") == "/a%2520b/c%20d")
        #expect(api.canonicalURI("") == "/")
        let s3 = SigV4Signer(region: "r", service: "s3")
        #expect(s3.canonicalURI("/a%20b/c d//e") == "/a%20b/c%20d//e")
        #expect(s3.canonicalURI("/a%2fb") == "/a%2Fb")
    }
}

/// Runs scripts/sigv4/botocore-sign.py: botocore's signatures for a list of requests.
enum BotocoreSigner {
    struct Answer: Decodable {
        var signature: String
        var canonicalRequest: String
        enum CodingKeys: String, CodingKey {
            case signature
            case canonicalRequest = "canonical_request"
        }
    }

    static func sign(_ inputs: [[String: String]]) throws -> [Answer] {
        let process = try ChildProcess.spawn(
            "/usr/bin/env", ["python3", RepositoryRoot.path + "/scripts/sigv4/botocore-sign.py"],
            standardInput: .bytes(Array(try JSONSerialization.data(withJSONObject: inputs))), standardOutput: .pipe,
            standardError: .pipe)
        let outputs = process.readOutputs(within: .seconds(120))
        let problem = String(decoding: outputs.standardError, as: UTF8.self)
        guard process.terminationStatus == 0, !outputs.timedOut else {
            throw BotocoreError(
                description: "botocore-sign.py exited \(process.terminationStatus) (is botocore "
                    + "installed? python3 -m pip install botocore): \(problem)")
        }
        return try JSONDecoder().decode([Answer].self, from: Data(outputs.standardOutput))
    }

    struct BotocoreError: Error, CustomStringConvertible { var description: String }
}
