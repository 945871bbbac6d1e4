import ArgumentParser
import BackstopKeychain

/// `backstop keychain delete NAME`.
struct KeychainDeleteCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "delete",
        abstract: "Remove an entry; exit 1 if absent."
    )

    @Argument(help: "Entry name.") var name: String
    @OptionGroup var options: ConfigOption

    func run() throws {
        let section = try options.keychainSection()
        let keychain = try KeychainCLI.open(section)
        guard try KeychainCLI.run({ () throws(KeychainError) in try keychain.remove(name) }) != nil else {
            throw KeychainCLI.fail("no entry \(name) in keychain \(section.path)")
        }
        KeychainCLI.say("deleted \(name) from keychain \(section.path)")
    }
}
