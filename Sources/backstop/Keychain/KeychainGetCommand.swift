import ArgumentParser
import BackstopKeychain
import Foundation

/// `backstop keychain get NAME`: print one secret to stdout.
struct KeychainGetCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "get",
        abstract: "Print a secret to stdout, followed by a newline; exit 1 if absent."
    )

    @Argument(help: "Entry name.") var name: String
    @OptionGroup var options: ConfigOption

    func run() throws {
        let section = try options.keychainSection()
        let keychain = try KeychainCLI.open(section)
        guard let entry = try KeychainCLI.run({ () throws(KeychainError) in try keychain.entry(name) }) else {
            throw KeychainCLI.fail("no entry \(name) in keychain \(section.path)")
        }
        Console.write(entry.value + [UInt8(ascii: "\n")], to: STDOUT_FILENO)
    }
}
