import Dispatch
import Foundation
import NIOCore
import NIOPosix
import Synchronization
import Testing

@testable import BackstopTransport

/// `TransportCommands`: the queue to the transport thread and its wake-ups — deferred to the end of the submitting
/// loop's turn, and never lost (the proof is on the type; docs/performance.md#threads-and-hops).
@Suite("Transport commands")
struct TransportCommandsTests {
    final class Counts: Sendable {
        let received = Atomic<Int>(0)
        let timeouts = Atomic<Int>(0)
        let idle = Atomic<Int>(0)
    }

    /// Whether the eventfd would wake a sleeping transport thread now.
    private func readable(_ fd: Int32) -> Bool {
        var entry = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        return poll(&entry, 1, 0) == 1
    }

    private func withLoop<T>(_ body: (any EventLoop) throws -> T) throws -> T {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        defer { try? group.syncShutdownGracefully() }
        return try body(group.next())
    }

    @Test func aLoopsCommandsWakeTheSleepingThreadOnceAtTheEndOfTheTurn() throws {
        let commands = try #require(TransportCommands(rule: WakeRule(wakeAtPending: 8, maxDeferralNanoseconds: .max)))
        try withLoop { loop in
            #expect(!commands.announceSleep())
            let duringTurn = try loop.submit { () -> Bool in
                for _ in 0..<3 { commands.submit(.stop, from: loop) }
                return readable(commands.wakeFD)
            }.wait()
            #expect(!duringTurn)
            // Queued after the flush: when it has run, so has the flush.
            try loop.submit {}.wait()
            #expect(readable(commands.wakeFD))
            commands.drainWake()
            var batch: [TransportCommand] = []
            commands.takeAll(into: &batch)
            #expect(batch.count == 3)
        }
    }

    @Test func enoughCommandsWakeTheThreadWithinTheTurn() throws {
        let commands = try #require(TransportCommands(rule: WakeRule(wakeAtPending: 4, maxDeferralNanoseconds: .max)))
        try withLoop { loop in
            #expect(!commands.announceSleep())
            let afterThree = try loop.submit { () -> Bool in
                for _ in 0..<3 { commands.submit(.stop, from: loop) }
                return readable(commands.wakeFD)
            }.wait()
            #expect(!afterThree)
            let afterFour = try loop.submit { () -> Bool in
                commands.submit(.stop, from: loop)
                return readable(commands.wakeFD)
            }.wait()
            // The first turn's flush ran in between and woke the thread already: the eventfd is readable either way.
            #expect(afterFour)
        }
    }

    @Test func aCommandFromOffTheLoopWakesAtOnce() throws {
        let commands = try #require(TransportCommands(rule: WakeRule(wakeAtPending: 8, maxDeferralNanoseconds: .max)))
        try withLoop { loop in
            #expect(!commands.announceSleep())
            // `from: loop`, but not on its thread: nothing would run a flush at the end of this thread's turn.
            commands.submit(.stop, from: loop)
            #expect(readable(commands.wakeFD))
        }
    }

    @Test func anAwakeThreadIsNotWoken() throws {
        let commands = try #require(TransportCommands())
        commands.submit(.stop)
        #expect(!readable(commands.wakeFD))
        // It looks at the queue before it sleeps.
        #expect(commands.announceSleep())
        commands.announceAwake()
        try withLoop { loop in
            try loop.submit { commands.submit(.stop, from: loop) }.wait()
            try loop.submit {}.wait()
            #expect(!readable(commands.wakeFD))
        }
    }

    /// A stand-in transport thread takes commands, announces its sleep, and blocks on the eventfd, as
    /// `CurlMultiTransport.run` does; an event loop and a plain thread submit commands in bursts with short, varied
    /// gaps, so that many arrive just as it goes to sleep. A lost wake-up would leave it blocked with commands
    /// queued until its poll timed out: none may time out, and every command must arrive.
    @Test(.timeLimit(.minutes(1))) func noCommandIsLostAsTheThreadGoesToSleep() throws {
        let commands = try #require(TransportCommands(rule: WakeRule(wakeAtPending: 4, maxDeferralNanoseconds: 20_000)))
        let perSubmitter = 20_000
        let counts = Counts()
        let transportDone = DispatchSemaphore(value: 0)
        let transport = Thread {
            var batch: [TransportCommand] = []
            let deadline = DispatchTime.now().uptimeNanoseconds + 50_000_000_000
            while counts.received.load(ordering: .relaxed) < 2 * perSubmitter,
                DispatchTime.now().uptimeNanoseconds < deadline
            {
                commands.takeAll(into: &batch)
                if counts.received.add(batch.count, ordering: .relaxed).newValue == 2 * perSubmitter { break }
                let busy = commands.announceSleep()
                var entry = pollfd(fd: commands.wakeFD, events: Int16(POLLIN), revents: 0)
                let ready = poll(&entry, 1, busy ? 0 : 2_000)
                commands.announceAwake()
                if ready == 1 {
                    commands.drainWake()
                } else if !busy {
                    // Timed out: a lost wake-up if commands wait (else no submitter ran for 2 s).
                    commands.takeAll(into: &batch)
                    counts.received.add(batch.count, ordering: .relaxed)
                    if batch.isEmpty {
                        counts.idle.add(1, ordering: .relaxed)
                    } else {
                        counts.timeouts.add(1, ordering: .relaxed)
                    }
                    batch.removeAll()
                }
            }
            transportDone.signal()
        }
        transport.start()

        /// A busy wait of up to ~`limit` iterations: gaps shorter than a sleep can be.
        @Sendable func gap(_ limit: Int) {
            let spins = Int.random(in: 0...limit)
            var x = 0
            for i in 0..<spins { x &+= i }
            precondition(x >= 0 || spins > 0)
        }
        try withLoop { loop in
            let plainDone = DispatchSemaphore(value: 0)
            let plain = Thread {
                for _ in 0..<perSubmitter {
                    commands.submit(.stop)
                    gap(4_000)
                }
                plainDone.signal()
            }
            plain.start()
            var sent = 0
            while sent < perSubmitter {
                let burst = min(Int.random(in: 1...6), perSubmitter - sent)
                sent += burst
                // Waited for, so the loop's turns stay short and the bursts apart.
                try loop.submit {
                    for _ in 0..<burst {
                        commands.submit(.stop, from: loop)
                        gap(2_000)
                    }
                }.wait()
                gap(8_000)
            }
            plainDone.wait()
        }
        transportDone.wait()
        #expect(counts.timeouts.load(ordering: .relaxed) == 0)
        #expect(counts.received.load(ordering: .relaxed) == 2 * perSubmitter)
    }
}
