import ArgumentParser
import BackstopKeychain

/// `backstop keychain init`: create an empty keychain and, if missing, its key file.
struct KeychainInitCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "init",
        abstract: "Create an empty keychain and, if missing, a new random key file (mode 0600).",
        discussion: "An existing keychain that the key opens is left unchanged. A keychain whose key file is "
            + "missing is an error: a new key could not read it."
    )

    @OptionGroup var options: ConfigOption

    func run() throws {
        let section = try options.keychainSection()
        let source = KeychainCLI.keySource(section.key)
        let opened = try KeychainCLI.run { () throws(KeychainError) in
            try KeychainBootstrap.open(path: section.path, key: source)
        }
        switch opened.outcome {
        case .createdKeyAndKeychain:
            KeychainCLI.say("created \(source) (mode 0600) and empty keychain \(section.path)")
        case .createdKeychain:
            KeychainCLI.say("created empty keychain \(section.path) (\(source) already existed)")
        case .openedExisting:
            KeychainCLI.say(
                "keychain \(section.path) already exists with \(opened.entryCount) "
                    + (opened.entryCount == 1 ? "entry" : "entries") + "; left unchanged")
        }
    }
}
