import BackstopTestSupport
import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Testing

@testable import BackstopServer

/// The systemd watchdog over several event loops (docs/reference/operations.md#systemd): a ping goes out only once
/// every loop has answered the check the previous ping started.
@Suite("Systemd watchdog")
struct WatchdogTests {
    /// Checks start only when every loop answered the last one; a late answer counts for its own check.
    @Test func aCheckStartsOnlyWhenEveryLoopAnswered() {
        let round = WatchdogRound(loops: 3)
        #expect(round.startIfAllAnswered())  // the first ping goes out at once
        #expect(!round.startIfAllAnswered())  // nobody answered it yet
        round.answer()
        round.answer()
        #expect(!round.startIfAllAnswered())  // one loop still silent: no ping, no new check
        round.answer()  // it answers late
        #expect(round.startIfAllAnswered())
        #expect(!round.startIfAllAnswered())
    }

    /// A wedged loop holds the pings back for as long as it is wedged; they resume once it runs again.
    @Test func aWedgedLoopStopsThePings() async throws {
        let directory = try TestFiles.makeTemporaryDirectory()
        defer { TestFiles.remove(directory) }
        let notify = try NotifySocket(directory: directory)
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 2)
        // false while the second loop is to stay wedged.
        let release = ConditionLock(value: false)
        do {
            try await watchWedged(group: group, release: release, notify: notify)
        } catch {
            release.lock()
            release.unlock(withValue: true)
            try? await group.shutdownGracefully()
            throw error
        }
        try await group.shutdownGracefully()
    }

    private func watchWedged(
        group: MultiThreadedEventLoopGroup, release: ConditionLock<Bool>, notify: NotifySocket
    ) async throws {
        let loops = Array(group.makeIterator())
        let wedged = loops[0].makePromise(of: Void.self)
        // The second loop blocks until released (bounded: 20 s at most, whatever happens to the test).
        loops[1].execute {
            wedged.succeed()
            if release.lock(whenValue: true, timeoutSeconds: 20) { release.unlock() }
        }
        try await wedged.futureResult.get()

        let notifier = SystemdNotifier(environment: ["NOTIFY_SOCKET": notify.path])
        let task = notifier.startWatchdog(on: loops, interval: .milliseconds(20))
        defer { task.cancel() }
        try await notify.waitFor { $0 == "WATCHDOG=1" }
        // Ten intervals on the first loop: its own timer, after every watchdog tick due before it.
        try await loops[0].scheduleTask(in: .milliseconds(200)) {}.futureResult.get()
        try await notify.waitFor { _ in true }  // reads what arrived meanwhile
        #expect(notify.messages.filter { $0 == "WATCHDOG=1" }.count == 1)

        release.lock()
        release.unlock(withValue: true)
        try await notify.waitFor(after: 1) { $0 == "WATCHDOG=1" }
    }
}
