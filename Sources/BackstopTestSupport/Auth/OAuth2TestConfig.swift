/// The `upstreams` section the oauth2 tests share: one upstream `api` matching `api.test`, one attempt, its tokens
/// from an oauth2 token endpoint. Interpolate it at the start of a line of the config.
public enum OAuth2TestConfig {
    /// `originURL`: where requests go; `tokenURL`: the token endpoint; `prefix`: the `keychain_prefix` (several
    /// proxies sharing a keychain keep their tokens apart with it); `authLines`: more keys of the `auth` section
    /// (`grant: client_credentials`, `refresh_ahead: 60s`), one per line.
    public static func upstreams(
        originURL: String, tokenURL: String, prefix: String = "api", authLines: [String] = []
    ) -> String {
        var yaml = """
            upstreams:
              - name: api
                match: {hosts: [api.test]}
                url: \(originURL)
                retry: {attempts: 1}
                auth:
                  type: oauth2
                  token_url: \(tokenURL)
                  keychain_prefix: \(prefix)

            """
        for line in authLines where !line.isEmpty { yaml += "      " + line + "\n" }
        return yaml
    }
}
