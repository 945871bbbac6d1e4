import BackstopTestSupport
import Foundation
import Testing

/// An upstream is not trusted to frame its responses honestly (docs/reference/behaviour.md#untrusted-upstream-responses):
/// conflicting or malformed framing is never relayed, and no upstream can place bytes in the answer to the client's
/// next request on the same connection (response splitting).
@Suite("Untrusted upstream framing")
struct UpstreamFramingTests {
    /// A complete forged response, as a lying upstream would smuggle it into its body.
    static let forged = "HTTP/1.1 200 OK\r\nX-Injected: forged\r\nContent-Length: 6\r\n\r\nforged"
    static let bodyWithForgery = "HELLO" + forged

    /// One chunk holding `HELLO` and the forged response, then the last chunk.
    static var chunkedForgery: String {
        String(bodyWithForgery.utf8.count, radix: 16) + "\r\n" + bodyWithForgery + "\r\n0\r\n\r\n"
    }

    /// What the lying origin sends, and whether Backstop must refuse it (502) or may relay exactly its announced
    /// `Content-Length` and then close.
    struct Case: Sendable, CustomTestStringConvertible {
        var name: String
        var raw: String
        var refused: Bool
        var testDescription: String { name }
    }

    static let cases: [Case] = [
        Case(
            name: "CL + TE",
            raw: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n" + chunkedForgery,
            refused: true),
        Case(
            name: "TE + CL",
            raw: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n" + chunkedForgery,
            refused: true),
        Case(
            name: "CL 5 then CL 82",
            raw: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: \(bodyWithForgery.utf8.count)\r\n\r\n"
                + bodyWithForgery,
            refused: true),
        Case(
            name: "CL 5, 82",
            raw: "HTTP/1.1 200 OK\r\nContent-Length: 5, \(bodyWithForgery.utf8.count)\r\n\r\n" + bodyWithForgery,
            refused: true),
        Case(
            name: "negative CL", raw: "HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n" + bodyWithForgery, refused: true),
        Case(
            name: "non-numeric CL", raw: "HTTP/1.1 200 OK\r\nContent-Length: five\r\n\r\n" + bodyWithForgery,
            refused: true),
        Case(
            name: "gzip, chunked", raw: "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n" + chunkedForgery,
            refused: true),
        Case(
            name: "space before the colon of CL",
            raw: "HTTP/1.1 200 OK\r\nContent-Length : 5\r\n\r\n" + bodyWithForgery, refused: true),
        Case(
            name: "TE in an HTTP/1.0 response",
            raw: "HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunkedForgery, refused: true),
        Case(name: "status 099", raw: "HTTP/1.1 099 Odd\r\n\r\n" + forged, refused: true),
        Case(
            name: "body longer than CL", raw: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n" + bodyWithForgery,
            refused: false),
    ]

    private static func config(evil: TestOrigin, real: TestOrigin) -> String {
        """
        upstreams:
          - name: evil
            match: {hosts: [evil.test]}
            url: \(evil.baseURL)
            retry: {attempts: 1}
          - name: api
            match: {hosts: [api.test]}
            url: \(real.baseURL)
        """
    }

    @Test(
        "the next request on the client connection gets the real upstream's answer or a closed connection",
        arguments: cases)
    func noResponseSplitting(c: Case) async throws {
        let evil = try await TestOrigin.start { _ in .raw(Array(c.raw.utf8), close: true) }
        let real = try await TestOrigin.start { _ in .text(200, "real-answer") }
        let proxy = try await ProxyHarness.start(Self.config(evil: evil, real: real))
        let port = proxy.port
        let output = try await BlockingSocket.onThread {
            try rawExchange(
                port: port,
                Array(
                    ("GET http://evil.test/a HTTP/1.1\r\nHost: evil.test\r\n\r\n"
                        + "GET http://api.test/hello HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\n\r\n").utf8))
        }()
        await proxy.stop()
        try await evil.shutdown()
        try await real.shutdown()

        #expect(!output.contains("X-Injected"), "forged bytes reached the client: \(output.debugDescription)")
        #expect(!output.contains("forged"))
        let statusLines = output.split(separator: "\n", omittingEmptySubsequences: false).filter {
            $0.hasPrefix("HTTP/1.1 ")
        }
        #expect(statusLines.count <= 2)
        if c.refused {
            #expect(output.hasPrefix("HTTP/1.1 502 "), "\(output.prefix(120).debugDescription)")
            #expect(output.contains("\r\nX-Backstop-Error: bad-upstream-response\r\n"))
            // The refusal leaves the connection in a known state, so the next request is served, by the real upstream.
            #expect(statusLines.count == 2, "\(output.debugDescription)")
            #expect(output.hasSuffix("real-answer"))
        } else {
            // Exactly the announced body, then the connection closes: the excess can never be read as a response.
            #expect(output.hasPrefix("HTTP/1.1 200 "))
            #expect(output.contains("\r\nContent-Length: 5\r\n"))
            let body = output.components(separatedBy: "\r\n\r\n").dropFirst().first ?? ""
            #expect(body == "HELLO", "\(output.debugDescription)")
            // A longer body closes the client connection: the next request on it is not answered.
            #expect(statusLines.count == 1, "\(output.debugDescription)")
        }
    }

    @Test("a 204 reaches the client without the Content-Length its upstream gave it; a 304 keeps it")
    func noLengthOn204() async throws {
        let origin = try await TestOrigin.start { request in
            let status = request.uri == "/nc" ? "204 No Content" : "304 Not Modified"
            return .raw(Array("HTTP/1.1 \(status)\r\nContent-Length: 5\r\nX-Kept: yes\r\n\r\n".utf8), close: false)
        }
        let proxy = try await ProxyHarness.start(
            "upstreams:\n  - {name: a, match: {hosts: [a.test]}, url: \(origin.baseURL), retry: {attempts: 1}}\n")
        var failure: (any Error)?
        do {
            let noContent = try await proxy.get("http://a.test/nc", host: "a.test")
            #expect(noContent.status == 204 && noContent.header("X-Kept") == "yes")
            #expect(noContent.header("Content-Length") == nil)
            let notModified = try await proxy.get("http://a.test/nm", host: "a.test")
            #expect(notModified.status == 304 && notModified.header("Content-Length") == "5")
        } catch { failure = error }
        await proxy.stop()
        try? await origin.shutdown()
        if let failure { throw failure }
    }

    @Test("untrustworthy framing counts as a reset: retried, and the client sees the good second answer")
    func retriedAsReset() async throws {
        let lie = OriginAction.raw(
            Array(
                ("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
                    + Self.chunkedForgery).utf8), close: true)
        let origin = try await TestOrigin.start(script: TestOrigin.sequence([lie], then: .text(200, "good")))
        let proxy = try await ProxyHarness.start(
            """
            upstreams:
              - name: api
                match: {hosts: [api.test]}
                url: \(origin.baseURL)
                retry: {attempts: 2, on: [reset], backoff: {base: 1ms, max: 1ms}}
            """)
        let response = try await proxy.get("http://api.test/x", host: "api.test")
        #expect(response.status == 200)
        #expect(String(decoding: response.body, as: UTF8.self) == "good")
        #expect(response.header("X-Backstop-Attempts") == "2")
        #expect(origin.requestCount == 2)
        await proxy.stop()
        try await origin.shutdown()
    }

    @Test("a body shorter than its Content-Length ends with a closed connection, not a silently short body")
    func shorterBody() async throws {
        let origin = try await TestOrigin.start { _ in
            .raw(Array("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nHELLO".utf8), close: true)
        }
        let proxy = try await ProxyHarness.start(
            """
            upstreams:
              - {name: api, match: {hosts: [api.test]}, url: "\(origin.baseURL)", retry: {attempts: 1}}
            """)
        let port = proxy.port
        let output = try await BlockingSocket.onThread {
            try rawExchange(
                port: port,
                Array(
                    ("GET http://api.test/a HTTP/1.1\r\nHost: api.test\r\n\r\n"
                        + "GET http://api.test/b HTTP/1.1\r\nHost: api.test\r\n\r\n").utf8))
        }()
        await proxy.stop()
        try await origin.shutdown()
        // rawExchange returned within its bound, so Backstop closed the connection; the client can tell the body
        // was cut because fewer than 10 bytes followed the head.
        let body = output.components(separatedBy: "\r\n\r\n").dropFirst().joined(separator: "\r\n\r\n")
        #expect(output.hasPrefix("HTTP/1.1 200 ") || output.isEmpty)
        #expect(body.utf8.count < 10)
    }
}
