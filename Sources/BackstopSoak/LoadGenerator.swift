import BackstopCore
import BackstopTestSupport
import NIOConcurrencyHelpers

/// Drives the daemon with `concurrency` keep-alive clients until a deadline: a seeded mix of GET, HEAD, PUT, POST
/// (half of them with an `Idempotency-Key`) and DELETE, request bodies from none to past the retry buffer, and
/// clients that disconnect before their response. Every request carries a unique `X-Soak-Id`; every outcome is
/// classified so the report can prove that each request got exactly one response in time.
final class LoadGenerator: Sendable {
    struct Stats: Sendable {
        var requests: [String: Int] = [:]
        var keyedPosts = 0
        var statuses: [Int: Int] = [:]
        /// Sent and never answered: the connection closed or failed before a response head.
        var lost = 0
        /// No response head within `total + 1 s`.
        var hung = 0
        /// A response head arrived but the body was cut short.
        var truncated = 0
        /// A body that kept streaming past the body timeout.
        var stalledBodies = 0
        /// Responses no request asked for (the decoder saw a response beyond the requests sent).
        var extraResponses = 0
        /// Responses carrying a lying upstream's forged answer (its marker header or bytes): must stay 0.
        var injected = 0
        /// Answers from a lying upstream relayed at their honest length (the connection then closes).
        var lies = 0
        /// Clients that hung up on purpose before their response.
        var abandoned = 0
        var connectFailures = 0
        var slowestHead: Duration = .zero
        var samples: [String] = []

        mutating func note(_ text: String) { if samples.count < 12 { samples.append(text) } }
    }

    private let port: Int
    private let host: String
    private let headTimeout: Duration
    private let stats = NIOLockedValueBox(Stats())

    /// `headTimeout`: the upstream's `timeouts.total` plus the 1 s the report allows on top.
    init(port: Int, host: String, headTimeout: Duration) {
        self.port = port
        self.host = host
        self.headTimeout = headTimeout
    }

    var result: Stats { stats.withLockedValue { $0 } }

    /// Runs `concurrency` clients until `duration` has passed and every one has its last response. `phase` keeps
    /// request ids (and random streams) of separate runs apart.
    func run(concurrency: Int, duration: Duration, seed: UInt64, phase: Int) async {
        let deadline = ContinuousClock.now + duration
        await withTaskGroup(of: Void.self) { group in
            for worker in 0..<concurrency {
                group.addTask {
                    await self.client(worker: worker, seed: seed, phase: phase, deadline: deadline)
                }
            }
        }
    }

    private func client(worker: Int, seed: UInt64, phase: Int, deadline: ContinuousClock.Instant) async {
        var random = SplitMix64(seed: seed &+ UInt64(worker) &* 7919 &+ UInt64(phase) &* 104_729)
        var serial = 0
        while ContinuousClock.now < deadline {
            let connection: RawHTTPConnection
            do {
                connection = try await RawHTTPConnection.connect(host: host, port: port, connectTimeout: .seconds(5))
            } catch {
                stats.withLockedValue {
                    $0.connectFailures += 1
                    $0.note("connect: \(error)")
                }
                continue
            }
            var sent = 0
            var previous = "none"
            let perConnection = 1 + Int(random.next() % 20)
            for _ in 0..<perConnection where ContinuousClock.now < deadline {
                serial += 1
                let (request, method) = makeRequest(id: "p\(phase)w\(worker)-\(serial)", random: &random)
                sent += 1
                let keepGoing = await exchange(
                    request, method: method, on: connection, previous: previous, random: &random)
                previous = method
                if !keepGoing { break }
            }
            // A duplicate answer to the last request would arrive right behind it: give it a moment to show.
            _ = try? await connection.waitForClose(timeout: .milliseconds(5))
            if connection.failure == .unsolicitedResponse || connection.responsesReceived > sent {
                stats.withLockedValue { $0.extraResponses += max(1, connection.responsesReceived - sent) }
            }
            await connection.close()
        }
    }

    /// Sends one request and classifies its outcome; false when the connection cannot carry another request.
    private func exchange(
        _ request: [UInt8], method: String, on connection: RawHTTPConnection, previous: String,
        random: inout SplitMix64
    ) async -> Bool {
        let abandon = random.next() % 100 < 3
        let abandonAfter = Duration.milliseconds(Int64(random.next() % 60))
        let started = ContinuousClock.now
        do {
            try await connection.send(request)
        } catch {
            stats.withLockedValue {
                $0.lost += 1
                $0.note("send \(method) after \(previous) \(connection.lastHeadSummary): \(error)")
            }
            return false
        }
        if abandon {
            // Hang up before the response (or right after its head, if it was quicker): the proxy must cancel.
            _ = try? await connection.waitForResponseHead(timeout: abandonAfter)
            stats.withLockedValue { $0.abandoned += 1 }
            return false
        }
        let head: RawHTTPResponseHead
        do {
            // `total + 1 s` from when the request started, not from when its body finished sending.
            head = try await connection.waitForResponseHead(timeout: headTimeout - (ContinuousClock.now - started))
        } catch let error as RawHTTPError {
            stats.withLockedValue {
                switch error {
                case .timeout: $0.hung += 1
                case .unsolicitedResponse: break  // counted once the connection ends
                default: $0.lost += 1
                }
                $0.note("\(method) head: \(error)")
            }
            return false
        } catch {
            stats.withLockedValue { $0.lost += 1 }
            return false
        }
        let waited = ContinuousClock.now - started
        stats.withLockedValue {
            $0.statuses[head.status, default: 0] += 1
            $0.slowestHead = max($0.slowestHead, waited)
        }
        if head.header(ChaosOrigin.injectedMarker) != nil {
            stats.withLockedValue { $0.injected += 1 }
        }
        let response: RawHTTPResponse
        do {
            response = try await connection.nextResponse(timeout: .seconds(60))
        } catch let error as RawHTTPError {
            stats.withLockedValue {
                if case .timeout = error { $0.stalledBodies += 1 } else { $0.truncated += 1 }
                $0.note("\(method) \(head.status) body: \(error)")
            }
            return false
        } catch {
            stats.withLockedValue { $0.truncated += 1 }
            return false
        }
        if ByteSearch.contains(response.body, Array(ChaosOrigin.injectedMarker.utf8)) {
            stats.withLockedValue { $0.injected += 1 }
        }
        if head.header(ChaosOrigin.lieMarker) != nil {
            // Backstop relays exactly the announced length and then closes the connection: no next request on it.
            stats.withLockedValue { $0.lies += 1 }
            return false
        }
        return head.header("Connection")?.lowercased() != "close"
    }

    private func makeRequest(id: String, random: inout SplitMix64) -> ([UInt8], String) {
        let roll = random.next() % 100
        let method = roll < 55 ? "GET" : roll < 62 ? "HEAD" : roll < 77 ? "PUT" : roll < 95 ? "POST" : "DELETE"
        var headers: [(String, String)] = [("X-Soak-Id", id)]
        var body: [UInt8] = []
        if method == "PUT" || method == "POST" {
            // Mostly small, sometimes past the 64 KiB retry buffer (streamed once, never replayed).
            let size =
                random.next() % 10 == 0 ? 64 * 1024 + Int(random.next() % (192 * 1024)) : Int(random.next() % 8192)
            body = Array(repeating: UInt8(ascii: "b"), count: size)
        }
        var keyed = false
        if method == "POST" && random.next() % 2 == 0 {
            headers.append(("Idempotency-Key", id))
            keyed = true
        }
        stats.withLockedValue {
            $0.requests[method, default: 0] += 1
            if keyed { $0.keyedPosts += 1 }
        }
        return (
            RawHTTP.request(
                method, "http://chaos.test/soak/\(id)", host: "chaos.test", headers: headers,
                body: method == "PUT" || method == "POST" ? body : nil), method
        )
    }
}
