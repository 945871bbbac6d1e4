import NIOCore
import Testing

@testable import BackstopTransport

/// `HTTP1URL` and `HTTP1RequestHead`: what the raw HTTP/1.1 path writes, compared as whole heads.
@Suite("HTTP/1.1 request head")
struct HTTP1RequestTests {
    @Test(arguments: [
        ("http://127.0.0.1:8080/a/b?x=1", false, "http://127.0.0.1:8080", "127.0.0.1:8080", "/a/b?x=1"),
        ("https://api.example.com", true, "https://api.example.com", "api.example.com", "/"),
        ("HTTP://h:1?q", false, "HTTP://h:1", "h:1", "/?q"),
        ("http://[::1]:9/%2F%2e/?a=1&a=2#frag", false, "http://[::1]:9", "[::1]:9", "/%2F%2e/?a=1&a=2"),
        ("http://h/p//q;x=1?k=%20&%41#", false, "http://h", "h", "/p//q;x=1?k=%20&%41"),
    ])
    func urlsSplitIntoOriginAndTargetByteForByte(
        url: String, secure: Bool, origin: String, authority: String, target: String
    ) throws {
        let parts = try #require(HTTP1URL(url))
        #expect(parts.secure == secure)
        #expect(parts.origin(in: url) == origin)
        #expect(parts.authority(in: url) == authority)
        #expect(parts.target(in: url) == target)
    }

    @Test func urlsTheRawPathLeavesToCurl() {
        for url in ["ftp://h/x", "http:/h/x", "http:///x", "http://user:pw@h/x", "h/x", ""] {
            #expect(HTTP1URL(url) == nil, "\(url)")
        }
    }

    @Test func theHostValueDropsOnlyTheSchemesDefaultPort() {
        func host(_ url: String) -> Substring? { HTTP1URL(url)?.hostValue(in: url) }
        #expect(host("http://h:80/") == "h")
        #expect(host("https://h:443/") == "h")
        #expect(host("http://h:443/") == "h:443")
        #expect(host("http://h:8080/") == "h:8080")
        #expect(host("http://[::1]:80/") == "[::1]")
        #expect(host("http://:80/") == ":80")
    }

    static func head(_ request: TransportRequest) -> String {
        var buffer = ByteBufferAllocator().buffer(capacity: 0)
        let url = HTTP1URL(request.url)!
        HTTP1RequestHead.write(request, url: url, framing: HTTP1RequestHead.framing(of: request), into: &buffer)
        return String(buffer: buffer)
    }

    @Test func aGetCarriesItsFieldsInOrderAndNoFraming() {
        let request = TransportRequest(
            url: "http://h:1/p?q", method: "GET",
            headers: [(name: "Host", value: "up"), (name: "X-Empty", value: ""), (name: "Via", value: "1.1 backstop")])
        #expect(Self.head(request) == "GET /p?q HTTP/1.1\r\nHost: up\r\nX-Empty:\r\nVia: 1.1 backstop\r\n\r\n")
    }

    @Test func hostComesFromTheURLWhenTheRequestHasNone() {
        let request = TransportRequest(url: "https://auth.example:443/token", method: "POST", headers: [])
        #expect(Self.head(request) == "POST /token HTTP/1.1\r\nHost: auth.example\r\nContent-Length: 0\r\n\r\n")
    }

    @Test func bodiesAreFramedByTheirLengthOrChunked() {
        let body = ByteBufferAllocator().buffer(string: "hello")
        let buffered = TransportRequest(
            url: "http://h/", method: "PUT", headers: [(name: "Content-Length", value: "99")], body: .buffered(body))
        #expect(HTTP1RequestHead.framing(of: buffered) == .length(5))
        #expect(Self.head(buffered) == "PUT / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\n")
        let declared = RequestBodyStream(expectedLength: 7) {}
        #expect(
            HTTP1RequestHead.framing(
                of: TransportRequest(url: "http://h/", method: "POST", headers: [], body: .streaming(declared)))
                == .length(7))
        let undeclared = RequestBodyStream(expectedLength: nil) {}
        let chunked = TransportRequest(
            url: "http://h/", method: "POST", headers: [(name: "Transfer-Encoding", value: "gzip")],
            body: .streaming(undeclared))
        #expect(Self.head(chunked) == "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n")
        #expect(
            HTTP1RequestHead.framing(of: TransportRequest(url: "http://h/", method: "DELETE", headers: [])) == .none)
        #expect(
            HTTP1RequestHead.framing(
                of: TransportRequest(url: "http://h/", method: "HEAD", headers: [], body: .buffered(body)))
                == .none)
    }

    @Test func fieldsThatWouldSplitALineAreLeftOut() {
        let request = TransportRequest(
            url: "http://h/", method: "GET",
            headers: [
                (name: "X-A", value: "1\r\nX-Injected: 1"), (name: "X-B\n", value: "2"), (name: "X-C", value: "a\0b"),
                (name: "X-D", value: "ok"),
            ])
        #expect(Self.head(request) == "GET / HTTP/1.1\r\nHost: h\r\nX-D: ok\r\n\r\n")
    }
}

extension HTTP1RequestTests {
    /// CR, LF or NUL anywhere in a field of any length (`HeaderFields` refuses it; values are checked eight bytes
    /// at a time) leaves the field out, and only that field.
    @Test func aBreakingByteAtAnyPlaceOfAFieldOfAnyLengthLeavesItOut() {
        for length in 1...72 {
            for position in 0..<length {
                for bad in ["\r", "\n", "\0"] {
                    var value = Array(repeating: "v", count: length)
                    value[position] = bad
                    let request = TransportRequest(
                        url: "http://h/", method: "GET",
                        headers: [
                            (name: "X-Before", value: String(repeating: "b", count: length)),
                            (name: "X-Bad", value: value.joined()),
                            (name: "X-After", value: "\t" + String(repeating: "a", count: length)),
                        ])
                    let expected =
                        "GET / HTTP/1.1\r\nHost: h\r\nX-Before: \(String(repeating: "b", count: length))\r\n"
                        + "X-After: \t\(String(repeating: "a", count: length))\r\n\r\n"
                    #expect(Self.head(request) == expected, "length \(length), position \(position)")
                }
            }
        }
    }

    @Test func theHeadBufferHoldsTheSameHeadWithRoomForTheBody() {
        let request = TransportRequest(
            url: "http://h:1/p", method: "POST",
            headers: [
                (name: "Host", value: "up"), (name: "Authorization", value: String(repeating: "t", count: 1024)),
            ],
            body: .buffered(ByteBufferAllocator().buffer(string: "hello")))
        let url = HTTP1URL(request.url)!
        let framing = HTTP1RequestHead.framing(of: request)
        let buffer = HTTP1RequestHead.buffer(
            request, url: url, framing: framing, extraCapacity: 5, allocator: ByteBufferAllocator())
        #expect(String(buffer: buffer) == Self.head(request))
        #expect(buffer.writableBytes >= 5)
    }
}

/// `IdleConnectionPool`: newest first, bounded, aged out; an emptied bucket kept until its key is forgotten.
@Suite("Idle connection pool")
struct IdleConnectionPoolTests {
    final class Connection {}

    @Test func theNewestIdleConnectionOfTheKeyIsTaken() {
        var pool = IdleConnectionPool<String, Connection>(capacity: 2, maxAgeMS: 100)
        let a = Connection()
        let b = Connection()
        let c = Connection()
        let puts = [pool.put(a, "x", now: 0), pool.put(b, "x", now: 1), pool.put(c, "y", now: 2)]
        #expect(puts == [true, true, false])
        #expect(pool.count == 2)
        let taken = [pool.take("y", now: 3), pool.take("x", now: 3), pool.take("x", now: 3), pool.take("x", now: 3)]
        #expect(taken[0].connection == nil && taken[3].connection == nil)
        #expect(taken[1].connection === b && taken[2].connection === a)
        #expect(taken.allSatisfy { $0.expired.isEmpty })
        #expect(pool.count == 0)
    }

    @Test func connectionsPastTheirAgeAreHandedBackToClose() {
        var pool = IdleConnectionPool<String, Connection>(capacity: 4, maxAgeMS: 100)
        let a = Connection()
        let b = Connection()
        _ = pool.put(a, "x", now: 0)
        _ = pool.put(b, "x", now: 10)
        let taken = pool.take("x", now: 110)
        #expect(taken.connection == nil)
        #expect(taken.expired.count == 2 && taken.expired[0] === b && taken.expired[1] === a)
        #expect(pool.count == 0)
    }

    @Test func aSweepClosesWhatIsTooOldInEveryKeyAndKeepsTheRest() {
        var pool = IdleConnectionPool<String, Connection>(capacity: 8, maxAgeMS: 100)
        let x = [Connection(), Connection(), Connection()]
        let y = Connection()
        _ = pool.put(x[0], "x", now: 0)
        _ = pool.put(x[1], "x", now: 20)
        _ = pool.put(y, "y", now: 10)
        _ = pool.put(x[2], "x", now: 90)
        #expect(pool.expire(now: 99).isEmpty)
        let expired = pool.expire(now: 125)
        #expect(expired.count == 3 && expired.contains { $0 === x[0] } && expired.contains { $0 === x[1] })
        #expect(expired.contains { $0 === y })
        #expect(pool.count == 1)
        let taken = [pool.take("x", now: 126), pool.take("y", now: 126)]
        #expect(taken[0].connection === x[2] && taken[0].expired.isEmpty)
        #expect(taken[1].connection == nil && taken[1].expired.isEmpty)
        #expect(pool.count == 0)
    }

    @Test func keysTakenInTurnEachFindTheirOwnConnections() {
        var pool = IdleConnectionPool<String, Connection>(capacity: 8, maxAgeMS: 100)
        let x = [Connection(), Connection()]
        let y = [Connection(), Connection()]
        for i in 0..<2 {
            _ = pool.put(x[i], "x", now: 0)
            _ = pool.put(y[i], "y", now: 50)
        }
        let taken = [
            pool.take("x", now: 60), pool.take("y", now: 60), pool.take("z", now: 60), pool.take("x", now: 60),
            pool.take("x", now: 60),
        ]
        #expect(taken[0].connection === x[1] && taken[1].connection === y[1] && taken[2].connection == nil)
        #expect(taken[3].connection === x[0] && taken[4].connection == nil)
        // The key used last expires whole, and a connection parked for it afterwards is found again.
        let expired = pool.take("y", now: 150)
        #expect(expired.connection == nil && expired.expired.count == 1 && expired.expired[0] === y[0])
        let again = Connection()
        let parked = pool.put(again, "y", now: 150)
        let removed = pool.remove(x[0], "x")
        let found = pool.take("y", now: 151)
        #expect(parked && !removed && found.connection === again)
        #expect(pool.count == 0)
    }

    @Test func aConnectionThatWentBadIsRemoved() {
        var pool = IdleConnectionPool<String, Connection>(capacity: 4)
        let a = Connection()
        let b = Connection()
        _ = pool.put(a, "x", now: 0)
        _ = pool.put(b, "x", now: 0)
        let removed = [pool.remove(a, "x"), pool.remove(a, "x")]
        #expect(removed == [true, false])
        #expect(pool.count == 1)
        let rest = pool.removeAll()
        #expect(rest.count == 1 && rest[0] === b)
        #expect(pool.count == 0)
    }

    @Test func anEmptiedBucketStaysUntilItsKeyIsForgotten() {
        var pool = IdleConnectionPool<String, Connection>(capacity: 4)
        let a = Connection()
        _ = pool.put(a, "x", now: 0)
        _ = pool.put(Connection(), "y", now: 0)
        let taken = pool.take("x", now: 1)
        #expect(taken.connection === a && pool.bucketCount == 2, "an emptied bucket stays for the next put")
        let dropped = [pool.removeEmptyBucket("x"), pool.removeEmptyBucket("x"), pool.removeEmptyBucket("z")]
        #expect(dropped == [true, true, true], "a key without a bucket has nothing to drop")
        #expect(pool.bucketCount == 1 && pool.count == 1)
        let refused = pool.removeEmptyBucket("y")
        #expect(!refused && pool.bucketCount == 1 && pool.count == 1, "a bucket with connections stays")
    }

    @Test func aDroppedBucketOfTheLastKeyIsNotUsedAgain() {
        // The take made "x" the last key: once its bucket is dropped, the next put for "x" must land in a new
        // bucket the pool knows (counted, and found after another key was used), not in the dropped one.
        var pool = IdleConnectionPool<String, Connection>(capacity: 4)
        _ = pool.put(Connection(), "x", now: 0)
        _ = pool.take("x", now: 1)
        let dropped = pool.removeEmptyBucket("x")
        let again = Connection()
        let parked = [pool.put(again, "x", now: 2), pool.put(Connection(), "y", now: 2)]
        #expect(dropped && parked == [true, true] && pool.bucketCount == 2)
        let found = pool.take("x", now: 3)
        #expect(found.connection === again)
    }
}

/// `HTTP1Endpoint.matches`: a request reuses an endpoint's connections only for the same origin, byte for byte, the
/// same TLS options and the same passthrough rules.
@Suite("Raw path endpoints")
struct HTTP1EndpointTests {
    static func endpoint(
        _ origin: String, tls: TransportTLSOptions = .init(), passthrough: Bool = false
    )
        -> HTTP1Endpoint
    {
        HTTP1Endpoint(key: HTTP1PoolKey(origin: origin, tls: tls, passthrough: passthrough), id: 0)
    }

    static func matches(
        _ endpoint: HTTP1Endpoint, _ url: String, tls: TransportTLSOptions = .init(), passthrough: Bool = false
    ) -> Bool {
        let request = TransportRequest(
            url: url, method: "GET", headers: [], tls: tls, passthrough: passthrough)
        return endpoint.matches(request, url: HTTP1URL(url)!)
    }

    @Test func theSameOriginMatchesWhateverTheTarget() {
        let endpoint = Self.endpoint("http://127.0.0.1:8080")
        #expect(Self.matches(endpoint, "http://127.0.0.1:8080/a?b"))
        #expect(Self.matches(endpoint, "http://127.0.0.1:8080"))
        #expect(Self.matches(endpoint, "http://127.0.0.1:8080?q"))
    }

    @Test func anotherOriginDoesNotMatchEvenAsAPrefixOrInAnotherCase() {
        let endpoint = Self.endpoint("http://h:1")
        #expect(!Self.matches(endpoint, "http://h:10/"))
        #expect(!Self.matches(endpoint, "http://h/"))
        #expect(!Self.matches(endpoint, "https://h:1/"))
        #expect(!Self.matches(endpoint, "http://H:1/"))
    }

    @Test func otherTLSOptionsOrPassthroughRulesDoNotMatch() {
        let ca = TransportTLSOptions(caFile: "/ca.pem")
        let plain = Self.endpoint("https://h")
        let withCA = Self.endpoint("https://h", tls: ca)
        #expect(!Self.matches(plain, "https://h/", tls: ca))
        #expect(!Self.matches(withCA, "https://h/"))
        #expect(Self.matches(withCA, "https://h/", tls: ca))
        #expect(!Self.matches(withCA, "https://h/", tls: TransportTLSOptions(caFile: "/other.pem")))
        #expect(!Self.matches(plain, "https://h/", passthrough: true))
        #expect(Self.matches(Self.endpoint("https://h", passthrough: true), "https://h/", passthrough: true))
    }
}
