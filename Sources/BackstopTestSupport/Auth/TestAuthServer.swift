import Foundation
import Synchronization

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
        public init() {}
    }

    private struct State {
        var behaviour = Behaviour()
        var validAccessTokens: Set<String> = []
        var currentRefreshToken: String
        var issued = 0
        var tokenCalls = 0
        var rejectedRefreshTokens = 0
        var requestBodies: [String] = []
    }

    private let state: Mutex<State>
    public let origin: TestOrigin

    /// Starts the endpoint; `initialRefreshToken` is what the keychain should hold.
    public static func start(initialRefreshToken: String = "refresh-0") async throws -> TestAuthServer {
        let box = Box()
        let origin = try await TestOrigin.start { request in box.server?.answer(request) ?? .respond(status: 500) }
        let server = TestAuthServer(origin: origin, refreshToken: initialRefreshToken)
        box.server = server
        return server
    }

    private init(origin: TestOrigin, refreshToken: String) {
        self.origin = origin
        self.state = Mutex(State(currentRefreshToken: refreshToken))
    }

    public var tokenURL: String { origin.baseURL + "/oauth/token" }
    public var tokenCalls: Int { state.withLock { $0.tokenCalls } }
    public var currentRefreshToken: String { state.withLock { $0.currentRefreshToken } }
    /// Token calls that presented a refresh token that was not the current one (a reused rotated token).
    public var rejectedRefreshTokens: Int { state.withLock { $0.rejectedRefreshTokens } }
    public var requestBodies: [String] { state.withLock { $0.requestBodies } }

    public func update(_ change: (inout Behaviour) -> Void) { state.withLock { change(&$0.behaviour) } }

    /// Issues a token directly (as if obtained earlier) and returns it.
    public func issueAccessToken() -> String {
        state.withLock { s in
            s.issued += 1
            let token = "access-\(s.issued)"
            s.validAccessTokens.insert(token)
            return token
        }
    }

    /// Makes every access token issued so far invalid (the upstream answers 401 to them).
    public func revokeAllAccessTokens() { state.withLock { $0.validAccessTokens.removeAll() } }

    /// Whether `Authorization: Bearer <token>` carries a valid token.
    public func isAuthorized(_ request: RecordedRequest) -> Bool {
        guard let header = request.header("Authorization"), header.hasPrefix("Bearer ") else { return false }
        let token = String(header.dropFirst(7))
        return state.withLock { $0.validAccessTokens.contains(token) }
    }

    /// A protected origin script: 200 with `body` for a valid bearer, else 401.
    public func protectedScript(body: String = "protected") -> TestOrigin.Script {
        { [self] request in
            isAuthorized(request)
                ? .text(200, body)
                : .respond(status: 401, headers: [("WWW-Authenticate", "Bearer error=\"invalid_token\"")], body: Array("denied".utf8))
        }
    }

    private func answer(_ request: RecordedRequest) -> OriginAction {
        let body = request.bodyString
        let parameters = Self.parameters(body, contentType: request.header("Content-Type") ?? "")
        return state.withLock { s -> OriginAction in
            s.tokenCalls += 1
            s.requestBodies.append(body)
            if s.behaviour.failNext > 0 {
                s.behaviour.failNext -= 1
                return .respond(status: 503, body: Array("{\"error\":\"temporarily_unavailable\"}".utf8))
            }
            if s.behaviour.invalidGrant {
                return .respond(status: 400, headers: [("Content-Type", "application/json")],
                                body: Array("{\"error\":\"invalid_grant\"}".utf8))
            }
            let grant = parameters["grant_type"] ?? ""
            if grant == "refresh_token" {
                guard parameters["refresh_token"] == s.currentRefreshToken else {
                    s.rejectedRefreshTokens += 1
                    return .respond(status: 400, headers: [("Content-Type", "application/json")],
                                    body: Array("{\"error\":\"invalid_grant\"}".utf8))
                }
            } else if grant != "client_credentials" {
                return .respond(status: 400, body: Array("{\"error\":\"unsupported_grant_type\"}".utf8))
            }
            s.issued += 1
            let access = "access-\(s.issued)"
            s.validAccessTokens.insert(access)
            var fields = ["\"\(s.behaviour.accessTokenField)\":\"\(access)\"", "\"token_type\":\"Bearer\""]
            if grant == "refresh_token" && s.behaviour.rotateRefreshTokens {
                s.currentRefreshToken = "refresh-\(s.issued)"
                fields.append("\"\(s.behaviour.refreshTokenField)\":\"\(s.currentRefreshToken)\"")
            }
            if let expires = s.behaviour.expiresIn { fields.append("\"\(s.behaviour.expiresInField)\":\(expires)") }
            return .respond(status: 200, headers: [("Content-Type", "application/json")],
                            body: Array("{\(fields.joined(separator: ","))}".utf8))
        }
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
        private let stored = Mutex<TestAuthServer?>(nil)
        var server: TestAuthServer? {
            get { stored.withLock { $0 } }
            set { stored.withLock { $0 = newValue } }
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
