import BackstopCore
import BackstopTransport
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
import NIOHTTP1
import Testing

@testable import BackstopServer

/// `ProxyHandler` and `Exchange` with a scripted transport: requests in, bytes out, transfers started and answered by
/// the test. Each test that does not move time runs both embedded (an `EmbeddedChannel`, a manual clock) and live
/// (the daemon's pipeline behind a loopback listener, a real client socket): `HandlerHarness`.
@Suite("Proxy handler (embedded and live)")
struct ProxyHandlerTests {
    static let upstream = """
        upstreams:
          - name: app
            match: {hosts: [app.test]}
            url: http://origin.test:8000/base
            retry: {attempts: 2, backoff: {strategy: constant, base: 100ms, max: 1s, jitter: none}}
        limits: {client_idle_timeout: 30s}
        """

    @Test(arguments: HandlerHarnessMode.allCases)
    func aRequestIsForwardedAndItsResponseRelayedWithTheAttemptCount(_ mode: HandlerHarnessMode) throws {
        let h = try mode.harness(Self.upstream)
        try h.send(
            "GET http://app.test/x?y=1 HTTP/1.1\r\nHost: app.test\r\nConnection: keep-alive, X-Drop\r\nX-Drop: 1\r\n\r\n"
        )
        try #require(h.waitForTransfers(1))
        #expect(h.transport.transfers.count == 1)
        let request = h.transport.transfers[0].request
        #expect(request.url == "http://origin.test:8000/base/x?y=1")
        #expect(request.headers.first { $0.name == "Host" }?.value == "origin.test:8000")
        #expect(request.headers.contains { $0.name == "Via" && $0.value == "1.1 backstop" })
        #expect(!request.headers.contains { $0.name.lowercased() == "x-drop" || $0.name.lowercased() == "connection" })
        h.answer(0, body: "hello")
        let out = try h.output(until: { $0.hasSuffix("hello") })
        #expect(out.hasPrefix("HTTP/1.1 200 OK\r\n"))
        #expect(out.contains("X-Backstop-Attempts: 1\r\n"))
        #expect(out.contains("Content-Length: 5\r\n"))
        #expect(out.hasSuffix("\r\n\r\nhello"))
        // The finished exchange let go of its transfer (whose sink holds the exchange): nothing is left alive.
        #expect(h.eventually { h.transport.transfers[0].transfer == nil })
        // The connection serves the next request.
        try h.send("GET http://app.test/next HTTP/1.1\r\nHost: app.test\r\n\r\n")
        #expect(h.waitForTransfers(2))
    }

    @Test(arguments: HandlerHarnessMode.allCases)
    func pipelinedRequestsAreAnsweredInOrder_theSecondStartsAfterTheFirstEnds(_ mode: HandlerHarnessMode) throws {
        let h = try mode.harness(Self.upstream)
        try h.send(
            "GET http://app.test/1 HTTP/1.1\r\nHost: app.test\r\n\r\nGET http://app.test/2 HTTP/1.1\r\nHost: app.test\r\n\r\n"
        )
        try #require(h.waitForTransfers(1))
        #expect(h.transport.transfers.count == 1, "one request at a time")
        h.answer(0, body: "first")
        try #require(h.waitForTransfers(2))
        #expect(h.transport.transfers[1].request.url.hasSuffix("/base/2"))
        h.answer(1, body: "second")
        let out = try h.output(until: { $0.hasSuffix("second") })
        let first = try #require(out.range(of: "first"))
        let second = try #require(out.range(of: "second"))
        #expect(first.lowerBound < second.lowerBound)
    }

    @Test func a503IsRetriedWhenTheTimerFires_theClientSeesOneResponse() throws {
        let h = try EmbeddedHandlerHarness(Self.upstream)
        try h.send("GET http://app.test/r HTTP/1.1\r\nHost: app.test\r\n\r\n")
        let first = h.transport.transfers[0].handle
        h.answer(0, status: 503, body: "busy")
        #expect(first.abandoned != nil, "a small retried response is left to finish")
        #expect(try h.output().isEmpty, "the retried response never reaches the client")
        h.advance(by: .milliseconds(99))
        #expect(h.transport.transfers.count == 1)
        h.advance(by: .milliseconds(1))
        #expect(h.transport.transfers.count == 2)
        h.answer(1, body: "done")
        let out = try h.output()
        #expect(out.contains("X-Backstop-Attempts: 2\r\n"))
        #expect(out.hasSuffix("done"))
    }

    @Test(arguments: HandlerHarnessMode.allCases)
    func noRouteIsAnsweredLocally_theConnectionStaysUsable(_ mode: HandlerHarnessMode) throws {
        let h = try mode.harness(Self.upstream)
        try h.send("GET http://other.test/ HTTP/1.1\r\nHost: other.test\r\n\r\n")
        let refused = try h.output(until: isWholeResponse)
        #expect(refused.hasPrefix("HTTP/1.1 403 Forbidden\r\n"))
        #expect(refused.contains("X-Backstop-Error: no-route\r\n"))
        #expect(h.transport.transfers.isEmpty)
        try h.send("GET http://app.test/ok HTTP/1.1\r\nHost: app.test\r\n\r\n")
        #expect(h.waitForTransfers(1))
        #expect(h.transport.transfers.count == 1)
    }

    @Test func anIdleConnectionIsClosedAtClientIdleTimeout() throws {
        let h = try EmbeddedHandlerHarness(Self.upstream)
        h.advance(by: .seconds(29))
        #expect(h.channel.isActive)
        h.advance(by: .seconds(1))
        #expect(!h.channel.isActive)
    }

    @Test func aHeadTrickledPastHeaderTimeoutGets408_eachRequestGetsItsOwnClock() throws {
        let h = try EmbeddedHandlerHarness(Self.upstream.replacing("30s}", with: "30s, header_timeout: 5s}"))
        // A complete request resets the clock: the next head's first byte starts a new one.
        h.advance(by: .seconds(4))
        try h.send("GET http://app.test/1 HTTP/1.1\r\nHost: app.test\r\n\r\n")
        h.answer(0, body: "ok")
        _ = try h.output()
        h.advance(by: .seconds(4))
        // One byte every second never stalls the connection (client_idle_timeout is 30 s) but the head never ends.
        for byte in "GET http://app.test/2 HT" {
            try h.send(String(byte))
            h.advance(by: .milliseconds(200))
        }
        #expect(try h.output().isEmpty)
        #expect(h.channel.isActive)
        h.advance(by: .milliseconds(200))
        let out = try h.output()
        #expect(out.hasPrefix("HTTP/1.1 408 Request Timeout\r\n"))
        #expect(out.contains("X-Backstop-Error: request-timeout\r\n"))
        #expect(!h.channel.isActive)
        #expect(h.transport.transfers.count == 1)
    }

    @Test func headDeadlineTransitions() {
        var d = HeadDeadline(timeout: .seconds(10))
        #expect(d.timerFired(now: .seconds(100)) == .wait(next: nil))
        #expect(d.bytesArrived(now: .seconds(1)) == .seconds(11))
        #expect(d.bytesArrived(now: .seconds(2)) == nil, "later bytes of the same head do not move the deadline")
        #expect(d.timerFired(now: .seconds(10)) == .wait(next: .seconds(11)))
        d.headReceived()
        #expect(d.state == .between)
        #expect(d.bytesArrived(now: .seconds(12)) == nil, "body bytes start no clock")
        #expect(d.timerFired(now: .seconds(30)) == .wait(next: nil))
        d.awaitNextHead()
        #expect(d.bytesArrived(now: .seconds(40)) == .seconds(50))
        #expect(d.timerFired(now: .seconds(50.5)) == .expired(waited: .seconds(10.5)))
        #expect(d.state == .expired)
        d.awaitNextHead()
        d.headReceived()
        #expect(d.state == .expired, "expired is terminal")
    }

    @Test func aStalledBodyGets408AndTheTransferIsNeverStarted() throws {
        let h = try EmbeddedHandlerHarness(Self.upstream)
        try h.send("POST http://app.test/p HTTP/1.1\r\nHost: app.test\r\nContent-Length: 10\r\n\r\nabc")
        h.advance(by: .seconds(30))
        let out = try h.output()
        #expect(out.hasPrefix("HTTP/1.1 408 Request Timeout\r\n"))
        #expect(out.contains("X-Backstop-Error: request-timeout\r\n"))
        #expect(h.transport.transfers.isEmpty)
    }

    @Test(arguments: HandlerHarnessMode.allCases)
    func aClientDisconnectCancelsTheTransfer(_ mode: HandlerHarnessMode) throws {
        let h = try mode.harness(Self.upstream)
        try h.send("GET http://app.test/slow HTTP/1.1\r\nHost: app.test\r\n\r\n")
        try #require(h.waitForTransfers(1))
        let transfer = h.transport.transfers[0].handle  // held here: the exchange lets go of it when it ends
        #expect(!transfer.cancelled)
        try h.disconnect()
        #expect(h.eventually { transfer.cancelled })
    }

    @Test(arguments: HandlerHarnessMode.allCases)
    func aBodyLongerThanItsContentLengthClosesTheConnectionAfterTheAnnouncedBytes(_ mode: HandlerHarnessMode) throws {
        let h = try mode.harness(Self.upstream)
        try h.send("GET http://app.test/lie HTTP/1.1\r\nHost: app.test\r\n\r\n")
        try #require(h.waitForTransfers(1))
        let transfer = h.transport.transfers[0].handle
        h.deliver(
            0, [.head(UpstreamResponseHead(status: 200, contentLength: 3)), .body(ByteBuffer(string: "abcINJECTED"))])
        let out = try h.output(until: { $0.hasSuffix("\r\n\r\nabc") })
        #expect(out.hasSuffix("\r\n\r\nabc"))
        #expect(!out.contains("INJECTED"))
        #expect(h.waitForClose())
        #expect(h.eventually { transfer.cancelled })
    }
}
