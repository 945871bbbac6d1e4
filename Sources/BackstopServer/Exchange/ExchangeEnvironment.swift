import BackstopCore
import BackstopStatus
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
    var metrics: ProxyMetrics { runtime.metrics }
    var logger: Logger { runtime.logger }
    func requestStarted() { runtime.requestStarted() }
    func requestFinished() { runtime.requestFinished() }
    func logAccess(_ record: AccessRecord) { runtime.logAccess(record, enabled: accessLog) }

    /// The status page's record of an exchange's end (docs/reference/operations.md#status-page): the upstream's
    /// activity window, and the failure log when Backstop answered with an error or cut the response (not when the
    /// client went away), or relayed an upstream 5xx.
    func recordStatus(
        _ metrics: ProxyMetrics.Upstream, upstream: String, endpoint: String, status: Int, attempts: Int,
        ending: ExchangeStateMachine.Ending, detail: String?, at now: Duration
    ) {
        metrics.recordActivity(status: status, attempts: attempts, second: now.components.seconds)
        let cause: String
        switch ending {
        case .clientClosed:
            return
        case .aborted, .failedLocally:
            let reason = ending.note ?? ""
            cause = detail.map { "\(reason): \($0)" } ?? reason
        case .completed:
            guard status >= 500 else { return }
            cause = "upstream answered \(status)"
        }
        runtime.failures.record(
            FailureRecord(
                at: clock.wall(), upstream: upstream, endpoint: endpoint, status: status, cause: cause))
    }
}
