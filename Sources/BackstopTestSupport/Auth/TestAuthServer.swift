import BackstopCore
import Foundation
import NIOConcurrencyHelpers

/// A scriptable OAuth2 token endpoint (RFC 6749 §6 refresh and §4.4 client credentials, form or JSON bodies)
/// plus the bearer check a protected origin uses. Counts calls; can rotate refresh tokens, revoke access
/// tokens, fail with 503s, or answer `invalid_grant`.
public final class TestAuthServer: Sendable {
    /// How the token endpoint behaves.
    public struct Behaviour: Sendable {
        public var rotateRefreshTokens = true
        public var expiresIn: Int? = 3600
        /// Answer the next N token calls with 503.
        public var failNext = 0
        /// Answer every token call with 400 invalid_grant.
        public var invalidGrant = false
        /// Field names in the response (e.g. camelCase for a custom service).
        public var accessTokenField = "access_token"
        public var refreshTokenField = "refresh_token"
        public var expiresInField = "expires_in"
        /// When set, an access token stops being valid this long after it was issued (the protected origin
        /// answers 401 to it), matching the `expires_in` the endpoint announces.
        public var enforcedLifetime: Duration?
        /// Fraction of token calls answered with 503 at random (from `seed`), on top of `failNext`.
        public var failureRate = 0.0
        public var seed: UInt64 = 1
        /// Inserted into token values (`access-<salt>-N`), so a log scan for them cannot match anything else.
        public var tokenSalt = ""
        /// A reused refresh token revokes the whole family, as identity providers with reuse detection do
        /// (RFC 9700 §4.14.2): every access token and the current refresh token stop working.
        public var revokeFamilyOnReuse = false
        /// Token calls are held (never answered, nothing issued or rotated) while this is on: a refresher stuck
        /// inside its refresh, for crash tests.
        public var holdCalls = false
        /// Token calls are answered this much later (a slow token endpoint: requests pile up behind one refresh).
        public var answerDelay: Duration?
        /// How token calls must authenticate the client; nil: not checked.
        public var clientAuthentication: TestClientAuthentication?
        public init() {}
    }

    private struct State {
        var behaviour = Behaviour()
        /// Valid access tokens and when each stops being valid (nil: never).
        var validAccessTokens: [String: ContinuousClock.Instant?] = [:]
        var random = SplitMix64(seed: 1)
        var seeded = false
        /// When each token call that issued a token was answered.
        var grantTimes: [ContinuousClock.Instant] = []
        var failedCalls = 0
        var revocations: [ContinuousClock.Instant] = []
        /// Every token value ever issued (access and refresh), for secret scans.
        var issuedSecrets: [String] = []
        var currentRefreshToken: String
        var initialRefreshToken: String
        var issued = 0
        var tokenCalls = 0
        var rejectedRefreshTokens = 0
        var requestBodies: [String] = []
        var heldCalls = 0
        var familyRevoked = false
        /// Client authentication failures, with why.
        var clientAuthFailures: [String] = []
        var assertions: [TestVerifiedAssertion] = []
    }

    private let state: NIOLockedValueBox<State>
    public let origin: TestOrigin

    /// Starts the endpoint; `initialRefreshToken` is what the keychain should hold.
    /// With `tls`, the endpoint serves HTTPS with that identity (`tokenURL` is then `https://localhost:PORT/…`).
    public static func start(
        initialRefreshToken: String = "refresh-0", tls: TestTLSIdentity? = nil
    ) async throws
        -> TestAuthServer
    {
        let box = Box()
        let origin = try await TestOrigin.start(tls: tls) { request in
            box.server?.answer(request) ?? .respond(status: 500)
        }
        let server = TestAuthServer(origin: origin, refreshToken: initialRefreshToken)
        box.server = server
        return server
    }

    private init(origin: TestOrigin, refreshToken: String) {
        self.origin = origin
        self.state = NIOLockedValueBox(State(currentRefreshToken: refreshToken, initialRefreshToken: refreshToken))
    }

    public var tokenURL: String { origin.baseURL + "/oauth/token" }
    public var tokenCalls: Int { state.withLockedValue { $0.tokenCalls } }
    /// Token calls held by `holdCalls` (not counted in `tokenCalls`).
    public var heldCalls: Int { state.withLockedValue { $0.heldCalls } }
    /// Whether a reuse revoked the token family (`revokeFamilyOnReuse`).
    public var familyRevoked: Bool { state.withLockedValue { $0.familyRevoked } }
    public var currentRefreshToken: String { state.withLockedValue { $0.currentRefreshToken } }
    /// Token calls that presented a refresh token that was not the current one (a reused rotated token).
    public var rejectedRefreshTokens: Int { state.withLockedValue { $0.rejectedRefreshTokens } }
    public var requestBodies: [String] { state.withLockedValue { $0.requestBodies } }
    /// When each successful token call was answered.
    public var grantTimes: [ContinuousClock.Instant] { state.withLockedValue { $0.grantTimes } }
    /// Token calls answered with 503 (scripted or random).
    public var failedCalls: Int { state.withLockedValue { $0.failedCalls } }
    /// When `revokeAllAccessTokens` was called.
    public var revocationTimes: [ContinuousClock.Instant] { state.withLockedValue { $0.revocations } }
    /// Every access and refresh token value issued so far (including the initial refresh token).
    public var issuedSecrets: [String] { state.withLockedValue { $0.issuedSecrets + [$0.initialRefreshToken] } }

    public func update(_ change: (inout Behaviour) -> Void) { state.withLockedValue { change(&$0.behaviour) } }

    /// Why each refused token call failed client authentication.
    public var clientAuthFailures: [String] { state.withLockedValue { $0.clientAuthFailures } }
    /// Every client assertion accepted so far (`private_key_jwt`), in order.
    public var acceptedAssertions: [TestVerifiedAssertion] { state.withLockedValue { $0.assertions } }

    /// Issues a token directly (as if obtained earlier) and returns it.
    public func issueAccessToken() -> String {
        state.withLockedValue { s in
            s.issued += 1
            let token = Self.tokenValue("access", s)
            // updateValue, not subscript assignment: assigning a nil expiry through the subscript would remove the token.
            s.validAccessTokens.updateValue(
                s.behaviour.enforcedLifetime.map { ContinuousClock.now + $0 }, forKey: token)
            s.issuedSecrets.append(token)
            return token
        }
    }

    /// Makes every access token issued so far invalid (the upstream answers 401 to them).
    public func revokeAllAccessTokens() {
        state.withLockedValue {
            $0.validAccessTokens.removeAll()
            $0.revocations.append(.now)
        }
    }

    /// Whether `Authorization: Bearer <token>` carries a valid token.
    public func isAuthorized(_ request: RecordedRequest) -> Bool {
        isAuthorized(authorization: request.header("Authorization"))
    }

    /// Whether an `Authorization` value is `Bearer <token>` with a valid token (for origins that record fields
    /// themselves, such as `WebSocketEchoOrigin`).
    public func isAuthorized(authorization header: String?) -> Bool {
        guard let header, header.hasPrefix("Bearer ") else { return false }
        let token = String(header.dropFirst(7))
        return state.withLockedValue { s in
            guard let expiry = s.validAccessTokens[token] else { return false }
            return expiry.map { ContinuousClock.now < $0 } ?? true
        }
    }

    /// A protected origin script: 200 with `body` for a valid bearer, else 401.
    public func protectedScript(body: String = "protected") -> TestOrigin.Script {
        { [self] request in
            isAuthorized(request)
                ? .text(200, body)
                : .respond(
                    status: 401, headers: [("WWW-Authenticate", "Bearer error=\"invalid_token\"")],
                    body: Array("denied".utf8))
        }
    }

    private func answer(_ request: RecordedRequest) -> OriginAction {
        let action = decide(request)
        guard let delay = state.withLockedValue({ $0.behaviour.answerDelay }) else { return action }
        return .delay(delay, then: action)
    }

    private func decide(_ request: RecordedRequest) -> OriginAction {
        let body = request.bodyString
        let parameters = Self.parameters(body, contentType: request.header("Content-Type") ?? "")
        let method = state.withLockedValue { $0.behaviour.clientAuthentication }
        let checked = method.map { authenticate(request, parameters, $0) }
        return state.withLockedValue { s -> OriginAction in
            if s.behaviour.holdCalls {
                s.heldCalls += 1
                return .hang
            }
            switch checked {
            case .failure(let refusal)?:
                s.clientAuthFailures.append(refusal.description)
                return .respond(
                    status: 401, headers: [("Content-Type", "application/json")],
                    body: Array("{\"error\":\"invalid_client\"}".utf8))
            case .success(let assertion?)?:
                // A replayed assertion is refused, as RFC 7523 §3 lets servers do.
                if s.assertions.contains(where: { $0.jti == assertion.jti }) {
                    s.clientAuthFailures.append("jti \(assertion.jti) reused")
                    return .respond(status: 401, body: Array("{\"error\":\"invalid_client\"}".utf8))
                }
                s.assertions.append(assertion)
            case .success(nil)?, nil:
                break
            }
            s.tokenCalls += 1
            s.requestBodies.append(body)
            let grant = parameters["grant_type"] ?? ""
            // A reused (rotated-out) refresh token is counted whatever else this call would have answered.
            if grant == "refresh_token", parameters["refresh_token"] != s.currentRefreshToken || s.familyRevoked {
                if parameters["refresh_token"] != s.currentRefreshToken { s.rejectedRefreshTokens += 1 }
                if s.behaviour.revokeFamilyOnReuse && !s.familyRevoked {
                    s.familyRevoked = true
                    s.validAccessTokens.removeAll()
                }
                return .respond(
                    status: 400, headers: [("Content-Type", "application/json")],
                    body: Array("{\"error\":\"invalid_grant\"}".utf8))
            }
            if !s.seeded {
                s.random = SplitMix64(seed: s.behaviour.seed)
                s.seeded = true
            }
            let randomFailure =
                s.behaviour.failureRate > 0
                && s.random.unit() < s.behaviour.failureRate
            if s.behaviour.failNext > 0 || randomFailure {
                if s.behaviour.failNext > 0 { s.behaviour.failNext -= 1 }
                s.failedCalls += 1
                return .respond(status: 503, body: Array("{\"error\":\"temporarily_unavailable\"}".utf8))
            }
            if s.behaviour.invalidGrant {
                return .respond(
                    status: 400, headers: [("Content-Type", "application/json")],
                    body: Array("{\"error\":\"invalid_grant\"}".utf8))
            }
            if grant != "refresh_token" && grant != "client_credentials" {
                return .respond(status: 400, body: Array("{\"error\":\"unsupported_grant_type\"}".utf8))
            }
            s.issued += 1
            let access = Self.tokenValue("access", s)
            s.validAccessTokens.updateValue(
                s.behaviour.enforcedLifetime.map { ContinuousClock.now + $0 }, forKey: access)
            s.issuedSecrets.append(access)
            s.grantTimes.append(.now)
            var fields = ["\"\(s.behaviour.accessTokenField)\":\"\(access)\"", "\"token_type\":\"Bearer\""]
            if grant == "refresh_token" && s.behaviour.rotateRefreshTokens {
                s.currentRefreshToken = Self.tokenValue("refresh", s)
                s.issuedSecrets.append(s.currentRefreshToken)
                fields.append("\"\(s.behaviour.refreshTokenField)\":\"\(s.currentRefreshToken)\"")
            }
            if let expires = s.behaviour.expiresIn { fields.append("\"\(s.behaviour.expiresInField)\":\(expires)") }
            return .respond(
                status: 200, headers: [("Content-Type", "application/json")],
                body: Array("{\(fields.joined(separator: ","))}".utf8))
        }
    }

    /// The client's authentication of one call: the verified assertion for `private_key_jwt`, nil for Basic.
    private func authenticate(
        _ request: RecordedRequest, _ parameters: [String: String], _ method: TestClientAuthentication
    ) -> Result<TestVerifiedAssertion?, TestAuthRefusal> {
        switch method {
        case .basic(let id, let secret):
            guard let header = request.header("Authorization"), header.hasPrefix("Basic "),
                let decoded = Base64.decode(Array(header.dropFirst(6).utf8)),
                let text = String(validating: decoded, as: UTF8.self), let colon = text.firstIndex(of: ":")
            else { return .failure("no Basic credentials") }
            func formDecoded(_ part: Substring) -> String? {
                part.replacingOccurrences(of: "+", with: " ").removingPercentEncoding
            }
            guard formDecoded(text[..<colon]) == id, formDecoded(text[text.index(after: colon)...]) == secret else {
                return .failure("wrong Basic credentials")
            }
            guard parameters["client_secret"] == nil else { return .failure("secret also in the body") }
            return .success(nil)
        case .privateKeyJWT(let clientID, let key, let keyID):
            guard parameters["client_assertion_type"] == "urn:ietf:params:oauth:client-assertion-type:jwt-bearer" else {
                return .failure("wrong client_assertion_type")
            }
            guard let assertion = parameters["client_assertion"] else { return .failure("no client_assertion") }
            let verified = TestAssertionVerifier.verify(
                assertion, key: key, keyID: keyID, clientID: clientID, audience: tokenURL,
                now: Int64(Date().timeIntervalSince1970))
            return verified.map { Optional($0) }
        }
    }

    private static func tokenValue(_ kind: String, _ s: State) -> String {
        s.behaviour.tokenSalt.isEmpty ? "\(kind)-\(s.issued)" : "\(kind)-\(s.behaviour.tokenSalt)-\(s.issued)"
    }

    /// Decodes a form (or flat JSON string-valued) body.
    static func parameters(_ body: String, contentType: String) -> [String: String] {
        var out: [String: String] = [:]
        if contentType.contains("json") {
            // Flat {"k":"v",...} with no escapes in our test values.
            let trimmed = body.trimming(["{", "}", " "])
            for pair in trimmed.split(separator: ",") {
                let parts = pair.split(separator: ":", maxSplits: 1).map { $0.trimming(["\"", " "]) }
                if parts.count == 2 { out[parts[0]] = parts[1] }
            }
            return out
        }
        for pair in body.split(separator: "&") {
            let parts = pair.split(separator: "=", maxSplits: 1).map(String.init)
            guard parts.count == 2 else { continue }
            out[parts[0]] = parts[1].replacingOccurrences(of: "+", with: " ").removingPercentEncoding ?? parts[1]
        }
        return out
    }

    private final class Box: Sendable {
        private let stored = NIOLockedValueBox<TestAuthServer?>(nil)
        var server: TestAuthServer? {
            get { stored.withLockedValue { $0 } }
            set { stored.withLockedValue { $0 = newValue } }
        }
    }
}

extension StringProtocol {
    fileprivate func trimming(_ set: Set<Character>) -> String {
        var s = self[...]
        while let f = s.first, set.contains(f) { s = s.dropFirst() }
        while let l = s.last, set.contains(l) { s = s.dropLast() }
        return String(s)
    }
}
