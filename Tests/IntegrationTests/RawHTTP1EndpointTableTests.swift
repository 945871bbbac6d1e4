import BackstopCore
import BackstopTestSupport
import NIOCore
import NIOPosix
import Testing

@testable import BackstopServer
@testable import BackstopTransport

/// The raw HTTP/1.1 path's endpoint table stays bounded (docs/performance.md#libcurl-as-the-connection): past its
/// limit, endpoints without a connection are forgotten with their pool buckets, while endpoints with idle
/// connections stay and reuse them; over real loopback origins, one port each.
@Suite("Raw HTTP/1.1 endpoint table", .serialized)
struct RawHTTP1EndpointTableTests {
    @Test("past its limit the table forgets endpoints without connections; those with idle ones stay and reuse them")
    func forgetsUnusedEndpoints() async throws {
        let limit = 4
        // Keep-alive origins (their connections are parked) and origins answering `Connection: close` (their
        // connection is closed when the response ends, before the fetch returns).
        var kept: [TestOrigin] = []
        var closing: [TestOrigin] = []
        for i in 0..<5 {
            kept.append(try await TestOrigin.start { _ in .text(200, "kept \(i)") })
        }
        for i in 0..<5 {
            closing.append(
                try await TestOrigin.start { _ in .text(200, "closing \(i)", headers: [("Connection", "close")]) })
        }
        // An origin that drops the connection it kept, then answers on a new one and closes that too.
        let stale = try await TestOrigin.start(
            script: TestOrigin.sequence(
                [.text(200, "first"), .raw([], close: true)],
                then: .text(200, "again", headers: [("Connection", "close")])))
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let transport = CurlMultiTransport(
            name: "backstop-curl", logger: nil, rawHTTP1: true, maxHTTP1Endpoints: limit)
        let fetcher = TransportFetcher(transport: transport, eventLoop: group.next())
        var table: [Int] = []

        /// One GET to `origin`, which must answer `expected`; the table's size after it is noted in `table`.
        func fetch(_ origin: TestOrigin, _ expected: String) async throws {
            let request = TransportRequest(url: origin.baseURL + "/", method: "GET", headers: [], body: .empty)
            let response = try await fetcher.fetch(request, timeout: .seconds(10)).get()
            #expect(response.head.status == 200)
            #expect(String(decoding: response.body, as: UTF8.self) == expected, "a request reached another origin")
            table.append(transport.http1.endpointCount)
        }

        do {
            // Two endpoints with idle connections between two without, then more without: each sweep keeps the two.
            // The first sweep forgets the endpoints numbered 0 and 2 and keeps 1 and 3: numbers taken from the
            // table's size would give the next two endpoints 2 and 3, and the second would take the idle
            // connection of the endpoint numbered 3 (its request would reach another origin).
            try await fetch(closing[0], "closing 0")
            try await fetch(kept[0], "kept 0")
            try await fetch(closing[1], "closing 1")
            try await fetch(kept[1], "kept 1")
            for i in [2, 3, 4, 0, 1, 2] { try await fetch(closing[i], "closing \(i)") }
            #expect(table == [1, 2, 3, 4, 3, 4, 3, 4, 3, 4], "swept when a new endpoint would pass \(limit)")
            // The swept-over endpoints still find their parked connections.
            try await fetch(kept[0], "kept 0")
            try await fetch(kept[1], "kept 1")
            #expect(kept[0].connectionCount == 1 && kept[1].connectionCount == 1, "idle connections were reused")
            #expect(closing.map(\.connectionCount) == [2, 2, 2, 1, 1], "one connection per request")

            // Every endpoint in use: the table grows past the limit rather than forget one with a connection.
            table = []
            for i in 2..<5 { try await fetch(kept[i], "kept \(i)") }
            #expect(table == [3, 4, 5], "a sweep forgot the two closing endpoints, the next one kept all four")
            for i in 0..<5 { try await fetch(kept[i], "kept \(i)") }
            #expect(kept.map(\.connectionCount) == [1, 1, 1, 1, 1], "every endpoint kept its connection")
            #expect(kept.map(\.requestCount) == [3, 3, 2, 2, 2])
            #expect(transport.http1.endpointCount == 5)

            // A connection that could not connect, one the upstream dropped while kept (found dead while idle, or
            // resent once on a new one) and the new one closed after its answer each gave their endpoint's count
            // back: the next sweep (at twice the five in use) forgets those two endpoints with the closing one.
            table = []
            let refused = TransportRequest(
                url: "http://127.0.0.1:\(try FreePort.reserveClosedPort())/", method: "GET", headers: [], body: .empty)
            if case .success = await fetcher.fetch(refused, timeout: .seconds(10)) {
                Issue.record("a closed port answered")
            }
            table.append(transport.http1.endpointCount)
            try await fetch(stale, "first")
            try await fetch(stale, "again")
            try await fetch(closing[0], "closing 0")
            try await fetch(closing[1], "closing 1")
            #expect(table == [6, 7, 7, 8, 6], "every connection's end was counted")
            #expect(stale.connectionCount == 2 && stale.requestCount == 3, "the dropped request was resent")
        } catch {
            Issue.record("\(error)")
        }
        await transport.shutdown()
        try await group.shutdownGracefully()
        for origin in kept + closing + [stale] { try await origin.shutdown() }
    }
}
