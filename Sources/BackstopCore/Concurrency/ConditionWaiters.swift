import NIOConcurrencyHelpers
import Synchronization

/// Tasks waiting for a condition that other code makes true (the last request of a drain finished, an exporter
/// stopped). A waiter is a suspended continuation, resumed by `resumeAll()`: nothing polls. Whoever changes the
/// condition's state calls `resumeAll()` after the change; waiters then check the condition again.
public final class ConditionWaiters: Sendable {
    private struct State {
        var nextID: UInt64 = 0
        var waiting: [UInt64: CheckedContinuation<Void, Never>] = [:]
    }

    private let state = NIOLockedValueBox(State())

    public init() {}

    /// Returns once `condition` holds (checked now and after every `resumeAll()`), or when the task is cancelled.
    public func wait(until condition: () -> Bool) async {
        while !Task.isCancelled {
            if await suspend(unless: condition) { return }
        }
    }

    /// Resumes every waiter; call it after making the condition true.
    public func resumeAll() {
        let resumed = state.withLockedValue { state in
            defer { state.waiting = [:] }
            return Array(state.waiting.values)
        }
        for continuation in resumed { continuation.resume() }
    }

    /// Suspends until `resumeAll()` or cancellation; true when `condition` held before suspending. The condition is
    /// read under the lock `resumeAll()` takes, so a change made before `resumeAll()` is never missed.
    private func suspend(unless condition: () -> Bool) async -> Bool {
        let id = state.withLockedValue { state in
            defer { state.nextID += 1 }
            return state.nextID
        }
        var held = false
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let resumeNow = state.withLockedValue { state in
                    if condition() {
                        held = true
                        return true
                    }
                    // Cancelled before registering: the cancellation handler found nothing to resume.
                    if Task.isCancelled { return true }
                    state.waiting[id] = continuation
                    return false
                }
                if resumeNow { continuation.resume() }
            }
        } onCancel: {
            state.withLockedValue { $0.waiting.removeValue(forKey: id) }?.resume()
        }
        return held
    }
}

/// A flag that is set once, and tasks that wait for it (a token manager told to stop, an exporter that finished).
public final class OnceFlag: Sendable {
    private let flag = Atomic<Bool>(false)
    private let waiters = ConditionWaiters()

    public init() {}

    /// Whether `set()` was called.
    public var isSet: Bool { flag.load(ordering: .acquiring) }

    /// Sets the flag and resumes every waiter.
    public func set() {
        flag.store(true, ordering: .releasing)
        waiters.resumeAll()
    }

    /// Returns once the flag is set, or when the task is cancelled.
    public func wait() async { await waiters.wait { isSet } }
}

/// Runs `operation` for at most `limit`: true when it returned in time; false when the time ran out, and then
/// `operation` is cancelled (and awaited) before this returns.
public func withTimeLimit(_ limit: Duration, _ operation: @escaping @Sendable () async -> Void) async -> Bool {
    await withTaskGroup(of: Bool.self) { group in
        group.addTask {
            await operation()
            return true
        }
        group.addTask {
            try? await Task.sleep(for: limit)
            return false
        }
        let first = await group.next() ?? false
        group.cancelAll()
        return first
    }
}

/// Work that runs in the background for as long as its owner does, as child tasks of `run()` (never unstructured
/// tasks): `spawn` hands a job to `run`, and `finish` cancels the jobs still running and waits for `run` to return.
/// Jobs spawned before `run` starts wait for it.
public final class BackgroundWork: Sendable {
    public typealias Job = @Sendable () async -> Void
    private let jobs: AsyncStream<Job>
    private let queue: AsyncStream<Job>.Continuation
    private let started = Atomic<Bool>(false)
    private let ended = OnceFlag()

    public init() {
        (jobs, queue) = AsyncStream.makeStream(of: Job.self)
    }

    /// Runs `job` as a child of `run()`; dropped after `finish()`.
    public func spawn(_ job: @escaping Job) { queue.yield(job) }

    /// Cancels what still runs and returns once `run()` has returned (at once when it never started: a `run()`
    /// started later returns at once).
    public func finish() async {
        queue.finish()
        if started.load(ordering: .acquiring) { await ended.wait() }
    }

    /// Runs every job spawned until `finish()` (call once; cancelling it cancels the jobs too).
    public func run() async {
        started.store(true, ordering: .releasing)
        await withDiscardingTaskGroup { group in
            for await job in jobs { group.addTask(operation: job) }
            group.cancelAll()
        }
        ended.set()
    }
}
