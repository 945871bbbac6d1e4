/// Parses token endpoint responses (RFC 6749 §5.1 success, §5.2 error) with configurable field names.
public enum TokenResponseParser {
    /// The longest lifetime we believe: 10 years (365-day years). Larger values (`1e300`, `9999999999999`,
    /// overflow to infinity) are clamped to it so `now + expiresIn` stays a sane instant.
    public static let maxExpiresIn: Double = 10 * 365 * 86_400

    /// Parses a success body.
    ///
    /// - Access token: required, a non-empty string without control characters.
    /// - Refresh token: optional; null or empty counts as absent (no rotation); any other non-string is an error.
    /// - Expires-in: a JSON number or a string holding a JSON number literal (`"3600"`); above `maxExpiresIn` →
    ///   `maxExpiresIn`; 0 or less, and anything else (bool, null, `"soon"`) → nil (unknown: the token is used until
    ///   the upstream rejects it). A token announced as expired on arrival would otherwise be refreshed again at once,
    ///   in a loop, for as long as the endpoint answers so.
    /// - An object without the access token but with a well-formed `error` → `.errorResponse(code:)`.
    public static func parse(
        _ body: [UInt8], fields: TokenFields = TokenFields()
    ) throws(TokenResponseError)
        -> TokenResponse
    {
        guard let document = TokenJSONParser.parse(body) else { throw .notJSON }
        guard case .object(let object) = document else { throw .notAnObject }

        let accessToken: String
        switch object[fields.accessToken] {
        case nil:
            if let code = errorCode(in: object) { throw .errorResponse(code: code) }
            throw .missingAccessToken(field: fields.accessToken)
        case .string(let value):
            guard !value.isEmpty else { throw .emptyAccessToken(field: fields.accessToken) }
            guard !value.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F }) else {
                throw .accessTokenInvalidCharacters(field: fields.accessToken)
            }
            accessToken = value
        case .some:
            throw .accessTokenNotString(field: fields.accessToken)
        }

        let refreshToken: String?
        switch object[fields.refreshToken] {
        case nil, .null: refreshToken = nil
        case .string(let value): refreshToken = value.isEmpty ? nil : value
        case .some: throw .refreshTokenNotString(field: fields.refreshToken)
        }

        return TokenResponse(
            accessToken: accessToken, refreshToken: refreshToken,
            expiresIn: object[fields.expiresIn].flatMap(expiresIn(from:)))
    }

    /// The `error` code of an OAuth error response (RFC 6749 §5.2), for logs; nil when the body is not one.
    ///
    /// Only codes made of the characters RFC 6749 allows (printable ASCII except `"` and `\`), at most 64 of them,
    /// are returned, so a hostile body cannot smuggle text into logs. `error_description` is never returned.
    public static func oauthErrorCode(_ body: [UInt8]) -> String? {
        guard case .object(let object)? = TokenJSONParser.parse(body) else { return nil }
        return errorCode(in: object)
    }

    private static func errorCode(in object: [String: TokenJSONValue]) -> String? {
        guard case .string(let code)? = object["error"], !code.isEmpty, code.utf8.count <= 64 else { return nil }
        let allowed = code.utf8.allSatisfy { byte in
            (0x20...0x7E).contains(byte) && byte != UInt8(ascii: "\"") && byte != UInt8(ascii: "\\")
        }
        return allowed ? code : nil
    }

    private static func expiresIn(from value: TokenJSONValue) -> Double? {
        let seconds: Double
        switch value {
        case .number(let number): seconds = number
        case .string(let text):
            guard let number = TokenJSONParser.number(fromLiteral: text) else { return nil }
            seconds = number
        default: return nil
        }
        guard seconds > 0 else { return nil }  // NaN too
        return min(seconds, maxExpiresIn)
    }
}
