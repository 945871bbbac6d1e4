import ArgumentParser

/// `backstop keychain …`: manage the encrypted keychain named by the config (docs/reference/cli.md#keychain).
struct KeychainCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "keychain",
        abstract: "Manage the encrypted keychain named in the config.",
        subcommands: [
            KeychainInitCommand.self, KeychainSetCommand.self, KeychainGetCommand.self,
            KeychainListCommand.self, KeychainDeleteCommand.self, KeychainRekeyCommand.self,
        ]
    )
}
