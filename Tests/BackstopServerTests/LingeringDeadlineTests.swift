import Testing

@testable import BackstopServer

/// `LingeringDeadline`: a connection closed after its answer reads on until `idle` passes with nothing read, and
/// never past `total` after the answer.
@Suite("Lingering close deadline")
struct LingeringDeadlineTests {
    @Test("Nothing read: closed `idle` after the answer")
    func quietClient() {
        let deadline = LingeringDeadline(answeredAt: .seconds(100))
        #expect(deadline.deadline == .seconds(105))
        #expect(!deadline.isDue(now: .seconds(105) - .nanoseconds(1)))
        #expect(deadline.isDue(now: .seconds(105)))
    }

    @Test("Each read moves the deadline to `idle` after it")
    func readsMoveIt() {
        var deadline = LingeringDeadline(answeredAt: .seconds(100))
        deadline.bytesArrived(now: .seconds(103))
        #expect(deadline.deadline == .seconds(108))
        #expect(!deadline.isDue(now: .seconds(105)))
        deadline.bytesArrived(now: .milliseconds(107_500))
        #expect(deadline.deadline == .milliseconds(112_500))
        #expect(deadline.isDue(now: .milliseconds(112_500)))
    }

    @Test("A client that never stops sending is closed `total` after the answer")
    func endlessClient() {
        var deadline = LingeringDeadline(answeredAt: .seconds(100))
        for second in stride(from: 101, through: 140, by: 1) {
            deadline.bytesArrived(now: .seconds(second))
            #expect(deadline.deadline == min(.seconds(second + 5), .seconds(130)))
        }
        #expect(deadline.last == .seconds(130))
        #expect(deadline.isDue(now: .seconds(130)))
        #expect(!deadline.isDue(now: .seconds(130) - .nanoseconds(1)))
    }
}
