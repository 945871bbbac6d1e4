import BackstopCore
import BackstopIdentity
import BackstopKeychain

/// What signs the attempts of an `aws_sigv4` upstream (docs/reference/aws-sigv4.md): the signer for its region and
/// service, and its keys, each entry read from the keychain as `auth: static` reads its own (cached, re-read when
/// the keychain file changes), so `backstop keychain set` takes effect without a restart.
final class SigV4Source: Sendable {
    let signer: SigV4Signer
    let payload: AWSPayloadSigning
    private let accessKey: StaticTokenSource
    private let secretKey: StaticTokenSource
    private let sessionToken: StaticTokenSource?

    init(keychain: FileKeychain, config: AWSSigV4Config) {
        signer = SigV4Signer(region: config.region, service: config.service)
        payload = config.payload
        accessKey = StaticTokenSource(keychain: keychain, entry: config.accessKeyEntry)
        secretKey = StaticTokenSource(keychain: keychain, entry: config.secretKeyEntry)
        sessionToken = config.sessionTokenEntry.map { StaticTokenSource(keychain: keychain, entry: $0) }
    }

    /// The keys for the next attempt; nil when an entry is missing or holds a control character (the request then
    /// gets 502 `token-unavailable`: an unsigned request is never sent).
    func credentials() -> SigV4Credentials? {
        guard let access = accessKey.value(), let secret = secretKey.value() else { return nil }
        var token: String?
        if let sessionToken {
            guard let value = sessionToken.value() else { return nil }
            token = value
        }
        return SigV4Credentials(accessKeyID: access, secretAccessKey: secret, sessionToken: token)
    }
}
