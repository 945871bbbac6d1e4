/// Builds token endpoint requests (RFC 6749 §6 refresh, §4.4 client credentials).
///
/// Client authentication: `client_id` and `client_secret` go in the request body, which RFC 6749 §2.3.1 allows.
/// We do not use HTTP Basic, because its RFC 6749 §2.3.1 form-encoding-before-base64 rule is implemented
/// inconsistently by servers, while body parameters are accepted everywhere that also accepts JSON bodies.
///
/// Parameters go in a fixed order (`grant_type`, `refresh_token`, `scope`, `client_id`, `client_secret`) so the
/// body is byte-for-byte predictable. Optional values that are nil or empty are left out.
public enum TokenRequestBuilder {
    /// The request for `config.grant`.
    ///
    /// - Parameters:
    ///   - refreshToken: the current refresh token; required (non-empty) for `grant: refresh_token`, ignored for
    ///     `client_credentials`.
    ///   - clientSecret: read by the caller from the keychain entry `client_secret_entry`, if configured.
    public static func build(
        config: OAuth2Config, refreshToken: String?, clientSecret: String?
    ) throws(TokenRequestError) -> TokenEndpointRequest {
        var params: [(String, String)] = []
        switch config.grant {
        case .refreshToken:
            guard let refreshToken, !refreshToken.isEmpty else { throw .missingRefreshToken }
            params.append(("grant_type", OAuth2Grant.refreshToken.rawValue))
            params.append(("refresh_token", refreshToken))
        case .clientCredentials:
            params.append(("grant_type", OAuth2Grant.clientCredentials.rawValue))
        }
        if let scope = config.scope, !scope.isEmpty { params.append(("scope", scope)) }
        if let clientID = config.clientID, !clientID.isEmpty { params.append(("client_id", clientID)) }
        if let clientSecret, !clientSecret.isEmpty { params.append(("client_secret", clientSecret)) }

        let contentType: String
        let body: [UInt8]
        switch config.requestFormat {
        case .form:
            contentType = "application/x-www-form-urlencoded"
            body = TokenFormEncoder.encode(params)
        case .json:
            contentType = "application/json"
            body = TokenJSONWriter.object(params)
        }
        return TokenEndpointRequest(
            url: config.tokenURL,
            method: "POST",
            headers: [(name: "Content-Type", value: contentType), (name: "Accept", value: "application/json")],
            body: body
        )
    }
}
