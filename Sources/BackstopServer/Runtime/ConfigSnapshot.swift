import BackstopCore
import BackstopTransport

/// One immutable view of the configuration and everything derived from it. Requests keep the snapshot they
/// started with; a reload swaps in a new one.
public final class ConfigSnapshot: Sendable {
    public let config: Config
    public let router: Router
    public let upstreams: [UpstreamRuntime]

    public init(config: Config, upstreams: [UpstreamRuntime]) {
        self.config = config
        self.router = Router(upstreams: config.upstreams, unmatched: config.unmatched)
        self.upstreams = upstreams
    }
}

/// Per-upstream live state that outlives single requests (retry budget, later the token manager).
public final class UpstreamRuntime: Sendable {
    public let config: UpstreamConfig
    public let tls: TransportTLSOptions

    public init(config: UpstreamConfig) {
        self.config = config
        self.tls = TransportTLSOptions(caFile: config.tls.caFile, insecureSkipVerify: config.tls.insecureSkipVerify)
    }
}
