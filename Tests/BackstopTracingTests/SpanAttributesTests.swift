import Testing

@testable import BackstopTracing

/// What a client controls reaches a span at a bounded size: path, URL and user agent cut at `valueLimit` bytes,
/// between scalars.
@Suite("Span attributes")
struct SpanAttributesTests {
    static func value(_ name: String, _ attributes: [SpanAttribute]) -> String? {
        for attribute in attributes where attribute.key == name {
            if case .string(let text) = attribute.value { return text }
        }
        return nil
    }

    @Test("a 60 KB path and user agent are kept to 1,024 bytes; short ones whole; a multi-byte scalar is never split")
    func limits() {
        let long = "/" + String(repeating: "a", count: 60_000)
        let (attributes, _) = SpanAttributes.server(
            RequestFacts(
                method: "GET", path: long + "?q=1", userAgent: String(repeating: "é", count: 2000), status: 200))
        #expect(Self.value("url.path", attributes) == String(long.prefix(1024)))
        let agent = Self.value("user_agent.original", attributes) ?? ""
        #expect(agent.utf8.count == 1024)
        #expect(agent == String(repeating: "é", count: 512))
        let odd = "/" + String(repeating: "é", count: 600)
        #expect(SpanAttributes.limited(odd).utf8.count == 1023)
        #expect(SpanAttributes.limited("/short") == "/short")
        let (client, _) = SpanAttributes.client(
            AttemptFacts(
                method: "GET", url: "http://h" + long, upstream: "u", endpoint: "e", attempt: 1, outcome: "2xx"))
        #expect(Self.value("url.full", client)?.utf8.count == 1024)
    }
}
