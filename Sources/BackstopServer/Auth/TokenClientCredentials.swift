import BackstopCore
import BackstopIdentity
import BackstopKeychain
import BackstopTransport
import Foundation

/// The keychain-held parts of an upstream's token endpoint authentication (docs/reference/config.md#client-
/// authentication-at-the-token-endpoint): the client certificate for mutual TLS and the key that signs
/// `private_key_jwt` assertions. Read for each refresh, so a rotated entry is used by the next one.
struct TokenClientCredentials {
    /// Presented in the TLS handshake with the token endpoint (`auth.tls.client_cert_entry`).
    var tlsIdentity: TransportClientIdentity?
    /// Signs a fresh assertion per call (`client_auth: private_key_jwt`).
    var signer: ClientAssertionSigner?

    static func load(config: OAuth2Config, keychain: FileKeychain?) -> Result<TokenClientCredentials, CredentialProblem>
    {
        var credentials = TokenClientCredentials()
        if let entry = config.tls.clientCertEntry {
            switch clientIdentity(entry, keychain) {
            case .failure(let problem): return .failure(problem)
            case .success(let identity): credentials.tlsIdentity = identity
            }
        }
        if config.clientAuth == .privateKeyJWT, let entry = config.clientKeyEntry {
            switch read(entry, keychain) {
            case .failure(let problem): return .failure(problem)
            case .success(let bytes):
                do {
                    credentials.signer = try ClientAssertionSigner(pem: bytes, keyID: config.clientKeyID)
                } catch {
                    return .failure(.unusable(entry: entry, why: error.description))
                }
            }
        }
        return .success(credentials)
    }

    /// The client certificate chain and key `entry` holds, checked (`ClientCertificateBundle`) and ready for curl:
    /// for the token endpoint (`auth.tls.client_cert_entry`) and for the upstream itself (`tls.client_cert_entry`).
    static func clientIdentity(
        _ entry: String, _ keychain: FileKeychain?
    )
        -> Result<TransportClientIdentity, CredentialProblem>
    {
        switch read(entry, keychain) {
        case .failure(let problem): return .failure(problem)
        case .success(let bytes):
            do {
                let bundle = try ClientCertificateBundle(pem: bytes)
                // One rule with `check --online`: a certificate the server would refuse is not presented.
                if let reason = bundle.unusableReason(now: Date()) {
                    return .failure(.unusable(entry: entry, why: reason))
                }
                return .success(
                    TransportClientIdentity(
                        certificateChainPEM: bundle.certificateChainPEM, privateKeyPEM: bundle.privateKeyPEM))
            } catch {
                return .failure(.unusable(entry: entry, why: error.description))
            }
        }
    }

    private static func read(_ entry: String, _ keychain: FileKeychain?) -> Result<[UInt8], CredentialProblem> {
        guard let keychain else { return .failure(.missing(entry: entry)) }
        do throws(KeychainError) {
            guard let value = try keychain.entry(entry)?.value else { return .failure(.missing(entry: entry)) }
            return .success(value)
        } catch {
            return .failure(.keychain(error.description))
        }
    }

    /// Why the credentials cannot be used; never carries the entry's bytes.
    enum CredentialProblem: Error, CustomStringConvertible {
        case missing(entry: String)
        case unusable(entry: String, why: String)
        case keychain(String)

        var description: String {
            switch self {
            case .missing(let entry):
                "keychain entry '\(entry)' is missing; store it with: backstop keychain set \(entry)"
            case .unusable(let entry, let why): "keychain entry '\(entry)': \(why)"
            case .keychain(let problem): "cannot read the keychain: \(problem)"
            }
        }
    }
}
