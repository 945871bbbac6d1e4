import BackstopCore
import BackstopTestSupport
import NIOConcurrencyHelpers

/// The soak's upstream: a `TestOrigin` that answers each request, drawn from a seeded random mix, with a success,
/// a large or slow body, a retryable status (503 or 429 with `Retry-After`), a reset or a hang, and with 401 to
/// any request whose bearer token the auth server does not (or no longer) accept. It counts what reached it per
/// soak request id, so the report can tell whether a non-idempotent request was sent twice.
final class ChaosOrigin: Sendable {
    /// What the origin did with one request.
    enum Fault: String, CaseIterable, Sendable {
        case ok, large, slow, unavailable = "503", tooMany = "429", badGateway = "502", reset, hang
        case unauthorized = "401"
        /// A lying upstream: `Content-Length` and `Transfer-Encoding` together, a forged response in the chunks.
        case conflictingFraming = "lie-framing"
        /// A lying upstream: a body longer than its `Content-Length`, a forged response in the excess.
        case overlongBody = "lie-overlong"
    }

    /// The header of the forged response a lying upstream smuggles; it must never reach a client.
    static let injectedMarker = "X-Soak-Injected"
    /// Set on the (honestly framed part of the) overlong response, so the client knows its connection closes after it.
    static let lieMarker = "X-Soak-Lie"

    /// Weights (out of 100) of the faults drawn for authorized requests.
    static let mix: [(Fault, Int)] = [
        (.ok, 54), (.large, 5), (.slow, 5), (.unavailable, 10), (.tooMany, 4), (.badGateway, 5), (.reset, 9),
        (.hang, 4), (.conflictingFraming, 2), (.overlongBody, 2),
    ]

    struct Tally: Sendable {
        var faults: [Fault: Int] = [:]
        /// Attempts the origin acted on, and attempts it refused with 401, over all requests.
        var attemptTotal = 0
        var refusedTotal = 0
        /// Per unkeyed POST/PATCH id (the only requests whose repeats matter, so memory grows with them alone): how
        /// many attempts the origin acted on. A 401 refusal is not counted there: the origin refused it unprocessed,
        /// and the request is replayed once with the refreshed token (docs/reference/behaviour.md#token-refresh).
        var attempts: [String: Int] = [:]
        /// Per unkeyed POST/PATCH id: attempts refused with 401 (each is replayed at most once).
        var refused: [String: Int] = [:]
        /// Ids of POST/PATCH requests that carried no idempotency key.
        var unkeyed: Set<String> = []
    }

    let origin: TestOrigin
    private let state: NIOLockedValueBox<(random: SplitMix64, tally: Tally)>

    private init(origin: TestOrigin, seed: UInt64) {
        self.origin = origin
        self.state = NIOLockedValueBox((SplitMix64(seed: seed ^ 0xC4A05), Tally()))
    }

    /// With `tls`, the origin serves HTTPS with that identity.
    static func start(seed: UInt64, auth: TestAuthServer, tls: TestTLSIdentity? = nil) async throws -> ChaosOrigin {
        let box = NIOLockedValueBox<ChaosOrigin?>(nil)
        let origin = try await TestOrigin.start(tls: tls, keepsRequests: false) { request in
            box.withLockedValue { $0 }?.answer(request, auth: auth) ?? .respond(status: 500)
        }
        let chaos = ChaosOrigin(origin: origin, seed: seed)
        box.withLockedValue { $0 = chaos }
        return chaos
    }

    var tally: Tally { state.withLockedValue { $0.tally } }

    private func answer(_ request: RecordedRequest, auth: TestAuthServer) -> OriginAction {
        let authorized = auth.isAuthorized(request)
        let fault = state.withLockedValue { s -> Fault in
            let id = request.header("X-Soak-Id") ?? "-"
            let unkeyed =
                (request.method == "POST" || request.method == "PATCH") && request.header("Idempotency-Key") == nil
            if unkeyed { s.tally.unkeyed.insert(id) }
            var fault = Fault.unauthorized
            if authorized {
                var roll = Int(s.random.next() % 100)
                fault = .ok
                for (candidate, weight) in Self.mix {
                    if roll < weight {
                        fault = candidate
                        break
                    }
                    roll -= weight
                }
            }
            s.tally.faults[fault, default: 0] += 1
            if fault == .unauthorized {
                s.tally.refusedTotal += 1
                if unkeyed { s.tally.refused[id, default: 0] += 1 }
            } else {
                s.tally.attemptTotal += 1
                if unkeyed { s.tally.attempts[id, default: 0] += 1 }
            }
            return fault
        }
        let size = request.body.count
        switch fault {
        case .ok:
            return .text(200, "ok \(request.method) \(size)")
        case .large:
            return .stream(status: 200, totalBytes: (1 + size % 4) << 19, chunked: size % 2 == 0)
        case .slow:
            return .chunked(
                status: 200, chunks: Array(repeating: Array(repeating: UInt8(ascii: "s"), count: 1024), count: 8),
                interval: .milliseconds(40))
        case .unavailable:
            return .respond(
                status: 503, headers: [("Retry-After", size % 3 == 0 ? "1" : "0")], body: Array("busy".utf8))
        case .tooMany:
            return .respond(status: 429, headers: [("Retry-After", "1")], body: Array("slow down".utf8))
        case .badGateway:
            return .respond(status: 502, body: Array("bad gateway".utf8))
        case .reset:
            return .reset
        case .hang:
            return .hang
        case .unauthorized:
            return .respond(
                status: 401, headers: [("WWW-Authenticate", "Bearer error=\"invalid_token\"")],
                body: Array("denied".utf8))
        case .conflictingFraming:
            let body = "HELLO" + Self.forgedResponse
            return .raw(
                Array(
                    ("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
                        + String(body.utf8.count, radix: 16) + "\r\n" + body + "\r\n0\r\n\r\n").utf8), close: true)
        case .overlongBody:
            return .raw(
                Array(
                    ("HTTP/1.1 200 OK\r\n\(Self.lieMarker): overlong\r\nContent-Length: 5\r\n\r\nHELLO"
                        + Self.forgedResponse).utf8), close: true)
        }
    }

    /// A whole response, as a lying upstream hides one in a body for the proxy to pass on as the next answer.
    static let forgedResponse = "HTTP/1.1 200 OK\r\n\(injectedMarker): yes\r\nContent-Length: 6\r\n\r\nforged"
}
