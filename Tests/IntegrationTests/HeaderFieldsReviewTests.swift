import BackstopTestSupport
import Foundation
import Testing

/// The adversarial review of header fields as bytes (docs/performance.md#header-fields-as-bytes), end to end: a
/// hostile but valid head through the real proxy reaches the origin as exactly the fields it should.
@Suite("Header fields as bytes through the proxy")
struct HeaderFieldsEndToEndReviewTests {
    @Test("a hostile head: hop-by-hop and Connection-listed fields go, Host is the upstream's, Via skips an empty one")
    func hostileHead() async throws {
        try await withOriginAndProxy(
            origin: { _ in .text(200, "ok") }, config: { singleUpstreamConfig($0) }
        ) { origin, proxy in
            let names = (0..<2_000).map { "x-\($0)" }.joined(separator: ", ")
            let head =
                "POST http://app.test/p HTTP/1.1\r\nHost: other.test\r\n"
                + "Connection: keep-alive, X-Hop, content-length, \(names)\r\nX-Hop: 1\r\nx-1999: listed\r\n"
                + "Content-Length: 5\r\nVia:\r\nvia: 1.0 client\r\nX-Ws:\t a \t b\r\nX-Empty:\r\nX-Utf8: caf\u{E9}\r\n"
                + "cOnTeNt-TyPe: text/plain\r\nPROXY-AUTHORIZATION: Basic eA==\r\ntRaNsFeR-eNcOdInG-X: kept\r\n\r\nhello"
            let response = try await proxy.send(Array(head.utf8))
            #expect(response.status == 200)
            let seen = try #require(origin.requests.first)
            #expect(seen.headers(named: "host") == ["127.0.0.1:\(origin.port)"])
            #expect(seen.headers(named: "via") == ["1.0 client, 1.1 backstop"])
            #expect(
                seen.header("X-Ws") == "a \t b" && seen.header("X-Empty") == "" && seen.header("X-Utf8") == "caf\u{E9}")
            #expect(seen.header("content-type") == "text/plain" && seen.header("Content-Length") == "5")
            #expect(seen.header("tRaNsFeR-eNcOdInG-X") == "kept")
            for gone in ["X-Hop", "x-1999", "Connection", "Proxy-Authorization", "Transfer-Encoding"] {
                #expect(seen.header(gone) == nil, "\(gone) must not be forwarded")
            }
            #expect(seen.bodyString == "hello")
        }
    }

    @Test("two Host lines are refused with 400 bad-request and nothing reaches the origin")
    func twoHostLines() async throws {
        try await withOriginAndProxy(
            origin: { _ in .text(200, "ok") }, config: { singleUpstreamConfig($0) }
        ) { origin, proxy in
            let head = "GET http://app.test/p HTTP/1.1\r\nHost: app.test\r\nhost: other.test\r\n\r\n"
            let response = try await proxy.send(Array(head.utf8))
            #expect(response.status == 400)
            #expect(response.header("X-Backstop-Error") == "bad-request")
            #expect(origin.requests.isEmpty)
        }
    }
}
