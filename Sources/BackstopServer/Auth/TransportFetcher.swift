import BackstopCore
import BackstopTransport
import NIOConcurrencyHelpers
import NIOCore

/// A whole response collected in memory (token endpoint calls: small bodies).
struct FetchedResponse: Sendable {
    var head: UpstreamResponseHead
    var body: [UInt8]
}

/// Performs one request through the shared curl transport and collects the whole response, for Backstop's own
/// calls (token endpoints, span exports). Bodies above `maxBody` fail the call rather than grow memory.
struct TransportFetcher: Sendable {
    let transport: any TransferStarting
    let eventLoop: EventLoop

    /// Token responses are small; anything larger than this is refused rather than buffered.
    static let maxBody = 1 << 20

    /// Cancelling the calling task ends the call at once with `cancelled` (the server's drain cancels an export the
    /// collector never answers before it stops the event loops).
    func fetch(
        _ request: TransportRequest, timeout: Duration, maxBody: Int = TransportFetcher.maxBody,
        timeoutDetail: String = "token endpoint timed out"
    ) async -> Result<FetchedResponse, TransportFailure> {
        let call = NIOLockedValueBox(FetchCall.notStarted)
        let eventLoop = self.eventLoop
        return await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                eventLoop.execute {
                    let collector = ResponseCollector(continuation: continuation, maxBody: maxBody)
                    let bound = NIOLoopBound(collector, eventLoop: eventLoop)
                    let cancelled = call.withLockedValue { call in
                        if case .cancelled = call { return true }
                        call = .running(bound)
                        return false
                    }
                    guard !cancelled else {
                        collector.finish(.failure(.cancelled))
                        return
                    }
                    let transfer = transport.start(request, on: eventLoop) { events in bound.value.handle(events) }
                    collector.transfer = transfer
                    eventLoop.assumeIsolated().scheduleTask(in: .nanoseconds(timeout.nanosecondsClamped)) {
                        collector.finish(.failure(.timeout(detail: timeoutDetail)))
                    }
                }
            }
        } onCancel: {
            let running = call.withLockedValue { call -> NIOLoopBound<ResponseCollector>? in
                if case .running(let bound) = call { return bound }
                call = .cancelled
                return nil
            }
            if let running { eventLoop.execute { running.value.finish(.failure(.cancelled)) } }
        }
    }
}

/// Where a `fetch` is, for its cancellation handler.
private enum FetchCall {
    case notStarted
    case running(NIOLoopBound<ResponseCollector>)
    case cancelled
}

/// Event-loop-confined accumulator for one fetched response; resumes its continuation exactly once.
private final class ResponseCollector {
    private var continuation: CheckedContinuation<Result<FetchedResponse, TransportFailure>, Never>?
    private let maxBody: Int
    private var head: UpstreamResponseHead?
    private var body: [UInt8] = []
    var transfer: (any TransferHandle)?

    init(continuation: CheckedContinuation<Result<FetchedResponse, TransportFailure>, Never>, maxBody: Int) {
        self.continuation = continuation
        self.maxBody = maxBody
    }

    func handle(_ events: [TransportEvent]) {
        for event in events {
            switch event {
            case .head(let h): head = h
            case .body(let buffer):
                transfer?.consumed(buffer.readableBytes)
                if body.count + buffer.readableBytes > maxBody {
                    finish(.failure(.reset(detail: "response larger than \(maxBody) bytes")))
                    return
                }
                body.append(contentsOf: buffer.readableBytesView)
            case .end:
                if let head {
                    finish(.success(FetchedResponse(head: head, body: body)))
                } else {
                    finish(.failure(.reset(detail: "no response head")))
                }
            case .failure(let failure):
                finish(.failure(failure))
            }
        }
    }

    func finish(_ result: Result<FetchedResponse, TransportFailure>) {
        guard let continuation else { return }
        self.continuation = nil
        if case .failure = result { transfer?.cancel() }
        transfer = nil
        continuation.resume(returning: result)
    }
}
