import BackstopCore
import Testing

private let H = ConfigFixture.head
private let K = "keychain: {path: k.bkc, key_file: k.key}\n"
private let S = "spool: {dir: spool}\n"

/// One upstream `a` with `extra` inline keys (`, delivery: queue`).
private func upstream(_ extra: String) -> String {
    "upstreams:\n  - {name: a, match: {hosts: [a.test]}, url: http://a.test\(extra)}\n"
}

/// The `spool` section and an upstream's `delivery` and `queue` (docs/reference/config.md#spool).
@Suite("Config: spool and queued delivery")
struct DeliveryConfigTests {
    @Test("absent: no spool, every upstream direct with the queue defaults")
    func defaults() throws {
        let config = try ConfigFixture.parse(H + upstream(""))
        #expect(config.spool == nil)
        #expect(config.upstreams.first?.delivery == .direct)
        #expect(config.upstreams.first?.queue == QueueConfig(maxAge: .seconds(86_400), concurrency: 4))
    }

    @Test("spool.dir is resolved against the config's directory; max_bytes defaults to 1GiB")
    func spoolValues() throws {
        let relative = try #require(try ConfigFixture.parse(H + S).spool)
        #expect(relative.directory == "/etc/backstop/spool")
        #expect(relative.maxBytes == 10 << 30)
        let at = try #require(ConfigFixture.position(of: "spool}", in: H + S))
        #expect(relative.location == SourceLocation(file: ConfigFixture.file, line: at.line, column: at.column))
        let absolute = try #require(
            try ConfigFixture.parse(H + "spool: {dir: /var/lib/b/spool, max_bytes: 10GiB}\n").spool)
        #expect(absolute.directory == "/var/lib/b/spool")
        #expect(absolute.maxBytes == 10 << 30)
        #expect(try ConfigFixture.parse(H + "spool:\n").spool == nil)
    }

    @Test("delivery: queue with its queue section")
    func queueValues() throws {
        let config = try ConfigFixture.parse(
            H + K + S + upstream(", delivery: queue, queue: {max_age: 2h, concurrency: 16}"))
        let a = try #require(config.upstreams.first)
        #expect(a.delivery == .queue)
        #expect(a.queue == QueueConfig(maxAge: .seconds(7200), concurrency: 16))
        let plain = try ConfigFixture.parse(H + K + S + upstream(", delivery: queue"))
        #expect(plain.upstreams.first?.queue == QueueConfig())
        #expect(try ConfigFixture.parse(H + upstream(", delivery: direct")).upstreams.first?.delivery == .direct)
    }

    @Test(
        "bad spool, delivery and queue values are reported where they are written",
        arguments: [
            ErrorCase(H + "spool: {max_bytes: 1GiB}\n", at: "{max_bytes", "needs 'dir'"),
            ErrorCase(H + "spool: {dir: s, max_bytes: 100KiB}\n", at: "100KiB", "at least 1MiB"),
            ErrorCase(H + "spool: {dir: s, max_bytes: lots}\n", at: "lots", "not a size"),
            ErrorCase(H + "spool: {dir: s, max_bytes: 4MiB}\n", at: "4MiB", "max_request_body"),
            // Equal to max_request_body is not enough: the head and the row take room too.
            ErrorCase(
                H + "limits: {max_request_body: 2MiB}\nspool: {dir: s, max_bytes: 2049KiB}\n", at: "2049KiB",
                "limits.max_request_body + limits.max_header_bytes + 1KiB (2163712 bytes)"),
            ErrorCase(H + "limits: {max_request_body: 11GiB}\nspool: {dir: s}\n", at: "{dir", "max_request_body"),
            ErrorCase(H + "spool: {dir: \"\"}\n", at: "\"\"", "must not be empty"),
            ErrorCase(H + "spool: {dir: s, maxbytes: 1GiB}\n", at: "maxbytes", "did you mean 'max_bytes'"),
            ErrorCase(H + K + S + upstream(", delivery: later"), at: "later", "direct | queue"),
            ErrorCase(H + K + upstream(", delivery: queue"), at: "queue}", "'spool' section"),
            ErrorCase(H + S + upstream(", delivery: queue"), at: "queue}", "'keychain' section"),
            ErrorCase(H + K + S + upstream(", queue: {max_age: 1h}"), at: "queue:", "delivery: queue only"),
            ErrorCase(H + K + S + upstream(", delivery: queue, queue: {max_age: 0s}"), at: "0s", "above 0"),
            ErrorCase(
                H + K + S + upstream(", delivery: queue, queue: {concurrency: 0}"), at: "0}", "between 1 and 1024"),
            ErrorCase(
                H + K + S + upstream(", delivery: queue, queue: {max_age: 1h, retries: 3}"), at: "retries",
                "unknown key"),
        ])
    func badValues(c: ErrorCase) { expectSingleError(c) }

    @Test("a misspelt delivery value is one error, not also one for its queue section")
    func oneErrorForMisspeltDelivery() {
        let errors = ConfigFixture.errors(H + K + S + upstream(", delivery: queued, queue: {max_age: 1h}"))
        #expect(errors.count == 1)
        #expect(errors.first?.message.contains("direct | queue") == true)
    }

    @Test("queue without spool and keychain: both reported at the delivery value")
    func bothMissing() {
        let yaml = H + upstream(", delivery: queue")
        let errors = ConfigFixture.errors(yaml)
        let at = ConfigFixture.position(of: "queue}", in: yaml)
        #expect(errors.count == 2)
        #expect(errors.allSatisfy { $0.location.line == at?.line && $0.location.column == at?.column })
    }
}
