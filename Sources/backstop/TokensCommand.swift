import ArgumentParser
import BackstopCore
import BackstopKeychain
import BackstopServer
import Foundation
import Logging

/// `backstop tokens …`: the oauth2 tokens, in whichever token store is configured (docs/reference/cli.md#tokens).
struct TokensCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "tokens",
        abstract: "Show and seed oauth2 tokens in the configured token store (keychain or postgres).",
        subcommands: [TokensListCommand.self, TokensSeedCommand.self]
    )
}

/// Opens the config, its keychain and its token store for one command, and closes the store afterwards.
enum TokensCLI {
    static let quiet = Logger(label: "backstop-cli") { _ in SwiftLogNoOpLogHandler() }

    static func withStores<T: Sendable>(
        _ options: ConfigOption, _ body: (Config, any TokenStoreProvider) async throws -> T
    ) async throws -> T {
        let config = try options.loadConfig()
        guard let section = config.keychain else { throw KeychainCLI.fail("no keychain section in \(options.path)") }
        let keychain = try KeychainCLI.open(section)
        let opened: (any TokenStoreProvider)?
        do throws(TokenStoreSetupError) {
            opened = try TokenStoreStartup.open(
                config: config, keychain: keychain, logger: quiet, metrics: TokenStoreMetrics())
        } catch {
            throw KeychainCLI.fail(error.description)
        }
        guard let provider = opened else { throw KeychainCLI.fail("no token store") }
        return try await provider.withRunning { try await body(config, provider) }
    }

    static func oauth2Upstreams(_ config: Config) -> [(name: String, prefix: String)] {
        config.upstreams.compactMap { upstream in
            guard case .oauth2(let oauth) = upstream.auth else { return nil }
            return (upstream.name, oauth.keychainPrefix)
        }
    }

    static func time(_ seconds: Double?) -> String {
        guard let seconds else { return "-" }
        return ISO8601Time.format(epochSeconds: seconds)
    }
}

/// `backstop tokens list`: per oauth2 upstream, where its tokens are and what is known of them; never a token.
struct TokensListCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "list",
        abstract:
            "Print each oauth2 upstream: store, access token expiry, last write, last refresh and its outcome (never "
            + "a token).",
        discussion: "Columns: UPSTREAM, STORE, ACCESS_TOKEN (present/none), REFRESH_TOKEN (present/none), EXPIRES "
            + "(ISO 8601, UTC), LAST_WRITE, WRITTEN_BY, LAST_REFRESH, REFRESH_OUTCOME (ok, or failed: CAUSE)."
    )

    @OptionGroup var options: ConfigOption

    func run() async throws {
        try await TokensCLI.withStores(options) { config, provider in
            var failed = false
            for (name, prefix) in TokensCLI.oauth2Upstreams(config) {
                let store = provider.store(forPrefix: prefix)
                do throws(TokenStoreError) {
                    let status = try await store.status()
                    let refresh = status.lastRefresh
                    Console.out(
                        [
                            name, store.location, status.hasAccessToken ? "present" : "none",
                            status.hasRefreshToken ? "present" : "none", TokensCLI.time(status.expiresAt),
                            TokensCLI.time(status.updatedAt), status.lastWrite ?? "-", TokensCLI.time(refresh?.at),
                            refresh?.outcome ?? "-",
                                // The store's plain columns (a PostgreSQL row's writer and outcome) are anyone's text
                                // who can write the table: one escaped line, as `deliveries list` prints.
                        ].map(DisplayText.oneLine).joined(separator: "\t"))
                } catch {
                    failed = true
                    KeychainCLI.printError("\(name): \(error.description)")
                }
            }
            if failed { throw ExitCode(1) }
        }
    }
}

/// `backstop tokens seed UPSTREAM`: store a refresh token read from stdin for that upstream.
struct TokensSeedCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "seed",
        abstract: "Store a refresh token read from stdin for UPSTREAM, in the configured token store.",
        discussion: "The stored access token is dropped: a daemon without a valid token in memory refreshes with the "
            + "new grant at its next request (one holding a valid token keeps using it until it expires or is "
            + "rejected), and daemons sharing the store end a failure hold-down at once. Example: "
            + "printf %s \"$REFRESH_TOKEN\" | backstop tokens seed api"
    )

    @Argument(help: "An upstream with oauth2 auth.") var upstream: String
    @OptionGroup var options: ConfigOption

    func run() async throws {
        let upstream = self.upstream
        try await TokensCLI.withStores(options) { config, provider in
            guard let prefix = TokensCLI.oauth2Upstreams(config).first(where: { $0.name == upstream })?.prefix else {
                throw KeychainCLI.fail("no upstream '\(upstream)' with oauth2 auth in \(options.path)")
            }
            let bytes = try SecretInput.read(
                prompt: "refresh token for \(upstream): ", limit: KeychainSetCommand.maxSecretBytes)
            // Every control character is refused, TAB and C1 (U+0080–U+009F) included: RFC 6749's refresh token is
            // visible characters, and one of these would be pasted by accident, never meant.
            guard let token = String(validating: bytes, as: UTF8.self), !token.isEmpty,
                HTTPSyntax.isFieldValue(token),
                !token.unicodeScalars.contains(where: { $0.properties.generalCategory == .control })
            else {
                throw KeychainCLI.fail(
                    "no usable refresh token on stdin (empty, not UTF-8, or with control characters)")
            }
            let store = provider.store(forPrefix: prefix)
            do throws(TokenStoreError) {
                try await store.seed(refreshToken: token)
            } catch {
                throw KeychainCLI.fail(error.description)
            }
            KeychainCLI.say("stored a refresh token for \(upstream) in \(store.location)")
        }
    }
}
