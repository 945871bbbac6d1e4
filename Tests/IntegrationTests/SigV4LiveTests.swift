import BackstopCore
import BackstopIdentity
import BackstopTestSupport
import BackstopTransport
import Foundation
import NIOCore
import NIOPosix
import Testing

@testable import BackstopServer

/// SigV4 signatures as they travel: signed by Backstop's signer, sent by the curl transport the daemon uses, and
/// checked on arrival by an origin that recomputes them with botocore (scripts/sigv4/botocore-origin.py) from the
/// request exactly as received (docs/reference/aws-sigv4.md); then the same through the proxy, keys in the keychain.
@Suite("SigV4 on the wire", .serialized)
struct SigV4LiveTests {
    static var scripts: String {
        var url = URL(fileURLWithPath: #filePath)
        for _ in 0..<3 { url.deleteLastPathComponent() }
        return url.path + "/scripts/sigv4"
    }

    /// The botocore origin (scripts/sigv4/botocore-origin.py) on a free loopback port, accepting these keys, once it
    /// listens (`waitUntilListening` has its own deadline).
    static func startBotocoreOrigin(
        access: String, secret: String, token: String
    ) async throws -> (DaemonProcess, port: Int) {
        let port = try FreePort.reserveClosedPort()
        let origin = try DaemonProcess.start(
            binary: "/usr/bin/env",
            arguments: ["python3", scripts + "/botocore-origin.py", String(port), access, secret, token])
        do {
            try await origin.waitUntilListening(port: port)
        } catch {
            origin.send(signal: SIGKILL)
            throw error
        }
        return (origin, port)
    }

    @Test(
        "botocore accepts the signatures of requests with repeated and reserved query characters, spaces in the path, bodies and a session token"
    )
    func botocoreAcceptsWhatTravels() async throws {
        let credentials = SigV4Credentials(
            accessKeyID: "AKIDLIVE", secretAccessKey: "live/secret+key=", sessionToken: "session//token+=")
        let (origin, port) = try await Self.startBotocoreOrigin(
            access: credentials.accessKeyID, secret: credentials.secretAccessKey, token: credentials.sessionToken!)
        defer { origin.send(signal: SIGKILL) }
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let transport = CurlMultiTransport()
        let fetcher = TransportFetcher(transport: transport, eventLoop: group.next())
        let signer = SigV4Signer(region: "eu-west-1", service: "execute-api")
        let host = "127.0.0.1:\(port)"
        let cases: [(method: String, target: String, body: [UInt8], payload: SigV4Signer.Payload?)] = [
            ("GET", "/prod/items", [], nil),
            ("GET", "/prod/a%20b/c%20d", [], nil),
            ("GET", "/p?b=2&a=1&a=0&x=%2F%3D%26&e=&sp=a%20b&plus=a+b&flag&%E2%98%83=snow", [], nil),
            ("GET", "/p?q=a/b:c@d!$'()*,;&q=a", [], nil),
            ("POST", "/prod/submit?Action=Send", Array("{\"hello\":\"world\"}".utf8), nil),
            ("PUT", "/prod/upload%20file", Array(repeating: 0x61, count: 70_000), .unsigned),
        ]
        var statuses: [Int] = []
        var reports: [String] = []
        for c in cases {
            let parts = c.target.split(separator: "?", maxSplits: 1)
            let payload = c.payload ?? .signed(c.body)
            let signature = signer.sign(
                SigV4Signer.Request(
                    method: c.method, path: String(parts[0]), query: parts.count > 1 ? String(parts[1]) : nil,
                    host: host),
                payload: payload, credentials: credentials, date: Int64(Date().timeIntervalSince1970))
            let request = TransportRequest(
                url: "http://\(host)\(c.target)", method: c.method,
                headers: HeaderFields(
                    [(name: "Host", value: host)] + signature.headers.map { (name: $0.name, value: $0.value) }),
                body: c.body.isEmpty ? .empty : .buffered(ByteBufferAllocator().buffer(bytes: c.body)))
            switch await fetcher.fetch(request, timeout: .seconds(10)) {
            case .success(let response):
                statuses.append(response.head.status)
                reports.append(String(decoding: response.body, as: UTF8.self))
            case .failure(let failure):
                statuses.append(0)
                reports.append("\(failure)")
            }
        }
        #expect(statuses == Array(repeating: 200, count: cases.count), "\(reports.joined(separator: "\n"))")
        // The origin saw the path and query byte for byte as signed (curl sends them as is).
        #expect(reports[1].contains(#""path": "/prod/a%20b/c%20d""#), "\(reports[1])")
        #expect(reports[3].contains(#""query": "q=a/b:c@d!$'()*,;&q=a""#), "\(reports[3])")

        // A signature from the wrong secret, and one whose body changed after signing, are refused.
        let wrong = SigV4Credentials(
            accessKeyID: "AKIDLIVE", secretAccessKey: "other", sessionToken: "session//token+=")
        let bad = signer.sign(
            SigV4Signer.Request(method: "GET", path: "/x", host: host), payload: .signed([]),
            credentials: wrong, date: Int64(Date().timeIntervalSince1970))
        let tampered = signer.sign(
            SigV4Signer.Request(method: "POST", path: "/x", host: host),
            payload: .signed(Array("a".utf8)), credentials: credentials,
            date: Int64(Date().timeIntervalSince1970))
        for (signature, body) in [(bad, ""), (tampered, "b")] {
            let request = TransportRequest(
                url: "http://\(host)/x", method: body.isEmpty ? "GET" : "POST",
                headers: HeaderFields(
                    [(name: "Host", value: host)] + signature.headers.map { (name: $0.name, value: $0.value) }),
                body: body.isEmpty ? .empty : .buffered(ByteBufferAllocator().buffer(string: body)))
            guard case .success(let response) = await fetcher.fetch(request, timeout: .seconds(10)) else {
                Issue.record("no response")
                continue
            }
            #expect(response.head.status == 403)
        }
        await transport.shutdown()
        try await group.shutdownGracefully()
        origin.send(signal: SIGKILL)  // SIGTERM leaves the origin running until `stop`'s 10 s limit (measured)
        await origin.stop()
    }

    @Test(
        "through the daemon: botocore accepts every request Backstop signs (path with spaces, repeated and reserved query characters, a signed body, an unsigned stream, a session token, the client's x-amz-* headers); the client's Authorization and session token are replaced; a signed body past retry_buffer gets 413"
    )
    func botocoreAcceptsWhatTheDaemonSigns() async throws {
        let keys = (access: "AKIDLIVE", secret: "live/secret+key=", token: "session//token+=")
        let (origin, port) = try await Self.startBotocoreOrigin(
            access: keys.access, secret: keys.secret, token: keys.token)
        defer { origin.send(signal: SIGKILL) }
        let (keychain, directory) = try TokenRefreshTests.makeKeychain(
            ["aws/access": keys.access, "aws/secret": keys.secret, "aws/token": keys.token])
        defer { TestFiles.remove(directory) }
        let entries = "access_key_entry: aws/access, secret_key_entry: aws/secret, session_token_entry: aws/token"
        let capture = LogCapture()
        let proxy = try await ProxyHarness.start(
            """
            \(keychainSection(directory: directory))
            limits: {retry_buffer: 64KiB}
            upstreams:
              - name: api
                match: {hosts: [api.test]}
                url: http://127.0.0.1:\(port)/prod
                auth: {type: aws_sigv4, region: eu-west-1, service: execute-api, \(entries)}
              - name: bucket
                match: {hosts: [bucket.test]}
                url: http://127.0.0.1:\(port)
                auth: {type: aws_sigv4, region: eu-west-1, service: s3, payload: unsigned, \(entries)}
            """, keychain: keychain, capture: capture)
        let large = [UInt8](repeating: 0x61, count: 70_000)
        let cases: [(method: String, host: String, target: String, body: [UInt8]?)] = [
            ("GET", "api.test", "/items", nil),
            ("GET", "api.test", "/a%20b/c%20d", nil),
            ("GET", "api.test", "/p?b=2&a=1&a=0&x=%2F%3D%26&e=&sp=a%20b&plus=a+b&flag&%E2%98%83=snow", nil),
            ("GET", "api.test", "/p?q=a/b:c@d!$'()*,;&q=a", nil),
            ("POST", "api.test", "/submit?Action=Send", Array("{\"hello\":\"world\"}".utf8)),
            ("PUT", "bucket.test", "/upload%20file", large),
            ("GET", "bucket.test", "/photos/a!b+c/%7e?prefix=photos/&list-type=2", nil),
        ]
        var responses: [RawHTTPResponse] = []
        for c in cases {
            responses.append(
                try await proxy.send(
                    RawHTTP.request(
                        c.method, "http://\(c.host)\(c.target)", host: c.host,
                        headers: [
                            ("Authorization", "Bearer the-clients-own"), ("X-Amz-Date", "20000101T000000Z"),
                            ("X-Amz-Security-Token", "the-clients-own"), ("X-Amz-Meta-Owner", "  a   b "),
                            ("x-amz-copy-source", "/bucket/original"),
                        ],
                        body: c.body)))
        }
        #expect(
            responses.map(\.status) == Array(repeating: 200, count: cases.count),
            "\(responses.map(\.bodyString).joined(separator: "\n"))")
        #expect(responses[1].bodyString.contains(#""path": "/prod/a%20b/c%20d""#), "\(responses[1].bodyString)")
        // The target goes in AWS's encoding (docs/reference/aws-sigv4.md): the query re-encoded, the S3 path too, so
        // botocore handed the raw URL agrees as well.
        #expect(
            responses[3].bodyString.contains(#""query": "q=a%2Fb%3Ac%40d%21%24%27%28%29%2A%2C%3B&q=a""#),
            "\(responses[3].bodyString)")
        #expect(
            responses[2].bodyString.contains(
                #""query": "b=2&a=1&a=0&x=%2F%3D%26&e=&sp=a%20b&plus=a%20b&flag&%E2%98%83=snow""#),
            "\(responses[2].bodyString)")
        #expect(
            responses[6].bodyString.contains(#""path": "/photos/a%21b%2Bc/~""#)
                && responses[6].bodyString.contains(#""query": "prefix=photos%2F&list-type=2""#),
            "\(responses[6].bodyString)")
        for (index, response) in responses.enumerated() {
            #expect(response.bodyString.contains(#""raw_url_agrees": true"#), "case \(index): \(response.bodyString)")
        }
        #expect(responses.allSatisfy { $0.bodyString.contains("x-amz-security-token") })
        // The client's own x-amz-* headers are signed (S3 refuses any left out); its session token is not sent.
        #expect(responses.allSatisfy { $0.bodyString.contains(#""x-amz-meta-owner""#) })
        #expect(responses.allSatisfy { $0.bodyString.contains(#""x-amz-copy-source""#) })

        // A signed payload must be hashed whole: a body past retry_buffer is refused before anything is sent.
        let tooLarge = try await proxy.send(
            RawHTTP.request("PUT", "http://api.test/big", host: "api.test", body: large))
        #expect(tooLarge.status == 413)
        #expect(tooLarge.header("X-Backstop-Error") == "body-too-large")
        // It names the limit to raise, not max_request_body.
        #expect(tooLarge.bodyString.contains("limits.retry_buffer"), "\(tooLarge.bodyString)")
        await proxy.stop()
        let log = capture.all.joined(separator: "\n")
        #expect(!log.contains(keys.secret) && !log.contains(keys.token))
        origin.send(signal: SIGKILL)  // SIGTERM leaves the origin running until `stop`'s 10 s limit (measured)
        await origin.stop()
    }
}
