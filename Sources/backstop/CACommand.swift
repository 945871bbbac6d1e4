import ArgumentParser
import BackstopCA
import BackstopCore
import BackstopKeychain
import Foundation

/// `backstop ca …`: the local root CA of TLS interception (docs/reference/cli.md#ca).
struct CACommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ca",
        abstract: "Manage the local root CA that signs intercepted connections.",
        subcommands: [CAInitCommand.self, CAExportCommand.self]
    )
}

extension ConfigOption {
    /// The config's keychain section and the keychain entry of the root CA (`intercept.ca_entry`, default `ca/root`).
    func caLocation() throws -> (keychain: KeychainConfig, entry: String) {
        let config = try loadConfig()
        guard let section = config.keychain else { throw KeychainCLI.fail("no keychain section in \(path)") }
        return (section, config.intercept?.caEntry ?? InterceptConfig().caEntry)
    }
}

/// `backstop ca init`: create the root CA in the keychain; never replaces one.
struct CAInitCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "init",
        abstract: "Create a root CA (ECDSA P-256, 10 years) in the keychain entry intercept.ca_entry.",
        discussion: "Creates the keychain (and key file) first when missing. Refuses to replace an existing CA: "
            + "delete the entry with 'backstop keychain delete' first, then re-distribute the new root."
    )

    @Option(name: .long, help: "The root's common name.") var subject = "Backstop local interception CA"
    @OptionGroup var options: ConfigOption

    func validate() throws {
        guard !subject.isEmpty, subject.utf8.count <= 64, subject.utf8.allSatisfy({ $0 >= 0x20 && $0 < 0x7F }) else {
            throw ValidationError("--subject must be 1 to 64 printable ASCII characters")
        }
    }

    func run() throws {
        let (section, entryName) = try options.caLocation()
        try KeychainCLI.run { () throws(KeychainError) in try KeychainEntryName.validate(entryName) }
        let opened = try KeychainCLI.run { () throws(KeychainError) in
            try KeychainBootstrap.open(path: section.path, key: KeychainCLI.keySource(section.key))
        }
        let root: CAIdentity
        do {
            root = try CertificateMinter.makeRoot(commonName: subject, now: Date())
        } catch {
            throw KeychainCLI.fail("cannot create the root CA: \(error)")
        }
        let stored: Bool
        do {
            stored = try opened.keychain.withExclusiveLock { (session: KeychainLockedSession) throws -> Bool in
                var entries = session.entries
                guard entries[entryName] == nil else { return false }
                entries[entryName] = KeychainEntry(string: root.pemBundle)
                try session.write(entries)
                return true
            }
        } catch let error as KeychainError {
            throw KeychainCLI.fail(error)
        }
        guard stored else {
            throw KeychainCLI.fail(
                "keychain entry \(entryName) already exists; it is left unchanged "
                    + "(to replace it: backstop keychain delete \(entryName), then backstop ca init)")
        }
        KeychainCLI.say("created root CA '\(subject)' in \(entryName) of keychain \(section.path)")
        KeychainCLI.say("SHA-256 fingerprint: \(root.fingerprint)")
        KeychainCLI.say("export it for clients with: backstop ca export > backstop-root.pem")
    }
}

/// `backstop ca export`: the root certificate as PEM on stdout, never the key.
struct CAExportCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "export",
        abstract: "Print the root CA certificate (PEM) for the apps' trust store; never the key."
    )

    @OptionGroup var options: ConfigOption

    func run() throws {
        let (section, entryName) = try options.caLocation()
        let keychain = try KeychainCLI.open(section)
        guard let entry = try KeychainCLI.run({ () throws(KeychainError) in try keychain.entry(entryName) }) else {
            throw KeychainCLI.fail("no root CA in keychain entry \(entryName); create one with 'backstop ca init'")
        }
        let root: CAIdentity
        do throws(CABundleError) {
            root = try CAIdentity(pemBundle: entry.stringValue ?? "")
        } catch {
            throw KeychainCLI.fail("keychain entry \(entryName): \(error.description)")
        }
        Console.write(
            root.certificatePEM.hasSuffix("\n") ? root.certificatePEM : root.certificatePEM + "\n", to: STDOUT_FILENO)
    }
}
