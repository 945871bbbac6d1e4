import BackstopCore
import BackstopKeychain
import BackstopPostgres
import BackstopServer
import Logging

/// Opens the configured token store (docs/reference/token-store.md) for `run`, `tokens` and `check --online`.
enum TokenStoreStartup {
    /// The provider for `config`: the keychain's (nil without a keychain), or a PostgreSQL backend (which serves
    /// while its `run()` runs), whose password comes from the keychain. An unreachable database is not an error here: the store reports it per
    /// operation and reconnects by itself.
    static func open(
        config: Config, keychain: FileKeychain?, logger: Logger, metrics: TokenStoreMetrics
    ) throws(TokenStoreSetupError) -> (any TokenStoreProvider)? {
        switch config.tokenStore {
        case .keychain:
            return keychain.map { KeychainTokenStoreProvider(keychain: $0, logger: logger, metrics: metrics) }
        case .postgres(let store):
            guard let keychain else { throw .noKeychain }
            var password: String?
            if let entry = store.passwordEntry {
                let stored: KeychainEntry?
                do throws(KeychainError) {
                    stored = try keychain.entry(entry)
                } catch {
                    throw .keychain(error.description)
                }
                guard let value = stored?.stringValue else { throw .missingPassword(entry: entry) }
                password = value
            }
            do throws(TokenStoreError) {
                let backend = try PostgresTokenBackend(
                    config: store, password: password, sealer: RecordSealer(keychain: keychain), logger: logger,
                    metrics: metrics, versions: keychain)
                return backend
            } catch {
                throw .store(error.description)
            }
        }
    }
}

/// Why the configured token store cannot be used at all (as opposed to being down for now).
enum TokenStoreSetupError: Error, CustomStringConvertible {
    case noKeychain
    case missingPassword(entry: String)
    case keychain(String)
    case store(String)

    var description: String {
        switch self {
        case .noKeychain: "token_store type postgres needs the keychain (its key seals the tokens)"
        case .missingPassword(let entry):
            "token_store.password_entry '\(entry)' is not in the keychain; store it with: backstop keychain set \(entry)"
        case .keychain(let problem): "cannot read the token store password from the keychain: \(problem)"
        case .store(let problem): problem
        }
    }
}
