/// A request to an OAuth2 token endpoint, ready for the transport: always `POST` to the configured `token_url`.
///
/// `body` carries secrets (refresh token, client secret), so `description` shows only its size.
public struct TokenEndpointRequest: Sendable, Equatable, CustomStringConvertible, CustomDebugStringConvertible,
    CustomReflectable
{
    public var url: String
    public var method: String
    /// In sending order.
    public var headers: [(name: String, value: String)]
    public var body: [UInt8]

    public init(url: String, method: String = "POST", headers: [(name: String, value: String)], body: [UInt8]) {
        self.url = url
        self.method = method
        self.headers = headers
        self.body = body
    }

    public static func == (lhs: TokenEndpointRequest, rhs: TokenEndpointRequest) -> Bool {
        lhs.url == rhs.url && lhs.method == rhs.method && lhs.body == rhs.body
            && lhs.headers.map(\.name) == rhs.headers.map(\.name)
            && lhs.headers.map(\.value) == rhs.headers.map(\.value)
    }

    public var description: String { "\(method) \(url) (\(body.count) byte body)" }
    public var debugDescription: String { description }
    public var customMirror: Mirror {
        Mirror(self, children: ["method": method, "url": url, "bodyBytes": body.count], displayStyle: .struct)
    }
}

/// Why a token endpoint request could not be built.
public enum TokenRequestError: Error, Sendable, Equatable, CustomStringConvertible {
    /// `grant: refresh_token` but no (or an empty) refresh token is available; the caller answers `token-unavailable`.
    case missingRefreshToken
    /// `client_secret_basic` but the secret entry is missing or empty.
    case missingClientSecret
    /// `private_key_jwt` but no assertion could be made (the caller logs why: missing or unusable key).
    case missingClientAssertion

    public var description: String {
        switch self {
        case .missingRefreshToken: "no refresh token available for grant refresh_token"
        case .missingClientSecret: "client_auth client_secret_basic but the client secret is not in the keychain"
        case .missingClientAssertion: "client_auth private_key_jwt but no client assertion could be signed"
        }
    }
}
