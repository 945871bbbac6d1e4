import BackstopCore
import NIOCore
import NIOHTTP1
import Testing

@testable import BackstopServer

/// Every transition of `ConnectionStateMachine`: pipelining, read holds, idle and body-stall deadlines, closing.
@Suite("Connection state machine")
struct ConnectionStateMachineTests {
    static let t0 = Duration.seconds(50)
    static let idle = Duration.seconds(60)
    static let head = HTTPServerRequestPart.head(HTTPRequestHead(version: .http1_1, method: .GET, uri: "/a"))
    static let body = HTTPServerRequestPart.body(ByteBuffer(string: "b"))

    @Test func anIdleConnectionClosesAtItsDeadline_aHeadKeepsItOpen() {
        var c = ConnectionStateMachine(idleTimeout: Self.idle, now: Self.t0)
        #expect(c.nextDeadline == Self.t0 + Self.idle)
        check(c.timerFired(now: Self.t0 + .seconds(59)), .wait(next: Self.t0 + Self.idle))
        check(c.timerFired(now: Self.t0 + Self.idle), .closeIdle)
        #expect(c.state == .closing)
        check(c.partArrived(Self.head), .dropped)
    }

    @Test func aRequestRunsHeadToEnd_thenTheConnectionIsIdleFromTheResponsesEnd() {
        var c = ConnectionStateMachine(idleTimeout: Self.idle, now: Self.t0)
        check(c.partArrived(Self.head), .process)
        c.headArrived(now: Self.t0 + .seconds(1))
        check(c.partArrived(.end(nil)), .process)
        check(c.endArrived(), true)
        #expect(c.request?.requestEnded == true)
        #expect(c.nextDeadline == nil, "no connection deadline while the response is pending")
        c.responseStarted()
        #expect(c.responseInProgress)
        check(c.responseEnded(close: false, now: Self.t0 + .seconds(3)), false)
        #expect(c.state == .idle(deadline: Self.t0 + .seconds(3) + Self.idle))
    }

    @Test func pipelinedRequestsWaitTheirTurnInOrder() {
        var c = ConnectionStateMachine(idleTimeout: Self.idle, now: Self.t0)
        check(c.partArrived(Self.head), .process)
        c.headArrived(now: Self.t0)
        check(c.partArrived(.end(nil)), .process)
        _ = c.endArrived()
        let second = HTTPServerRequestPart.head(HTTPRequestHead(version: .http1_1, method: .GET, uri: "/b"))
        check(c.partArrived(second), .queued)
        check(c.partArrived(.end(nil)), .queued)
        check(c.nextQueuedPart(), nil, "not while the first request is in flight")
        _ = c.responseEnded(close: false, now: Self.t0)
        check(c.nextQueuedPart(), second)
        c.headArrived(now: Self.t0)
        check(c.nextQueuedPart(), .end(nil))
        _ = c.endArrived()
        check(c.nextQueuedPart(), nil)
        #expect(c.queuedParts == 0)
    }

    @Test func aLongQueueHoldsReadsUntilItDrains() {
        var c = ConnectionStateMachine(idleTimeout: Self.idle, now: Self.t0)
        _ = c.partArrived(Self.head)
        c.headArrived(now: Self.t0)
        _ = c.endArrived()
        // 32 more pipelined requests (head + end each) fill the queue to its limit.
        for _ in 0..<(ConnectionStateMachine.maxQueuedParts / 2) {
            check(c.partArrived(Self.head), .queued)
            check(c.partArrived(.end(nil)), .queued)
        }
        #expect(c.readsHeld)
        check(c.readRequested(), false, "held: the read is remembered")
        // Answer requests one by one; once the queue is below half the limit, the remembered read is issued.
        var resumedAfter: Int?
        for answered in 1...20 where resumedAfter == nil {
            if c.responseEnded(close: false, now: Self.t0) { resumedAfter = answered }
            guard c.nextQueuedPart() != nil else { break }
            c.headArrived(now: Self.t0)
            check(c.nextQueuedPart(), .end(nil))
            _ = c.endArrived()
        }
        #expect(resumedAfter == 18, "queue 64 → 30 parts after 17 requests left it")
        #expect(!c.readsHeld)
        check(c.readRequested(), true)
    }

    @Test func anUploadHoldStopsReadsAndTheStallClock() {
        var c = ConnectionStateMachine(idleTimeout: Self.idle, now: Self.t0)
        _ = c.partArrived(Self.head)
        c.headArrived(now: Self.t0)
        c.holdUploads()
        check(c.readRequested(), false)
        #expect(c.nextDeadline == nil, "a client cannot be blamed for bytes Backstop refuses to read")
        check(c.timerFired(now: Self.t0 + .seconds(600)), .wait(next: nil))
        check(c.releaseUploads(now: Self.t0 + .seconds(600)), true)
        #expect(c.nextDeadline == Self.t0 + .seconds(600) + Self.idle, "the stall clock restarts")
        check(c.releaseUploads(now: Self.t0 + .seconds(601)), false, "nothing held, nothing to resume")
    }

    @Test func aBodyThatStopsArrivingIsDeclaredStalled() {
        var c = ConnectionStateMachine(idleTimeout: Self.idle, now: Self.t0)
        _ = c.partArrived(Self.head)
        c.headArrived(now: Self.t0)
        check(c.bodyArrived(now: Self.t0 + .seconds(30)), true)
        check(c.timerFired(now: Self.t0 + .seconds(60)), .wait(next: Self.t0 + .seconds(90)))
        check(c.timerFired(now: Self.t0 + .seconds(90)), .requestStalled)
        #expect(c.nextDeadline == nil)
    }

    @Test func aDiscardedRequestsPartsAreNotHandedOn_aClosingAnswerEndsTheConnection() {
        var c = ConnectionStateMachine(idleTimeout: Self.idle, now: Self.t0)
        _ = c.partArrived(Self.head)
        c.headArrived(now: Self.t0)
        c.discardRequest()
        check(c.bodyArrived(now: Self.t0), false)
        check(c.endArrived(), false)
        check(c.responseEnded(close: true, now: Self.t0), false)
        #expect(c.state == .closing)
        check(c.partArrived(Self.head), .dropped)
        c.headArrived(now: Self.t0)
        #expect(c.state == .closing, "nothing reopens a closing connection")
    }
}

/// `#expect(a == b)` for values produced by `mutating` calls, which `#expect` cannot take directly.
func check<T: Equatable>(
    _ actual: T, _ expected: T, _ comment: Comment? = nil,
    sourceLocation: Testing.SourceLocation = #_sourceLocation
) {
    #expect(actual == expected, comment, sourceLocation: sourceLocation)
}

/// The `upgrading` state of an accepted `CONNECT`.
@Suite("Connection state machine: CONNECT")
struct ConnectionUpgradeTests {
    static let t0 = Duration.seconds(50)
    static let idle = Duration.seconds(60)
    static let connect = HTTPServerRequestPart.head(
        HTTPRequestHead(version: .http1_1, method: .CONNECT, uri: "a.test:443"))

    @Test func anAcceptedConnectHoldsReadsDropsPartsAndHasNoDeadline() {
        var c = ConnectionStateMachine(idleTimeout: Self.idle, now: Self.t0)
        check(c.partArrived(Self.connect), .process)
        c.headArrived(now: Self.t0)
        c.discardRequest()
        c.beginUpgrade()
        #expect(c.state == .upgrading)
        #expect(c.readsHeld)
        check(c.readRequested(), false, "reads wait until the channel is handed over")
        check(c.partArrived(.end(nil)), .dropped)
        check(c.nextQueuedPart(), nil)
        #expect(c.nextDeadline == nil, "the tunnel's connect timeout bounds the wait, not the idle deadline")
        check(c.timerFired(now: Self.t0 + Self.idle * 2), .wait(next: nil))
        c.headArrived(now: Self.t0)
        #expect(c.state == .upgrading, "no further request starts")
    }

    @Test func aFailedUpgradeIsAnsweredAndCloses() {
        var c = ConnectionStateMachine(idleTimeout: Self.idle, now: Self.t0)
        _ = c.partArrived(Self.connect)
        c.headArrived(now: Self.t0)
        c.beginUpgrade()
        check(c.responseEnded(close: true, now: Self.t0), false)
        #expect(c.state == .closing)
    }

    @Test func onlyAnActiveRequestCanUpgrade() {
        var c = ConnectionStateMachine(idleTimeout: Self.idle, now: Self.t0)
        c.beginUpgrade()
        #expect(c.state == .idle(deadline: Self.t0 + Self.idle))
        c.close()
        c.beginUpgrade()
        #expect(c.state == .closing)
    }
}
