import BackstopCore
import BackstopStatus

extension ProxyServer {
    /// The facts `/status` and `/status.json` show, read now from the runtime
    /// (docs/reference/operations.md#status-page).
    public func statusSnapshot() -> StatusSnapshot {
        let clock = runtime.clock
        let wall = clock.wall()
        let monotonic = clock.monotonic()
        let second = monotonic.secondsAndAttoseconds.seconds
        let upstreams = runtime.snapshot.upstreams.map { upstream in
            upstreamStatus(upstream, now: monotonic, second: second, wall: wall)
        }
        var tracing: TracingStatus?
        if let tracer = runtime.tracer, let config = tracingConfig {
            let dropped = tracer.queue.dropped
            tracing = TracingStatus(
                endpoint: config.otlpEndpoint, sampleRatio: tracer.sampler.ratio, exported: tracer.queue.exported,
                dropped: dropped.queueFull + dropped.exportFailed, queued: tracer.queue.queued)
        }
        return StatusSnapshot(
            generatedAt: wall, version: BackstopVersion.current, uptimeSeconds: max(0, wall - ProcessMetrics.startTime),
            ready: isReady, draining: runtime.isDraining, inflightRequests: runtime.inflightRequests,
            clientConnections: runtime.openClientConnections, tunnelsOpen: runtime.tunnelMetrics.openTunnels,
            windowSeconds: ActivityWindow.defaultSeconds, upstreams: upstreams, tracing: tracing,
            failures: runtime.failures.recent)
    }

    private func upstreamStatus(
        _ upstream: UpstreamRuntime, now: Duration, second: Int64, wall: Double
    ) -> UpstreamStatus {
        let name = upstream.config.name
        let counters = runtime.metrics.upstream(name).snapshot
        let rates = counters.activity.rates(now: second)
        let budget = RetryBudgetStatus(
            retriesLeft: upstream.budget.withBudget { $0.retriesLeft(now: now) }, ratio: upstream.budget.config.ratio,
            minPerSecond: upstream.budget.config.minPerSecond, exhaustedTotal: counters.budgetExhausted)
        let health = upstream.health
        let details = health.endpointDetails
        let endpoints = details.indices.map { index in
            let row = details[index]
            return EndpointStatus(
                url: health.key(index), state: EndpointState(row.health),
                consecutiveFailures: health.policy.failures > 0 ? row.failuresInARow : nil,
                probeInSeconds: row.nextProbeIn.map { max(0, $0.seconds) })
        }
        return UpstreamStatus(
            name: name, requestsPerSecond: rates.perSecond, successRatio: rates.successRatio,
            attemptsPerRequest: rates.attemptsPerRequest, retryBudget: budget,
            circuit: CircuitState(details.map(\.health)), endpoints: endpoints,
            token: tokenStatus(upstream, wall: wall))
    }

    private func tokenStatus(_ upstream: UpstreamRuntime, wall: Double) -> TokenStatus? {
        switch upstream.auth {
        case .none:
            return nil
        case .staticToken(let source, _):
            return TokenStatus(kind: "static", present: source.value() != nil)
        case .awsSigV4(let source):
            return TokenStatus(kind: "aws_sigv4", present: source.credentials() != nil)
        case .oauth2(let manager, _):
            let last = tokenRefreshes.lastRefresh(upstream: upstream.config.name)
            return TokenStatus(
                kind: "oauth2", present: manager.holdsToken, expiresInSeconds: manager.currentExpiry.map { $0 - wall },
                lastRefresh: last.map { RefreshStatus(at: $0.at, outcome: $0.result.rawValue) })
        }
    }
}

extension EndpointState {
    init(_ health: EndpointHealth) {
        switch health {
        case .healthy: self = .healthy
        case .ejected: self = .ejected
        case .probing: self = .probing
        }
    }
}

extension CircuitState {
    /// `open` when no endpoint is healthy (requests fail fast), `half-open` while one is probed or ejected, else
    /// `closed` (docs/reference/operations.md#status-page).
    init(_ health: [EndpointHealth]) {
        if !health.contains(.healthy) {
            self = .open
        } else if health.allSatisfy({ $0 == .healthy }) {
            self = .closed
        } else {
            self = .halfOpen
        }
    }
}
