import BackstopCore
import Testing

@testable import BackstopQueue

/// The rules of queued delivery as a pure function: every result class, the wait, the deadline.
@Suite("Delivery policy")
struct DeliveryPolicyTests {
    let policy = DeliveryPolicy(maxAge: .seconds(3600))
    let accepted = 1_700_000_000.0

    func decide(
        _ result: DeliveryResult, attempts: Int = 1, after seconds: Double = 10, draw: UInt64 = ScriptedRandom.half,
        policy: DeliveryPolicy? = nil
    ) -> DeliveryDecision {
        var random = ScriptedRandom(draw)
        return (policy ?? self.policy).decide(
            result, attempts: attempts, acceptedAt: accepted, now: accepted + seconds,
            random: &random)
    }

    func response(_ status: Int, retryAfter: String? = nil, reset: String? = nil) -> DeliveryResult {
        .response(status: status, retryAfter: retryAfter, rateLimitReset: reset)
    }

    @Test("2xx is delivered", arguments: [200, 201, 202, 204, 299])
    func delivered(status: Int) {
        #expect(decide(response(status)) == .delivered)
    }

    @Test(
        "a 4xx other than 408 and 429, a 1xx or a 3xx is a dead letter at once",
        arguments: [
            100, 301, 302, 304, 400, 401, 403, 404, 409, 413, 422, 499,
        ])
    func deadAtOnce(status: Int) {
        #expect(decide(response(status)) == .dead(lastOutcome: "status \(status)"))
    }

    /// `now + wait` as the policy computes it (the wait goes through `Duration`, whole nanoseconds).
    func at(_ wait: Duration, after seconds: Double = 10) -> Double { accepted + seconds + wait.seconds }

    // Equal jitter with a draw of one half: 3/4 of the capped exponential delay (1 s, 2 s, 4 s, … 300 s).
    @Test(
        "408, 429 and 5xx are tried again after the redelivery backoff",
        arguments: [
            (408, 1, Duration.milliseconds(750)), (429, 2, .milliseconds(1500)), (500, 3, .seconds(3)),
            (502, 4, .seconds(6)),
            (503, 9, .seconds(192)), (504, 10, .seconds(225)), (599, 40, .seconds(225)),
        ])
    func retriedWithBackoff(status: Int, attempts: Int, wait: Duration) {
        #expect(decide(response(status), attempts: attempts) == .retry(at: at(wait), lastOutcome: "status \(status)"))
    }

    @Test("equal jitter keeps at least half of the delay and at most all of it")
    func jitterBounds() {
        #expect(
            decide(response(503), attempts: 2, draw: ScriptedRandom.zero)
                == .retry(at: at(.seconds(1)), lastOutcome: "status 503"))
        guard case .retry(let latest, _) = decide(response(503), attempts: 2, draw: ScriptedRandom.max) else {
            Issue.record("a retry expected")
            return
        }
        #expect(latest > accepted + 11.999 && latest <= accepted + 12)
    }

    @Test("no response at all is tried again, its label kept as the last outcome")
    func noResponse() {
        #expect(
            decide(.noResponse("connect-failure"), attempts: 1)
                == .retry(at: at(.milliseconds(750)), lastOutcome: "connect-failure"))
        #expect(
            decide(.noResponse("budget-exhausted"), attempts: 3)
                == .retry(at: at(.seconds(3)), lastOutcome: "budget-exhausted"))
    }

    @Test("a try Backstop refused for now (circuit-open) comes back when it said, whatever retry_after.honor says")
    func notSentNow() {
        #expect(
            decide(.notSentNow("circuit-open", retryAfter: 30), attempts: 4)
                == .retry(at: accepted + 40, lastOutcome: "circuit-open"))
        let ignoring = DeliveryPolicy(maxAge: .seconds(3600), honorRetryAfter: false)
        #expect(
            decide(.notSentNow("circuit-open", retryAfter: 30), policy: ignoring)
                == .retry(at: accepted + 40, lastOutcome: "circuit-open"))
    }

    @Test("Retry-After and X-RateLimit-Reset set the wait when honoured, the backoff otherwise")
    func hints() {
        #expect(decide(response(503, retryAfter: "120")) == .retry(at: accepted + 130, lastOutcome: "status 503"))
        #expect(
            decide(response(429, reset: "\(Int(accepted) + 70)"))
                == .retry(at: accepted + 70, lastOutcome: "status 429"))
        #expect(
            decide(response(503, retryAfter: "soon")) == .retry(at: at(.milliseconds(750)), lastOutcome: "status 503"))
        let ignoring = DeliveryPolicy(maxAge: .seconds(3600), honorRetryAfter: false)
        #expect(
            decide(response(503, retryAfter: "120"), policy: ignoring)
                == .retry(at: at(.milliseconds(750)), lastOutcome: "status 503"))
    }

    @Test("a wait past max_age is cut to end a second before the deadline; a try failing after that was the last")
    func deadline() {
        #expect(decide(response(503, retryAfter: "7200")) == .retry(at: accepted + 3599, lastOutcome: "status 503"))
        #expect(
            decide(response(503), attempts: 9, after: 3590) == .retry(at: accepted + 3599, lastOutcome: "status 503"))
        #expect(decide(response(503), attempts: 1, after: 3599) == .dead(lastOutcome: "expired (last: status 503)"))
        #expect(decide(response(503), attempts: 1, after: 3599.5) == .dead(lastOutcome: "expired (last: status 503)"))
        #expect(decide(response(503), after: 3600) == .dead(lastOutcome: "expired (last: status 503)"))
        #expect(decide(.noResponse("timeout"), after: 9000) == .dead(lastOutcome: "expired (last: timeout)"))
        #expect(decide(response(200), after: 9000) == .delivered, "an answer that came is an answer")
        #expect(policy.isExpired(acceptedAt: accepted, now: accepted + 3599.999) == false)
        #expect(policy.isExpired(acceptedAt: accepted, now: accepted + 3600))
        #expect(DeliveryPolicy.expired(after: nil) == "expired")
    }

    @Test("undeliverable is a dead letter whatever the time")
    func undeliverable() {
        #expect(decide(.undeliverable("upstream-removed")) == .dead(lastOutcome: "upstream-removed"))
    }

    @Test("an upstream's config: its max_age and retry_after.honor")
    func fromUpstream() {
        var upstream = UpstreamConfig(
            name: "a", match: MatchConfig(hosts: ["a"]), url: UpstreamURL(scheme: "http", host: "a"))
        upstream.queue.maxAge = .seconds(60)
        upstream.retry.retryAfter.honor = false
        #expect(DeliveryPolicy(upstream: upstream) == DeliveryPolicy(maxAge: .seconds(60), honorRetryAfter: false))
    }
}

@Suite("Delivery ids and queued requests")
struct DeliveryIDTests {
    @Test("ids are version 4 UUIDs, parse back, and differ")
    func ids() throws {
        var random = SplitMix64(seed: 7)
        let a = DeliveryID(random: &random)
        let b = DeliveryID(random: &random)
        #expect(a != b)
        #expect(a.text.count == 36)
        let utf8 = Array(a.text.utf8)
        #expect(utf8[14] == UInt8(ascii: "4"))
        #expect([UInt8(ascii: "8"), UInt8(ascii: "9"), UInt8(ascii: "a"), UInt8(ascii: "b")].contains(utf8[19]))
        #expect(DeliveryID(a.text) == a)
        #expect(DeliveryID(a.text.uppercased()) == a)
        for bad in [
            "", "nope", String(a.text.dropLast()), a.text + "0", a.text.replacingOccurrences(of: "-", with: "x"),
            "g" + a.text.dropFirst(),
        ] {
            #expect(DeliveryID(bad) == nil, "\(bad)")
        }
    }

    @Test("time-ordered ids are version 7 UUIDs: the milliseconds first, in order as text, random after")
    func timeOrderedIDs() throws {
        var random = SplitMix64(seed: 7)
        let millis: Int64 = 1_764_230_400_123  // 2025-11-27T08:00:00.123Z
        let a = DeliveryID(unixMillis: millis, random: &random)
        let b = DeliveryID(unixMillis: millis, random: &random)
        let later = DeliveryID(unixMillis: millis + 1, random: &random)
        #expect(a != b)
        #expect(a.text.hasPrefix("019ac453-887b-7"))
        #expect(String(a.text.prefix(13)) == String(b.text.prefix(13)))
        #expect(String(format: "%012llx", millis) == a.text.prefix(13).replacingOccurrences(of: "-", with: ""))
        #expect(a < later && b < later)
        let utf8 = Array(a.text.utf8)
        #expect(utf8[14] == UInt8(ascii: "7"))
        #expect([UInt8(ascii: "8"), UInt8(ascii: "9"), UInt8(ascii: "a"), UInt8(ascii: "b")].contains(utf8[19]))
        #expect(DeliveryID(a.text) == a)
        // Out of the 48 bits the format holds: clamped, never wrapped.
        #expect(DeliveryID(unixMillis: -5, random: &random).text.hasPrefix("00000000-0000-7"))
        #expect(DeliveryID(unixMillis: .max, random: &random).text.hasPrefix("ffffffff-ffff-7"))
    }

    @Test("the store's ids: version 7 from the system's generator, the same millisecond never repeating")
    func systemRandomIDs() throws {
        let millis: Int64 = 1_764_230_400_123
        let ids = (0..<1_000).map { _ in DeliveryID(unixMillis: millis) }
        #expect(Set(ids).count == ids.count)
        for id in ids.prefix(10) {
            #expect(id.text.hasPrefix("019ac453-887b-7"), "\(id)")
            #expect(
                [UInt8(ascii: "8"), UInt8(ascii: "9"), UInt8(ascii: "a"), UInt8(ascii: "b")].contains(
                    Array(id.text.utf8)[19]))
            #expect(DeliveryID(id.text) == id)
        }
    }

    @Test(
        "the path shown by list: no query, no scheme or host",
        arguments: [
            ("/hook?token=s3cret", "/hook"), ("http://api.test/v1/events?x=1#f", "/v1/events"),
            ("http://api.test", "/"),
            ("/", "/"), ("/a#frag", "/a"), ("*", "*"),
        ])
    func path(target: String, path: String) {
        #expect(QueuedRequest(method: "POST", target: target, headers: [], body: []).path == path)
    }

    @Test("always an Idempotency-Key: the client's, else its custom key header's value, else the delivery id")
    func idempotencyKey() throws {
        var random = SplitMix64(seed: 1)
        let id = DeliveryID(random: &random)
        let own = QueuedRequest(method: "POST", target: "/", headers: [.init("idempotency-KEY", "abc")], body: [])
        #expect(own.headersForDelivery(id: id) == own.headers)
        #expect(
            own.headersForDelivery(id: id, headerName: "X-Request-Key") == own.headers + [.init("X-Request-Key", "abc")]
        )
        let none = QueuedRequest(method: "POST", target: "/", headers: [.init("Content-Type", "text/plain")], body: [])
        #expect(none.headersForDelivery(id: id) == none.headers + [.init("Idempotency-Key", id.text)])
        #expect(
            none.headersForDelivery(id: id, headerName: "X-Request-Key")
                == none.headers + [.init("Idempotency-Key", id.text), .init("X-Request-Key", id.text)])
        let custom = QueuedRequest(method: "POST", target: "/", headers: [.init("x-request-key", "k1")], body: [])
        #expect(
            custom.headersForDelivery(id: id, headerName: "X-Request-Key")
                == custom.headers + [.init("Idempotency-Key", "k1")])
        #expect(
            custom.headersForDelivery(id: id, headerName: "idempotency-key")
                == custom.headers + [.init("Idempotency-Key", id.text)])
        // An empty key is none (unrelated deliveries would share it): it gives way to the delivery id, once.
        let empty = QueuedRequest(
            method: "POST", target: "/", headers: [.init("Idempotency-Key", ""), .init("A", "1")], body: [])
        #expect(empty.headersForDelivery(id: id) == [.init("A", "1"), .init("Idempotency-Key", id.text)])
    }

    @Test("the head codec round-trips and refuses anything else")
    func codec() {
        let request = QueuedRequest(
            method: "POST", target: "/ünï?q", headers: [.init("A", ""), .init("Content-Type", "application/json")],
            body: [])
        let encoded = QueuedRequestCodec.encodeHead(request)
        let decoded = QueuedRequestCodec.decodeHead(encoded)
        #expect(decoded?.method == "POST" && decoded?.target == "/ünï?q" && decoded?.headers == request.headers)
        for cut in 0..<encoded.count {
            #expect(QueuedRequestCodec.decodeHead(Array(encoded[..<cut])) == nil, "cut at \(cut)")
        }
        #expect(QueuedRequestCodec.decodeHead(encoded + [0]) == nil)
        #expect(QueuedRequestCodec.decodeHead([2] + encoded.dropFirst()) == nil)
        #expect(QueuedRequestCodec.decodeHead([1, 0, 0, 0, 1, 0xFF, 0, 0, 0, 0, 0, 0, 0, 0]) == nil, "not UTF-8")
        #expect(
            QueuedRequestCodec.decodeHead([1, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF]) == nil, "huge count")
    }
}
