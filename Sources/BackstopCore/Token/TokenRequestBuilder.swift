/// Builds token endpoint requests (RFC 6749 §6 refresh, §4.4 client credentials) with the configured client
/// authentication (docs/reference/config.md#client-authentication-at-the-token-endpoint):
///
/// - `client_secret_post` (default): `client_id` and `client_secret` in the body (RFC 6749 §2.3.1); with no secret,
///   a public client that sends only its id.
/// - `client_secret_basic`: `Authorization: Basic` over the form-urlencoded id and secret (RFC 6749 §2.3.1: encoded
///   first, then joined with `:` and base64-encoded); neither goes in the body.
/// - `private_key_jwt`: `client_assertion_type` and a fresh `client_assertion` (RFC 7523 §2.2), with `client_id`
///   (RFC 7521 §4.2 allows it; several providers want it).
/// - `tls_client_auth`: `client_id` in the body; the client is authenticated by its certificate (RFC 8705 §2).
///
/// Parameters go in a fixed order (`grant_type`, `refresh_token`, `scope`, `client_id`, then the credential) so the
/// body is byte-for-byte predictable. Optional values that are nil or empty are left out.
public enum TokenRequestBuilder {
    /// RFC 7523 §2.2.
    public static let assertionType = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"

    /// The request for `config.grant`.
    ///
    /// - Parameters:
    ///   - refreshToken: the current refresh token; required (non-empty) for `grant: refresh_token`, ignored for
    ///     `client_credentials`.
    ///   - clientSecret: read by the caller from the keychain entry `client_secret_entry`, if configured; required
    ///     for `client_secret_basic`.
    ///   - clientAssertion: a signed JWT made for this very request; required for `private_key_jwt`.
    public static func build(
        config: OAuth2Config, refreshToken: String?, clientSecret: String?, clientAssertion: String? = nil
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
        let clientID = config.clientID.flatMap { $0.isEmpty ? nil : $0 }
        var headers: [(name: String, value: String)] = []
        switch config.clientAuth {
        case .clientSecretPost:
            if let clientID { params.append(("client_id", clientID)) }
            if let clientSecret, !clientSecret.isEmpty { params.append(("client_secret", clientSecret)) }
        case .clientSecretBasic:
            guard let clientSecret, !clientSecret.isEmpty else { throw .missingClientSecret }
            headers.append((name: "Authorization", value: basicAuthorization(id: clientID ?? "", secret: clientSecret)))
        case .privateKeyJWT:
            guard let clientAssertion, !clientAssertion.isEmpty else { throw .missingClientAssertion }
            if let clientID { params.append(("client_id", clientID)) }
            params.append(("client_assertion_type", assertionType))
            params.append(("client_assertion", clientAssertion))
        case .tlsClientAuth:
            if let clientID { params.append(("client_id", clientID)) }
        }

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
        headers = [(name: "Content-Type", value: contentType), (name: "Accept", value: "application/json")] + headers
        return TokenEndpointRequest(url: config.tokenURL, method: "POST", headers: headers, body: body)
    }

    /// `Basic base64(urlencode(id) ":" urlencode(secret))`, RFC 6749 §2.3.1.
    public static func basicAuthorization(id: String, secret: String) -> String {
        var joined: [UInt8] = []
        TokenFormEncoder.appendEscaped(id, to: &joined)
        joined.append(UInt8(ascii: ":"))
        TokenFormEncoder.appendEscaped(secret, to: &joined)
        return "Basic " + Base64.encode(joined)
    }
}
