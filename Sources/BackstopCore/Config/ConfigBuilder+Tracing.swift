import Yams

extension ConfigBuilder {
    static let tracingKeys = ["otlp_endpoint", "service_name", "sample_ratio"]

    /// `tracing: {otlp_endpoint, service_name, sample_ratio}` (docs/reference/config.md#tracing).
    mutating func tracing(_ node: Node) -> TracingConfig? {
        guard let map = reader.mapping(node, "tracing", allowed: Self.tracingKeys) else { return nil }
        var endpoint: String?
        if let n = map["otlp_endpoint"] {
            if let text = reader.string(n, "tracing.otlp_endpoint") {
                switch HTTPURLParser.parse(text) {
                case .failure(let problem):
                    reader.fail(n, "tracing.otlp_endpoint '\(text)' \(problem)")
                case .success(let parts) where parts.query != nil:
                    reader.fail(
                        n,
                        "tracing.otlp_endpoint '\(text)' must not have a ?query (spans are POSTed to "
                            + "its /v1/traces path)")
                case .success:
                    endpoint = text
                }
            }
        } else {
            reader.fail(
                node,
                "'tracing' needs 'otlp_endpoint' (the collector's OTLP/HTTP address, e.g. "
                    + "'otlp_endpoint: http://127.0.0.1:4318')")
        }
        var config = TracingConfig(otlpEndpoint: endpoint ?? "")
        if let n = map["service_name"], let name = reader.string(n, "tracing.service_name") {
            if name.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F }) {
                reader.fail(n, "'tracing.service_name' must not contain control characters")
            } else if name.utf8.count > 255 {
                reader.fail(n, "'tracing.service_name' is longer than 255 bytes")
            } else {
                config.serviceName = name
            }
        }
        if let n = map["sample_ratio"], let ratio = reader.double(n, "tracing.sample_ratio", minimum: 0) {
            if ratio > 1 {
                reader.fail(n, "'tracing.sample_ratio' must be between 0 and 1 (a share of requests), not \(ratio)")
            } else {
                config.sampleRatio = ratio
            }
        }
        return endpoint == nil ? nil : config
    }
}
