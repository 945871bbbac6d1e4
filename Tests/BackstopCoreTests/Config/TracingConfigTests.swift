import BackstopCore
import Testing

private let H = ConfigFixture.head

/// The `tracing` section (docs/reference/config.md#tracing): defaults, the export URL, and every `check` error
/// at the line and column of the offending value.
@Suite("Config: tracing")
struct TracingConfigTests {
    @Test("absent: no tracing; present: defaults for service_name and sample_ratio, /v1/traces appended")
    func defaults() throws {
        #expect(try ConfigFixture.parse(H).tracing == nil)
        let config = try ConfigFixture.parse(H + "tracing: {otlp_endpoint: \"http://127.0.0.1:4318\"}\n")
        #expect(
            config.tracing
                == TracingConfig(
                    otlpEndpoint: "http://127.0.0.1:4318", exportURL: "http://127.0.0.1:4318/v1/traces",
                    serviceName: "backstop", sampleRatio: 1))
    }

    @Test("values are read; an endpoint naming /v1/traces is used as written, a base path gets it appended")
    func values() throws {
        let config = try ConfigFixture.parse(
            H + "tracing:\n  otlp_endpoint: https://otel.example:4318/v1/traces\n  service_name: edge-proxy\n"
                + "  sample_ratio: 0.25\n")
        #expect(
            config.tracing
                == TracingConfig(
                    otlpEndpoint: "https://otel.example:4318/v1/traces",
                    exportURL: "https://otel.example:4318/v1/traces",
                    serviceName: "edge-proxy", sampleRatio: 0.25))
        #expect(TracingConfig.exportURL(for: "http://c:4318/otlp/") == "http://c:4318/otlp/v1/traces")
    }

    @Test("check errors name the key and point at its value")
    func errors() {
        let cases: [(yaml: String, needle: String, message: String)] = [
            (
                "tracing: {service_name: x}\n", "{service_name",
                "'tracing' needs 'otlp_endpoint' (the collector's OTLP/HTTP address, e.g. 'otlp_endpoint: http://127.0.0.1:4318')"
            ),
            (
                "tracing: {otlp_endpoint: \"grpc://c:4317\"}\n", "\"grpc",
                "tracing.otlp_endpoint 'grpc://c:4317' must start with http:// or https://"
            ),
            (
                "tracing: {otlp_endpoint: \"http://u:p@c:4318\"}\n", "\"http",
                "tracing.otlp_endpoint 'http://u:p@c:4318' must not contain user:password@ (credentials belong in the keychain)"
            ),
            (
                "tracing: {otlp_endpoint: \"http://c:4318/?a=b\"}\n", "\"http",
                "tracing.otlp_endpoint 'http://c:4318/?a=b' must not have a ?query (spans are POSTed to its /v1/traces path)"
            ),
            (
                "tracing: {otlp_endpoint: \"http://c\", sample_ratio: 1.5}\n", "1.5",
                "'tracing.sample_ratio' must be between 0 and 1 (a share of requests), not 1.5"
            ),
            (
                "tracing: {otlp_endpoint: \"http://c\", sample_ratio: -0.1}\n", "-0.1",
                "'tracing.sample_ratio' must be at least 0.0, not -0.1"
            ),
            (
                "tracing: {otlp_endpoint: \"http://c\", sample_ratio: half}\n", "half",
                "'tracing.sample_ratio' must be a number, not 'half'"
            ),
            (
                "tracing: {otlp_endpoint: \"http://c\", service_name: \"a\\tb\"}\n", "\"a\\t",
                "'tracing.service_name' must not contain control characters"
            ),
            (
                "tracing: {otlp_endpoint: \"http://c\", service_name: \"\"}\n", "\"\"",
                "'tracing.service_name' must not be empty"
            ),
        ]
        for (yaml, needle, message) in cases {
            let text = H + yaml
            let position = ConfigFixture.position(of: needle, in: text)
            #expect(ConfigFixture.errors(text).map(\.message) == [message], "\(yaml)")
            let location = ConfigFixture.errors(text).first?.location
            #expect(location?.line == position?.line && location?.column == position?.column, "\(yaml)")
            #expect(position != nil, "\(needle)")
        }
    }

    @Test("an unknown key under tracing is an error")
    func unknownKey() {
        let errors = ConfigFixture.errors(H + "tracing: {otlp_endpoint: \"http://c\", sample_rate: 0.5}\n")
        #expect(errors.count == 1)
        #expect(errors.first?.message.contains("sample_rate") == true)
    }
}
