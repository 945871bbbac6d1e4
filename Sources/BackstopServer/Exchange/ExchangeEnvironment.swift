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
    var metrics: ProxyMetrics { runtime.metrics }
    var logger: Logger { runtime.logger }
    func requestStarted() { runtime.requestStarted() }
    func requestFinished() { runtime.requestFinished() }
    func logAccess(_ record: AccessRecord) { runtime.logAccess(record, enabled: accessLog) }
}
