import BackstopCore
import BackstopTransport
import Logging
import NIOCore

/// The end of an exchange: metrics, the access line, and the log line of a failed attempt.
extension Exchange {
    func countBudgetExhaustion() {
        guard !budgetExhaustionCounted, machine.lastGiveUp == .budgetExhausted else { return }
        budgetExhaustionCounted = true
        metrics.recordBudgetExhausted()
    }

    /// The exchange is over: metrics, the access line, and the transfer let go (its event sink holds this
    /// exchange, so keeping it would keep both alive).
    func finish(note: String?) {
        transfer = nil
        transferGeneration = 0
        releaseKeptBody()
        countBudgetExhaustion()
        logNotRetried(note: note)
        if let failure = machine.lastFailure, note != nil, note != "client-closed" {
            logAttemptFailure(failure, final: true)
        }
        environment.requestFinished()
        let elapsed = now - machine.startedAt
        let status = machine.finalStatus
        traceFinished(note: note, status: status)
        metrics.recordRequest(status: status, seconds: elapsed.seconds)
        environment.recordStatus(
            metrics, upstream: destination.name, endpoint: destination.endpoint, status: status,
            attempts: machine.attempts, reason: note, detail: machine.lastFailure?.detail, at: now)
        environment.logAccess(
            AccessRecord(
                request: record, status: status, error: note ?? headError?.rawValue,
                reason: note == nil ? nil : machine.lastFailure?.detail,
                upstream: destination.name, attempts: machine.attempts,
                retries: machine.retryReasons.map(\.description),
                elapsed: elapsed, bytes: relay?.bytes ?? 0))
    }

    /// Which rule stopped the retries of a failed attempt (docs/reference/behaviour.md#when-it-is-retried), at
    /// `debug`: the attempt's outcome matched `retry.on` (or was a transport failure) and was not retried.
    func logNotRetried(note: String?) {
        guard environment.logger.logLevel <= .debug, note != "client-closed", let rule = machine.lastGiveUp,
            let condition = machine.lastGiveUpCondition
        else { return }
        environment.logger.debug(
            "not retried",
            metadata: [
                "upstream": .string(destination.name), "attempt": .stringConvertible(machine.attempts),
                "outcome": .string(condition.description), "rule": .string(rule.rawValue),
                "method": .string(record.method),
                "host": .string(record.host),
            ])
    }

    /// The cause of a failed attempt: `debug` when it is retried, `info` for the last one.
    func logAttemptFailure(_ failure: TransportFailure, final: Bool) {
        let level: Logger.Level = final ? .info : .debug
        guard environment.logger.logLevel <= level else { return }
        var metadata: Logger.Metadata = [
            "upstream": .string(destination.name), "attempt": .stringConvertible(machine.attempts),
            "outcome": .string(failure.label), "reason": .string(failure.detail), "method": .string(record.method),
            "host": .string(record.host),
        ]
        if final, let giveUp = machine.lastGiveUp { metadata["not_retried"] = .string(giveUp.rawValue) }
        environment.logger.log(level: level, final ? "attempt failed" : "attempt failed; retrying", metadata: metadata)
    }
}
