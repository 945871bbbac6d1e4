import Testing

@testable import BackstopTransport

/// `WakeRule`: when a queued command wakes the transport thread (docs/performance.md#threads-and-hops).
@Suite("Wake rule")
struct WakeRuleTests {
    /// The rule in a box: `#expect` cannot take a mutating call on a local value.
    final class Rule {
        var rule: WakeRule
        init(_ rule: WakeRule) { self.rule = rule }
        var pending: Int { rule.pending }
        var deferredSince: UInt64? { rule.deferredSince }
        var flushesScheduled: [ObjectIdentifier] { rule.flushesScheduled }
        func submitted(transportSleeping: Bool, loop: ObjectIdentifier?, now: UInt64) -> WakeRule.Action {
            rule.submitted(transportSleeping: transportSleeping, loop: loop, now: now)
        }
        func taken() { rule.taken() }
        func flushRuns(for loop: ObjectIdentifier) -> Bool { rule.flushRuns(for: loop) }
    }

    /// Stand-ins for event loops: only their identity matters.
    final class Loop {}
    let a = Loop()
    let b = Loop()
    var loopA: ObjectIdentifier { ObjectIdentifier(a) }
    var loopB: ObjectIdentifier { ObjectIdentifier(b) }

    @Test func anAwakeTransportIsNeverWoken() {
        let rule = Rule(WakeRule(wakeAtPending: 2, maxDeferralNanoseconds: 10))
        for i in 0..<5 {
            #expect(rule.submitted(transportSleeping: false, loop: loopA, now: UInt64(i) * 100) == .none)
            #expect(rule.submitted(transportSleeping: false, loop: nil, now: 0) == .none)
        }
        #expect(rule.pending == 10)
        #expect(rule.deferredSince == nil)
        #expect(rule.flushesScheduled.isEmpty)
    }

    @Test func aCommandFromAnotherThreadWakesAtOnce() {
        let rule = Rule(WakeRule())
        #expect(rule.submitted(transportSleeping: true, loop: nil, now: 0) == .wake)
        #expect(rule.submitted(transportSleeping: true, loop: nil, now: 0) == .wake)
        #expect(rule.flushesScheduled.isEmpty)
    }

    @Test func aLoopDefersToTheEndOfItsTurnOnce() {
        let rule = Rule(WakeRule(wakeAtPending: 8, maxDeferralNanoseconds: 1_000))
        #expect(rule.submitted(transportSleeping: true, loop: loopA, now: 100) == .scheduleFlush)
        #expect(rule.deferredSince == 100)
        #expect(rule.submitted(transportSleeping: true, loop: loopA, now: 200) == .none)
        #expect(rule.submitted(transportSleeping: true, loop: loopA, now: 300) == .none)
        // Another loop schedules its own flush; the oldest deferral stays the first.
        #expect(rule.submitted(transportSleeping: true, loop: loopB, now: 400) == .scheduleFlush)
        #expect(rule.deferredSince == 100)
        #expect(rule.flushesScheduled == [loopA, loopB])
        #expect(rule.flushRuns(for: loopA))
        #expect(rule.flushesScheduled == [loopB])
        // The flush has run: the next deferred command of loop A schedules another.
        #expect(rule.submitted(transportSleeping: true, loop: loopA, now: 500) == .scheduleFlush)
    }

    @Test func enoughPendingCommandsWakeAtOnce() {
        let rule = Rule(WakeRule(wakeAtPending: 3, maxDeferralNanoseconds: .max))
        #expect(rule.submitted(transportSleeping: true, loop: loopA, now: 0) == .scheduleFlush)
        #expect(rule.submitted(transportSleeping: true, loop: loopA, now: 0) == .none)
        #expect(rule.submitted(transportSleeping: true, loop: loopA, now: 0) == .wake)
        // Until the transport takes them, every further command asks again (the exchange wakes it only once).
        #expect(rule.submitted(transportSleeping: true, loop: loopA, now: 0) == .wake)
        // Commands queued while it was awake count too.
        rule.taken()
        #expect(rule.submitted(transportSleeping: false, loop: loopA, now: 0) == .none)
        #expect(rule.submitted(transportSleeping: false, loop: loopA, now: 0) == .none)
        #expect(rule.submitted(transportSleeping: true, loop: loopA, now: 0) == .wake)
    }

    @Test func aLongTurnWakesOnceTheOldestCommandWaitedLongEnough() {
        let rule = Rule(WakeRule(wakeAtPending: 100, maxDeferralNanoseconds: 1_000))
        #expect(rule.submitted(transportSleeping: true, loop: loopA, now: 5_000) == .scheduleFlush)
        #expect(rule.submitted(transportSleeping: true, loop: loopA, now: 5_999) == .none)
        #expect(rule.submitted(transportSleeping: true, loop: loopA, now: 6_000) == .wake)
        // The transport took them: the clock starts again at the next deferred command.
        rule.taken()
        #expect(rule.deferredSince == nil)
        #expect(rule.pending == 0)
        #expect(rule.submitted(transportSleeping: true, loop: loopA, now: 6_500) == .none)  // flush still scheduled
        #expect(rule.deferredSince == 6_500)
        #expect(rule.submitted(transportSleeping: true, loop: loopA, now: 7_499) == .none)
        #expect(rule.submitted(transportSleeping: true, loop: loopA, now: 7_500) == .wake)
    }

    @Test func aFlushWakesOnlyWhenCommandsWait() {
        let rule = Rule(WakeRule())
        #expect(rule.submitted(transportSleeping: true, loop: loopA, now: 0) == .scheduleFlush)
        rule.taken()  // the transport woke for something else and took the command
        #expect(!rule.flushRuns(for: loopA))
        #expect(rule.flushesScheduled.isEmpty)
        // A flush for a loop without one scheduled (cannot happen) changes nothing else.
        #expect(!rule.flushRuns(for: loopB))
    }

    @Test func oneMeansEveryCommandWakesASleepingTransport() {
        let rule = Rule(WakeRule(wakeAtPending: 1, maxDeferralNanoseconds: .max))
        #expect(rule.submitted(transportSleeping: true, loop: loopA, now: 0) == .wake)
        #expect(rule.flushesScheduled.isEmpty)
        #expect(WakeRule(wakeAtPending: 0).wakeAtPending == 1)
        #expect(WakeRule(wakeAtPending: -3).wakeAtPending == 1)
    }

    @Test func noDeferralTimeMeansTheSecondCommandWakes() {
        let rule = Rule(WakeRule(wakeAtPending: 100, maxDeferralNanoseconds: 0))
        #expect(rule.submitted(transportSleeping: true, loop: loopA, now: 10) == .scheduleFlush)
        #expect(rule.submitted(transportSleeping: true, loop: loopA, now: 10) == .wake)
    }

    @Test func aClockGoingBackwardsDoesNotTrap() {
        let rule = Rule(WakeRule(wakeAtPending: 100, maxDeferralNanoseconds: 1_000))
        #expect(rule.submitted(transportSleeping: true, loop: loopA, now: 5_000) == .scheduleFlush)
        // Wrapping subtraction: a smaller `now` reads as a very long wait, so it wakes rather than waits.
        #expect(rule.submitted(transportSleeping: true, loop: loopA, now: 4_000) == .wake)
    }
}
