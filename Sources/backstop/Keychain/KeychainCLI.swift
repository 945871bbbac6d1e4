import ArgumentParser
import BackstopCore
import BackstopKeychain
import Foundation

extension ConfigOption {
    /// The config's keychain section. Config errors are printed one per line; with no keychain section the
    /// command fails with exit status 1.
    func keychainSection() throws -> KeychainConfig {
        let config = try loadConfig()
        guard let section = config.keychain else {
            throw KeychainCLI.fail("no keychain section in \(path)")
        }
        return section
    }

    /// The config, or its errors printed one per line and exit status 1.
    func loadConfig() throws -> Config {
        do {
            return try ConfigLoader.load(path: path)
        } catch {
            for problem in error.errors { KeychainCLI.printToStderr(problem.description) }
            throw ExitCode(1)
        }
    }
}

/// Plumbing shared by the keychain subcommands: output, errors, and opening the keychain.
enum KeychainCLI {
    static func keySource(_ source: KeySource) -> KeychainKeySource {
        switch source {
        case .file(let path): .file(path: path)
        case .credential(let name): .credential(name: name)
        }
    }

    /// Opens an existing keychain with its configured key, without creating anything.
    static func open(_ section: KeychainConfig) throws -> FileKeychain {
        do throws(KeychainError) {
            let key = try KeychainKey.load(keySource(section.key))
            let keychain = FileKeychain(path: section.path, key: key)
            guard try keychain.exists() else { throw KeychainError.missing(path: section.path) }
            return keychain
        } catch .keyFileMissing(let keyPath) where FileManager.default.fileExists(atPath: section.path) {
            throw fail(KeychainError.keyMissingForExistingKeychain(keychainPath: section.path, keyPath: keyPath))
        } catch {
            throw fail(error)
        }
    }

    /// Runs a keychain operation, turning its errors into a message and exit status 1.
    static func run<T>(_ body: () throws(KeychainError) -> T) throws -> T {
        do {
            return try body()
        } catch {
            throw fail(error)
        }
    }

    static func fail(_ error: KeychainError) -> ExitCode {
        fail(error.description)
    }

    static func fail(_ message: String) -> ExitCode {
        printError(message)
        return ExitCode(1)
    }

    static func printError(_ message: String) {
        printToStderr("error: " + message)
    }

    static func printToStderr(_ line: String) { Console.error(line) }

    static func say(_ message: String) { Console.out(message) }
}
