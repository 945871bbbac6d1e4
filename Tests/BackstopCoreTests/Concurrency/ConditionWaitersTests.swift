import BackstopCore
import Synchronization
import Testing

/// The waiting primitives behind the drain and the background work (Sources/BackstopCore/Concurrency): waiters are
/// resumed by events, never by polling, and cancellation always ends a wait.
/// A counter tasks share.
private final class Counter: Sendable {
    private let atomic: Atomic<Int>
    init(_ value: Int = 0) { atomic = Atomic(value) }
    var value: Int { atomic.load(ordering: .acquiring) }
    func add(_ delta: Int) { atomic.add(delta, ordering: .acquiringAndReleasing) }
}

@Suite("Condition waiters")
struct ConditionWaitersTests {
    @Test("a wait whose condition already holds returns at once")
    func alreadyTrue() async {
        let waiters = ConditionWaiters()
        #expect(await withTimeLimit(.seconds(10)) { await waiters.wait { true } })
    }

    @Test("waiters resume when the condition becomes true and resumeAll is called, not before")
    func resumedByEvent() async {
        let waiters = ConditionWaiters()
        let count = Counter(2)
        let resumed = Counter()
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<3 {
                group.addTask {
                    await waiters.wait { count.value == 0 }
                    resumed.add(1)
                }
            }
            // A resumeAll while the condition is false: the waiters check again and keep waiting.
            count.add(-1)
            waiters.resumeAll()
            #expect(!(await withTimeLimit(.milliseconds(50)) { await waiters.wait { false } }))
            let resumedEarly = resumed.value
            #expect(resumedEarly == 0)
            count.add(-1)
            waiters.resumeAll()
            await group.waitForAll()
        }
        let resumedAll = resumed.value
        #expect(resumedAll == 3)
    }

    @Test("cancelling a waiting task ends its wait")
    func cancellation() async {
        let waiters = ConditionWaiters()
        let ended = await withTimeLimit(.seconds(10)) {
            await withTaskGroup(of: Void.self) { group in
                group.addTask { await waiters.wait { false } }
                group.cancelAll()
            }
        }
        #expect(ended)
    }

    @Test("withTimeLimit says false when the time ran out, and cancels the operation")
    func timeLimit() async {
        let cancelled = Counter()
        let inTime = await withTimeLimit(.milliseconds(20)) {
            await ConditionWaiters().wait { false }
            if Task.isCancelled { cancelled.add(1) }
        }
        #expect(!inTime)
        let sawCancellation = cancelled.value
        #expect(sawCancellation == 1)
    }

    @Test("a OnceFlag wakes waiters that came before and after set")
    func onceFlag() async {
        let flag = OnceFlag()
        #expect(!flag.isSet)
        await withTaskGroup(of: Void.self) { group in
            group.addTask { await flag.wait() }
            flag.set()
            await group.waitForAll()
        }
        #expect(flag.isSet)
        #expect(await withTimeLimit(.seconds(10)) { await flag.wait() })
    }

    @Test("background work runs jobs spawned before and after run starts; finish cancels the rest and waits for run")
    func backgroundWork() async {
        let work = BackgroundWork()
        let started = Counter()
        let startedWaiters = ConditionWaiters()
        let job: BackgroundWork.Job = {
            started.add(1)
            startedWaiters.resumeAll()
            await ConditionWaiters().wait { false }
        }
        work.spawn(job)
        let ended = await withTimeLimit(.seconds(10)) {
            await withTaskGroup(of: Void.self) { group in
                group.addTask { await work.run() }
                work.spawn(job)
                await startedWaiters.wait { started.value == 2 }
                await work.finish()
            }
        }
        #expect(ended)
        let startedJobs = started.value
        #expect(startedJobs == 2)
    }

    @Test("finish returns at once when run never started, and a run started after it returns at once")
    func finishBeforeRun() async {
        let work = BackgroundWork()
        work.spawn { await ConditionWaiters().wait { false } }
        let ended = await withTimeLimit(.seconds(10)) {
            await work.finish()
            await work.run()
        }
        #expect(ended)
    }
}
