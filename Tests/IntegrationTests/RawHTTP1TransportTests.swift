import BackstopCore
import BackstopTestSupport
import NIOCore
import NIOPosix
import Testing

@testable import BackstopServer
@testable import BackstopTransport

/// The raw HTTP/1.1 path (docs/performance.md#libcurl-as-the-connection) beside curl's HTTP layer, over real
/// sockets: the same bytes reach the upstream, the same answers come back, connections are kept and the keep-alive
/// race is resent alike.
@Suite("Raw HTTP/1.1 transport", .serialized)
struct RawHTTP1TransportTests {
    /// Runs `body` once with each path: a transport with the raw path, then one with curl's HTTP layer.
    private static func withEachPath(
        origin script: @escaping TestOrigin.Script,
        _ body: (_ raw: Bool, _ origin: TestOrigin, _ fetcher: TransportFetcher) async throws -> Void
    ) async throws {
        for raw in [true, false] {
            let origin = try await TestOrigin.start(script: script)
            let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
            let transport = CurlMultiTransport(rawHTTP1: raw)
            let fetcher = TransportFetcher(transport: transport, eventLoop: group.next())
            do {
                try await body(raw, origin, fetcher)
            } catch {
                Issue.record("raw: \(raw): \(error)")
            }
            await transport.shutdown()
            try await group.shutdownGracefully()
            try await origin.shutdown()
        }
    }

    private static func get(
        _ origin: TestOrigin, _ target: String, method: String = "GET", body: String? = nil
    )
        -> TransportRequest
    {
        TransportRequest(
            url: origin.baseURL + target, method: method,
            headers: [(name: "Host", value: "up.test"), (name: "X-Client", value: "a, b")],
            body: body.map { .buffered(ByteBufferAllocator().buffer(string: $0)) } ?? .empty)
    }

    @Test("targets, methods and bodies reach the upstream byte for byte on both paths, over one kept connection")
    func byteForByte() async throws {
        let targets = [
            "/a%2Fb/c", "/a%2fb", "/%E2%82%AC/x", "/p?x=%2F&y=%2f&z=%E2%82%AC", "/p?a=1&a=1&a=", "/p?==&&", "/p?",
            "/:@!$&'()*+,;=", "//double//slash", "/p;x?y;z", "/a..b/c.d", "/p?q=a+b&r=%20&s=%25", "/p?a=%41%3d",
            "/filter[status]=open?sort=-a",
        ]
        try await Self.withEachPath(origin: { request in .text(200, "echo \(request.method) \(request.uri)") }) {
            raw, origin, fetcher in
            for target in targets {
                let result = await fetcher.fetch(Self.get(origin, target), timeout: .seconds(10))
                let response = try result.get()
                #expect(response.head.status == 200)
                #expect(String(decoding: response.body, as: UTF8.self) == "echo GET \(target)", "raw: \(raw)")
            }
            let posted = try await fetcher.fetch(
                Self.get(origin, "/post", method: "POST", body: "hello"), timeout: .seconds(10)
            ).get()
            #expect(posted.head.status == 200)
            let head = try await fetcher.fetch(Self.get(origin, "/h", method: "HEAD"), timeout: .seconds(10)).get()
            #expect(head.head.status == 200 && head.body.isEmpty)
            let seen = origin.requests
            #expect(seen.map(\.uri) == targets + ["/post", "/h"], "raw: \(raw)")
            #expect(seen.allSatisfy { $0.header("Host") == "up.test" && $0.header("X-Client") == "a, b" })
            #expect(seen[targets.count].bodyString == "hello")
            #expect(seen[targets.count].header("Content-Length") == "5")
            #expect(origin.connectionCount == 1, "raw: \(raw): one connection kept alive")
        }
    }

    @Test("a reused connection that dies before answering is resent once on a new one, when the request may be")
    func keepAliveRace() async throws {
        let script = TestOrigin.sequence([.text(200, "first"), .raw([], close: true)], then: .text(200, "again"))
        try await Self.withEachPath(origin: script) { raw, origin, fetcher in
            let first = try await fetcher.fetch(Self.get(origin, "/1"), timeout: .seconds(10)).get()
            #expect(String(decoding: first.body, as: UTF8.self) == "first")
            let second = try await fetcher.fetch(Self.get(origin, "/2"), timeout: .seconds(10)).get()
            #expect(String(decoding: second.body, as: UTF8.self) == "again", "raw: \(raw)")
            #expect(origin.requests.map(\.uri) == ["/1", "/2", "/2"], "raw: \(raw)")
            #expect(origin.connectionCount == 2, "raw: \(raw)")
        }
        let once = TestOrigin.sequence([.text(200, "first"), .raw([], close: true)], then: .text(200, "again"))
        try await Self.withEachPath(origin: once) { raw, origin, fetcher in
            _ = try await fetcher.fetch(Self.get(origin, "/1"), timeout: .seconds(10)).get()
            var request = Self.get(origin, "/2", method: "POST", body: "x")
            request.mayResend = false
            let result = await fetcher.fetch(request, timeout: .seconds(10))
            guard case .failure(let failure) = result else {
                Issue.record("raw: \(raw): a request that may not be repeated was resent")
                return
            }
            #expect(failure.label == "reset", "raw: \(raw): \(failure)")
            #expect(origin.requests.map(\.uri) == ["/1", "/2"], "raw: \(raw)")
        }
    }

    @Test("an idle connection the upstream closed is not used again; untrustworthy framing is a bad response")
    func closedIdleConnectionsAndFraming() async throws {
        let script = TestOrigin.sequence(
            [
                .raw(Array("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".utf8), close: true),
                .raw(Array("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\nok".utf8)),
            ], then: .text(200, "fine"))
        try await Self.withEachPath(origin: script) { raw, origin, fetcher in
            _ = try await fetcher.fetch(Self.get(origin, "/1"), timeout: .seconds(10)).get()
            // Whether the close reaches the transport while the connection is idle (never used again) or just after
            // the next request went out on it (resent on a new one), the next request gets a connection of its own.
            let result = await fetcher.fetch(Self.get(origin, "/2"), timeout: .seconds(10))
            guard case .failure(let failure) = result else {
                Issue.record("raw: \(raw): untrustworthy framing was relayed")
                return
            }
            #expect(failure.label == "bad-response", "raw: \(raw): \(failure)")
            let third = try await fetcher.fetch(Self.get(origin, "/3"), timeout: .seconds(10)).get()
            #expect(String(decoding: third.body, as: UTF8.self) == "fine")
            #expect(origin.requests.map(\.uri) == ["/1", "/2", "/3"], "raw: \(raw)")
            #expect(origin.connectionCount == 3, "raw: \(raw)")
        }
    }

    /// More TLS connections than one group holds (`HTTP1Connections.connectionsPerGroup`): curl connects each in its
    /// group's multi handle and finds it there for every send and receive; they are kept for reuse and all closed on
    /// shutdown.
    @Test("TLS connections spread over several groups are each read, written, reused and closed")
    func connectionsInSeveralGroups() async throws {
        let directory = try TestFiles.makeTemporaryDirectory()
        defer { TestFiles.remove(directory) }
        let certificates = try TestCertificates.generate(in: directory)
        // Each answer waits long enough that every request of a wave is in flight at once (a connection each).
        let origin = try await TestOrigin.start(tls: certificates.serverIdentity) { request in
            .delay(.milliseconds(request.uri.hasPrefix("/wave") ? 1_000 : 0), then: .text(200, "got \(request.uri)"))
        }
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let transport = CurlMultiTransport(rawHTTP1: true)
        let fetcher = TransportFetcher(transport: transport, eventLoop: group.next())
        let tls = TransportTLSOptions(caFile: certificates.caCertPath)
        let url = "https://localhost:\(origin.port)"
        func fetch(_ target: String) async throws -> String {
            let request = TransportRequest(
                url: url + target, method: "GET", headers: [(name: "Host", value: "up.test")], tls: tls)
            let response = try await fetcher.fetch(request, timeout: .seconds(20)).get()
            return "\(response.head.status) " + String(decoding: response.body, as: UTF8.self)
        }
        let wave = 2 * HTTP1Connections.connectionsPerGroup + 3
        let answers = try await withThrowingTaskGroup(of: String.self) { tasks in
            for n in 0..<wave { tasks.addTask { try await fetch("/wave/\(n)") } }
            return try await tasks.reduce(into: []) { $0.append($1) }
        }
        #expect(Set(answers) == Set((0..<wave).map { "200 got /wave/\($0)" }))
        let opened = origin.connectionCount
        #expect(opened > HTTP1Connections.connectionsPerGroup, "the wave needed connections in a second group")
        for n in 0..<wave { #expect(try await fetch("/again/\(n)") == "200 got /again/\(n)") }
        #expect(origin.connectionCount == opened, "later requests reused the connections")
        await transport.shutdown()
        try await Poll.until("every connection closed", within: .seconds(5)) { origin.openConnectionCount == 0 }
        try await group.shutdownGracefully()
        try await origin.shutdown()
    }
}
