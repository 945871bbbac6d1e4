import ArgumentParser
import BackstopKeychain
import Foundation

/// `backstop keychain rekey --new-key-file PATH`: re-encrypt under a new key with one atomic replace.
struct KeychainRekeyCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "rekey",
        abstract: "Re-encrypt the keychain under a new key, atomically.",
        discussion: "The new key file must pass the same checks as the current one (mode 0600 or stricter, "
            + "owned by you); if it does not exist, a new random key is written there (mode 0600). Afterwards, "
            + "point keychain.key_file at the new file: the old key no longer opens the keychain."
    )

    @Option(name: .customLong("new-key-file"), help: ArgumentHelp("Key file with the new key.", valueName: "PATH"))
    var newKeyFile: String
    @OptionGroup var options: ConfigOption

    func validate() throws {
        if newKeyFile.isEmpty { throw ValidationError("--new-key-file: an empty path names no file") }
    }

    /// Rekeys; returns the durability warning of a replace that took effect, throws for one that did not.
    private static func rekey(_ keychain: FileKeychain, to newKey: KeychainKey) throws -> KeychainError? {
        do {
            _ = try keychain.rekey(to: newKey)
            return nil
        } catch {
            if case .durabilityUnconfirmed = error { return error }
            throw error
        }
    }

    func run() throws {
        let section = try options.keychainSection()
        let keychain = try KeychainCLI.open(section)
        let path = newKeyFile
        var generated = false
        let newKey: KeychainKey
        do throws(KeychainError) {
            newKey = try KeychainKey.load(path: path)
        } catch .keyFileMissing {
            newKey = KeychainKey.generate()
            try KeychainCLI.run { () throws(KeychainError) in try newKey.writeNewKeyFile(path: path) }
            generated = true
        } catch {
            throw KeychainCLI.fail(error)
        }
        do {
            if newKey.matches(try KeychainKey.load(KeychainCLI.keySource(section.key))) {
                throw KeychainCLI.fail("key file \(path) holds the current key; nothing to do")
            }
            if let warning = try Self.rekey(keychain, to: newKey) {
                // The keychain is already encrypted under the new key: that key must stay, whatever else failed.
                KeychainCLI.printToStderr("warning: " + warning.description)
            }
            let count = (try? FileKeychain(path: section.path, key: newKey).load().count) ?? 0
            if generated { KeychainCLI.say("created new key file \(path) (mode 0600)") }
            KeychainCLI.say(
                "re-encrypted keychain \(section.path) (\(count) "
                    + (count == 1 ? "entry" : "entries") + ") under key file \(path); "
                    + "set keychain.key_file to \(path) in \(options.path) before restarting backstop")
        } catch {
            // Only reached before the keychain was replaced (a failure after the rename is a warning above): a key
            // we just made that protects nothing would only confuse the next attempt.
            if generated, (try? FileKeychain(path: section.path, key: newKey).load()) == nil { unlink(path) }
            if let error = error as? KeychainError { throw KeychainCLI.fail(error) }
            throw error
        }
    }
}
