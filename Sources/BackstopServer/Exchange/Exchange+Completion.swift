import BackstopCore
import BackstopTransport
import Logging
import NIOCore

/// The end of an exchange as `.requestFinished` (or `.endResponse`) reports it: metrics, the access line, the status
/// page, the spans, and the log lines of a failed attempt (docs/reference/operations.md).
extension Exchange {
    /// The exchange is over: its transfers and kept body are let go, then everything that records it.
    func finish(_ finished: ConnectionStateMachine.Finished) {
        let ending = finished.ending
        let record = finished.record
        if case .completed = ending { letGo(cancel: false) } else { letGo(cancel: true) }
        stopWaitingForNetwork()
        if let slot = inflightSlot {
            inflightSlot = nil
            slot.release()
        }
        let note = ending.note
        if case .failedLocally(.circuitOpen, _) = ending {
            environment.runtime.outageMetrics.record(.circuitOpen, upstream: destination.name)
        }
        if ending != .clientClosed {
            logNotRetried(record)
            if let failure = record.lastFailure, note != nil {
                logAttemptFailure(failure, attempt: record.attempts, final: true, giveUp: record.giveUp)
            }
        }
        environment.requestFinished()
        if record.hedges != ExchangeStateMachine.HedgeTally() { recordHedges(record.hedges) }
        // Attempts sent and let go unanswered at the end count as their spans end (docs/reference/operations.md).
        let unanswered = record.unanswered
        if unanswered.settled { metrics.recordAttempt(outcome: Self.attemptFailure(ending, record) ?? "cancelled") }
        for _ in 0..<unanswered.copies { metrics.recordAttempt(outcome: "cancelled") }
        let now = self.now
        let elapsed = now - startedAt
        traceFinished(ending, record)
        metrics.recordExchange(
            status: record.status, seconds: elapsed.seconds, attempts: record.attempts,
            second: now.secondsAndAttoseconds.seconds)
        // A request that sent nothing (circuit-open, token-unavailable, …) names no endpoint: none was tried.
        environment.recordFailure(
            upstream: destination.name, endpoint: record.attempts == 0 ? "-" : attemptEndpoint, status: record.status,
            ending: ending, detail: record.lastFailure?.detail)
        environment.logAccess(
            AccessRecord(
                request: self.record, status: record.status, error: note ?? record.headError?.rawValue,
                reason: note == nil ? nil : record.lastFailure?.detail,
                upstream: destination.name, attempts: record.attempts,
                retries: record.retries.map(\.description),
                elapsed: elapsed, bytes: finished.bytes,
                endpoint: record.endpoint.flatMap { destination.upstream?.health.key($0) }))
    }

    /// `backstop_hedges_total`: how the request's hedged copies ended (docs/reference/operations.md#metrics).
    private func recordHedges(_ tally: ExchangeStateMachine.HedgeTally) {
        let metrics = environment.runtime.outageMetrics
        for (result, count) in [
            (OutageMetrics.HedgeResult.won, tally.won), (.lost, tally.lost), (.cancelled, tally.cancelled),
        ] {
            for _ in 0..<count { metrics.record(result, upstream: destination.name) }
        }
    }

    /// Which rule stopped the retries of a failed attempt (docs/reference/behaviour.md#when-it-is-retried), at
    /// `debug`: the attempt's outcome matched `retry.on` (or was a transport failure) and was not retried.
    private func logNotRetried(_ record: ExchangeStateMachine.Record) {
        // The rule first: reading the level asks the log handler, on every request, while most give up nothing.
        guard let rule = record.giveUp, let condition = record.giveUpCondition, environment.logger.logLevel <= .debug
        else { return }
        environment.logger.debug(
            "not retried",
            metadata: [
                "upstream": .string(destination.name), "attempt": .stringConvertible(record.attempts),
                "outcome": .string(condition.description), "rule": .string(rule.rawValue),
                "method": .string(self.record.method),
                "host": .string(self.record.host),
            ])
    }

    /// The cause of a failed attempt: `debug` when it is retried, `info` for the last one.
    func logAttemptFailure(_ failure: TransportFailure, attempt: Int, final: Bool, giveUp: GiveUpReason?) {
        let level: Logger.Level = final ? .info : .debug
        guard environment.logger.logLevel <= level else { return }
        var metadata: Logger.Metadata = [
            "upstream": .string(destination.name), "attempt": .stringConvertible(attempt),
            "outcome": .string(failure.label), "reason": .string(failure.detail), "method": .string(record.method),
            "host": .string(record.host),
        ]
        if final, let giveUp { metadata["not_retried"] = .string(giveUp.rawValue) }
        environment.logger.log(level: level, final ? "attempt failed" : "attempt failed; retrying", metadata: metadata)
    }
}
