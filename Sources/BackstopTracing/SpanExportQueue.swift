import BackstopCore
import Logging
import NIOConcurrencyHelpers

/// Sends one encoded OTLP request to the collector. The daemon's implementation POSTs through the shared
/// transport; tests may use any.
public protocol SpanBatchSending: Sendable {
    /// POSTs `body` (an `ExportTraceServiceRequest`); nil when the collector accepted it, else why not.
    func send(_ body: [UInt8]) async -> String?
}

/// The bounded queue between the request path and the collector. `submit` never waits: it appends under a lock,
/// or drops and counts when the queue is full. `run` (the server's background work) takes the queue in batches every
/// `interval`, or as soon as a batch is full, encodes them and sends them one at a time. A batch the collector
/// did not accept is dropped and counted: a collector that is slow or down costs requests nothing.
public final class SpanExportQueue: Sendable {
    public let capacity: Int
    public let batchSize: Int
    public let interval: Duration
    let encoder: OTLPEncoder
    let sender: any SpanBatchSending
    let logger: Logger

    struct State {
        var pending: [SpanRecord] = []
        var droppedQueueFull = 0
        var droppedExportFailed = 0
        var exported = 0
        var failing = false
        var stopped = false
    }

    private let state = NIOLockedValueBox(State())
    private let finished = OnceFlag()
    private let wake: AsyncStream<Void>.Continuation
    private let wakes: AsyncStream<Void>

    public init(
        encoder: OTLPEncoder, sender: any SpanBatchSending, logger: Logger, capacity: Int = 2048, batchSize: Int = 512,
        interval: Duration = .seconds(1)
    ) {
        self.encoder = encoder
        self.sender = sender
        self.logger = logger
        self.capacity = max(1, capacity)
        self.batchSize = max(1, min(batchSize, capacity))
        self.interval = interval
        (wakes, wake) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
    }

    /// Queues a finished span; drops it (counted) when the queue is full or the exporter has stopped.
    public func submit(_ span: SpanRecord) {
        let full = state.withLockedValue { s in
            guard !s.stopped, s.pending.count < capacity else {
                s.droppedQueueFull += 1
                return false
            }
            s.pending.append(span)
            return s.pending.count == batchSize
        }
        if full { wake.yield() }
    }

    /// Spans dropped because the queue was full, and because the collector did not take their batch.
    public var dropped: (queueFull: Int, exportFailed: Int) {
        state.withLockedValue { (queueFull: $0.droppedQueueFull, exportFailed: $0.droppedExportFailed) }
    }

    /// Spans the collector accepted.
    public var exported: Int { state.withLockedValue { $0.exported } }

    /// Spans waiting to be sent.
    public var queued: Int { state.withLockedValue { $0.pending.count } }

    /// The spans waiting to be sent, oldest first (tests read what a trace recorded).
    var pendingSpans: [SpanRecord] { state.withLockedValue { $0.pending } }

    /// The export loop, until `shutdown` (then it sends what is left once and returns).
    public func run() async {
        await withTaskGroup(of: Void.self) { group in
            group.addTask { [wake, interval] in
                while !Task.isCancelled {
                    try? await Task.sleep(for: interval)
                    wake.yield()
                }
            }
            for await _ in wakes {
                await exportPending()
                if state.withLockedValue({ $0.stopped }) { break }
            }
            group.cancelAll()
        }
        await exportPending()
        finished.set()
    }

    /// True once `run` returned after `shutdown`.
    public var isFinished: Bool { finished.isSet }

    /// Returns once `run` returned after `shutdown` (or when the task is cancelled).
    public func waitUntilFinished() async { await finished.wait() }

    /// Stops accepting spans and lets `run` send what is queued and return.
    public func shutdown() {
        state.withLockedValue { $0.stopped = true }
        wake.yield()
        wake.finish()
    }

    /// Sends everything queued now, a batch at a time.
    func exportPending() async {
        let taken = state.withLockedValue { s in
            let all = s.pending
            s.pending.removeAll(keepingCapacity: true)
            return all
        }
        var start = 0
        while start < taken.count {
            let end = min(start + batchSize, taken.count)
            let batch = taken[start..<end]
            let failure = await sender.send(encoder.encode(batch))
            record(count: batch.count, failure: failure)
            start = end
        }
    }

    /// Counts a batch's fate and logs only the changes between "exporting" and "failing" (a dead collector would
    /// otherwise log a line per batch).
    private func record(count: Int, failure: String?) {
        let changed = state.withLockedValue { s in
            if failure == nil { s.exported += count } else { s.droppedExportFailed += count }
            let was = s.failing
            s.failing = failure != nil
            return was != s.failing
        }
        guard changed else { return }
        if let failure {
            logger.warning(
                "span export failing; spans are dropped until the collector accepts them",
                metadata: ["reason": .string(failure), "spans": .stringConvertible(count)])
        } else {
            logger.notice("span export recovered")
        }
    }
}
