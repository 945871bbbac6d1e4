/// A successful token endpoint response, parsed.
///
/// `description` never shows the tokens.
public struct TokenResponse: Sendable, Equatable, CustomStringConvertible, CustomDebugStringConvertible,
    CustomReflectable
{
    public var accessToken: String
    /// Present when the server rotated the refresh token; store it (and stop using the old one).
    public var refreshToken: String?
    /// Lifetime in seconds, already clamped to `0...TokenResponseParser.maxExpiresIn`; nil when unknown.
    public var expiresIn: Double?

    public init(accessToken: String, refreshToken: String? = nil, expiresIn: Double? = nil) {
        self.accessToken = accessToken
        self.refreshToken = refreshToken
        self.expiresIn = expiresIn
    }

    /// The absolute expiry (wall-clock seconds since the Unix epoch) for a response received at `now`.
    public func expiry(now: Double) -> Double? {
        expiresIn.map { now + $0 }
    }

    public var description: String {
        let expires = expiresIn.map { "\($0)s" } ?? "unknown"
        return "TokenResponse(refreshTokenRotated: \(refreshToken != nil), expiresIn: \(expires))"
    }

    public var debugDescription: String { description }

    public var customMirror: Mirror {
        Mirror(
            self, children: ["refreshTokenRotated": refreshToken != nil, "expiresIn": expiresIn as Any],
            displayStyle: .struct)
    }
}

/// Why a token endpoint response body was unusable. Never contains any part of the body: it carries secrets.
/// The field names in the cases are the configured (`auth.fields`) names, which are not secret.
public enum TokenResponseError: Error, Sendable, Equatable, CustomStringConvertible {
    /// Not valid UTF-8 JSON.
    case notJSON
    /// JSON, but not an object at the top level.
    case notAnObject
    /// The body is an OAuth error response (RFC 6749 §5.2) with this `error` code.
    case errorResponse(code: String)
    case missingAccessToken(field: String)
    case accessTokenNotString(field: String)
    case emptyAccessToken(field: String)
    /// The access token contains control characters (it goes into a header: CR/LF would inject fields).
    case accessTokenInvalidCharacters(field: String)
    /// The refresh token field is present but neither a string nor null.
    case refreshTokenNotString(field: String)

    public var description: String {
        switch self {
        case .notJSON: "token response is not valid JSON"
        case .notAnObject: "token response is not a JSON object"
        case .errorResponse(let code): "token endpoint returned error \(code)"
        case .missingAccessToken(let field): "token response has no \(field)"
        case .accessTokenNotString(let field): "token response field \(field) is not a string"
        case .emptyAccessToken(let field): "token response field \(field) is empty"
        case .accessTokenInvalidCharacters(let field): "token response field \(field) contains control characters"
        case .refreshTokenNotString(let field): "token response field \(field) is not a string"
        }
    }
}
