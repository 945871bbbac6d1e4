import ArgumentParser
import BackstopCore
import BackstopIdentity
import BackstopKeychain
import BackstopPostgres
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// The `backstop` command line (docs/reference/cli.md).
struct BackstopCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "backstop",
        abstract: "A local forward HTTP proxy that retries and keeps upstreams authenticated.",
        version: "backstop \(BackstopVersion.current)",
        subcommands: [
            RunCommand.self, CheckCommand.self, KeychainCommand.self, TokensCommand.self, CACommand.self,
            DeliveriesCommand.self, VersionCommand.self,
        ]
    )
}

/// Where the config file is: `--config`, else `$BACKSTOP_CONFIG`, else `/etc/backstop/backstop.yaml`.
struct ConfigOption: ParsableArguments {
    @Option(name: .long, help: "Config file (default: $BACKSTOP_CONFIG, else /etc/backstop/backstop.yaml).")
    var config: String?

    var path: String {
        if let config { return config }
        if let env = getenv("BACKSTOP_CONFIG"), let value = String(validatingCString: env), !value.isEmpty {
            return value
        }
        return "/etc/backstop/backstop.yaml"
    }
}

/// `backstop version`.
struct VersionCommand: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "version", abstract: "Print the version.")
    func run() {
        print("backstop \(BackstopVersion.current)")
    }
}

/// `backstop check`: validate a config, print `ok` or every error as `FILE:LINE:COLUMN: message`.
struct CheckCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "check", abstract: "Validate a config file.")
    @OptionGroup var options: ConfigOption
    @Flag(
        name: .long,
        help: ArgumentHelp(
            "Also read the keychain entries the config names, and connect to the token store (postgres) and check its "
                + "table and rights."))
    var online = false

    func run() async throws {
        do {
            let config = try ConfigLoader.load(path: options.path)
            let problems = EnvironmentChecks.problems(in: config)
            if !problems.isEmpty {
                for problem in problems { print(problem.description) }
                throw ExitCode(1)
            }
            if online, !config.keychainReferences.isEmpty, let section = config.keychain {
                let keychain = try KeychainCLI.open(section)
                let entries = try KeychainCLI.run { () throws(KeychainError) in try keychain.load() }
                let found = KeychainReferenceCheck.problems(
                    config.keychainReferences, entry: { entries[$0]?.value }, now: Date())
                if !found.isEmpty {
                    for problem in found { print(problem.description) }
                    throw ExitCode(1)
                }
            }
            if online, case .postgres = config.tokenStore {
                let found = try await TokensCLI.withStores(options) { _, provider in
                    await (provider as? PostgresTokenBackend)?.check() ?? []
                }
                if !found.isEmpty {
                    for problem in found { print("\(config.sourceFile): token_store: \(problem)") }
                    throw ExitCode(1)
                }
            }
            print("ok")
        } catch let errors as ConfigErrors {
            // The files the readable part names are checked too: every problem in one run, in file order.
            let found = errors.errors + (errors.partial.map(EnvironmentChecks.problems(in:)) ?? [])
            for error in found.inFileOrder() { print(error.description) }
            throw ExitCode(1)
        }
    }
}

/// Entry point: maps argument errors to exit code 2 (docs/reference/cli.md) instead of ArgumentParser's 64.
@main
enum Main {
    static func main() async {
        // `run`: a SIGHUP before the daemon can reload must not kill it with the default action; ignored from the
        // first instruction, before parsing, until the daemon's signal handling takes it (RunCommand).
        if CommandLine.arguments.dropFirst().first(where: { !$0.hasPrefix("-") }) == "run" { signal(SIGHUP, SIG_IGN) }
        do {
            var command = try BackstopCommand.parseAsRoot()
            let parsed = type(of: command)
            if !parsed.configuration.subcommands.isEmpty {
                // `backstop` or a group (`backstop keychain`) without its subcommand: a usage error, as any other
                // incomplete command line (docs/reference/cli.md#exit-codes); its help goes to stderr.
                Console.error(BackstopCommand.helpMessage(for: parsed))
                let names = parsed.configuration.subcommands.map { $0.configuration.commandName ?? "" }
                Console.error("error: missing subcommand: one of \(names.joined(separator: ", "))")
                exit(2)
            }
            // Every command may hold the keychain key or a secret (keychain, tokens, ca, deliveries): none leaves
            // them in a core file (docs/reference/operations.md#core-files). `run` does it again and logs what
            // failed.
            _ = CoreDumps.disable()
            if var asyncCommand = command as? AsyncParsableCommand {
                try await asyncCommand.run()
            } else {
                try command.run()
            }
        } catch {
            let code = BackstopCommand.exitCode(for: error)
            if code == .validationFailure {
                let message = BackstopCommand.fullMessage(for: error)
                Console.error(message)
                exit(2)
            }
            BackstopCommand.exit(withError: error)
        }
    }
}

/// Line output for the CLI: stdout for results, stderr for diagnostics.
enum Console {
    static func out(_ line: String) { write(line + "\n", to: STDOUT_FILENO) }
    static func error(_ line: String) { write(line + "\n", to: STDERR_FILENO) }

    /// Writes all of `text` with write(2). A standard output that cannot take it (a full disk, a closed
    /// descriptor) ends the command with exit 1 and a line saying why, where Foundation's `FileHandle.write`
    /// trapped (a crash that also hid a `keychain set` already made). A failing standard error is left alone.
    static func write(_ text: String, to descriptor: Int32) { write(Array(text.utf8), to: descriptor) }

    static func write(_ output: [UInt8], to descriptor: Int32) {
        var bytes = output[...]
        while !bytes.isEmpty {
            let written = bytes.withUnsafeBytes { Glibc.write(descriptor, $0.baseAddress, $0.count) }
            if written < 0 && errno == EINTR { continue }
            guard written > 0 else {
                if descriptor == STDOUT_FILENO {
                    let why = String(cString: strerror(errno))
                    error("error: cannot write standard output: \(why)")
                    exit(1)
                }
                return
            }
            bytes = bytes.dropFirst(written)
        }
    }
}
