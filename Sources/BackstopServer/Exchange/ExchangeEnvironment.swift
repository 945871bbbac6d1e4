import BackstopCore
import BackstopTransport
import Logging

/// What the exchanges of a connection share: the process-wide runtime and the config snapshot's access-log switch.
struct ExchangeEnvironment {
    let runtime: ProxyRuntime
    let accessLog: Bool
    /// `limits.buffer_memory` of the snapshot the exchange started with.
    var bufferMemory = Limits().bufferMemory

    var transport: any TransferStarting { runtime.transport }
    var clock: any BackstopClock { runtime.clock }
    var logger: Logger { runtime.logger }
    func requestStarted() { runtime.requestStarted() }
    func requestFinished() { runtime.requestFinished() }
    func logAccess(_ record: @autoclosure () -> AccessRecord) { runtime.logAccess(record(), enabled: accessLog) }

    /// The status page's failure log (docs/reference/operations.md#status-page): when Backstop answered with an
    /// error or cut the response (not when the client went away), or relayed an upstream 5xx. The upstream's
    /// activity window is counted with the request's metrics (`ProxyMetrics.Upstream.recordExchange`). Names are
    /// read only for a failure: a request that succeeded copies none.
    func recordFailure(
        upstream: @autoclosure () -> String, endpoint: @autoclosure () -> String, status: Int,
        ending: ExchangeStateMachine.Ending, detail: @autoclosure () -> String?
    ) {
        let cause: String
        switch ending {
        case .clientClosed:
            return
        case .aborted, .failedLocally:
            let reason = ending.note ?? ""
            cause = detail().map { "\(reason): \($0)" } ?? reason
        case .completed:
            guard status >= 500 else { return }
            cause = "upstream answered \(status)"
        }
        runtime.recordFailure(upstream: upstream(), endpoint: endpoint(), status: status, cause: cause)
    }
}
