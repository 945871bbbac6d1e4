import ArgumentParser
import BackstopCore
import BackstopKeychain
import Foundation

/// `backstop keychain list`: entry names and update times, never values.
struct KeychainListCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "list",
        abstract: "Print entry names (never values), one per line: NAME<TAB>UPDATED (ISO 8601, UTC)."
    )

    @OptionGroup var options: ConfigOption

    func run() throws {
        let section = try options.keychainSection()
        let keychain = try KeychainCLI.open(section)
        let entries = try KeychainCLI.run { () throws(KeychainError) in try keychain.load() }
        var output = ""
        for name in entries.keys.sorted() {
            output +=
                name + "\t" + ISO8601Time.format(epochSeconds: entries[name]!.updated.timeIntervalSince1970) + "\n"
        }
        Console.write(output, to: STDOUT_FILENO)
    }
}
