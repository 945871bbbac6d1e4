import ArgumentParser
import BackstopKeychain
import Foundation

/// `backstop keychain set NAME`: store a secret read from stdin (never from argv, where `ps` would show it).
struct KeychainSetCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "set",
        abstract: "Store a secret read from stdin (one trailing newline is stripped).",
        discussion: "Example: printf %s \"$TOKEN\" | backstop keychain set api/token"
    )

    /// Larger input is almost certainly a mistake (a file piped in by accident), not a secret.
    static let maxSecretBytes = 1 << 20

    @Argument(help: "Entry name, e.g. api/refresh_token.") var name: String
    @OptionGroup var options: ConfigOption

    func run() throws {
        let name = self.name
        try KeychainCLI.run { () throws(KeychainError) in try KeychainEntryName.validate(name) }
        let section = try options.keychainSection()
        let keychain = try KeychainCLI.open(section)
        let secret = try SecretInput.read(prompt: "secret for \(name): ", limit: Self.maxSecretBytes)
        guard !secret.isEmpty else { throw KeychainCLI.fail("no secret on stdin for \(name) (input was empty)") }
        try KeychainCLI.run { () throws(KeychainError) in try keychain.set(name, value: secret) }
        KeychainCLI.say("stored \(name) in keychain \(section.path)")
    }
}

/// Reads a secret from stdin: all of it when piped, one line without echo when typed at a terminal.
enum SecretInput {
    static func read(prompt: String, limit: Int) throws -> [UInt8] {
        var bytes = isatty(STDIN_FILENO) == 1 ? try readFromTerminal(prompt: prompt) : try readAll(limit: limit)
        guard bytes.count <= limit else {
            throw KeychainCLI.fail("secret on stdin is larger than \(limit) bytes")
        }
        if bytes.last == UInt8(ascii: "\n") {
            bytes.removeLast()
            if bytes.last == UInt8(ascii: "\r") { bytes.removeLast() }
        }
        return bytes
    }

    private static func readAll(limit: Int) throws -> [UInt8] {
        var result: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 64 * 1024)
        while result.count <= limit {
            let n = chunk.withUnsafeMutableBytes { Glibc.read(STDIN_FILENO, $0.baseAddress, $0.count) }
            if n == 0 { break }
            if n < 0 {
                if errno == EINTR { continue }
                throw KeychainCLI.fail("cannot read stdin: \(String(cString: strerror(errno)))")
            }
            result.append(contentsOf: chunk[0..<n])
        }
        return result
    }

    /// Signals that end the process at the prompt: each gives the terminal its echo back first.
    private static let promptSignals = [SIGINT, SIGTERM, SIGQUIT, SIGHUP]

    private static func readFromTerminal(prompt: String) throws -> [UInt8] {
        Console.write(prompt, to: STDERR_FILENO)
        var saved = termios()
        let canHideEcho = tcgetattr(STDIN_FILENO, &saved) == 0
        var previous: [sighandler_t?] = []
        if canHideEcho {
            savedTerminal = saved
            // Ctrl-C at the prompt would otherwise leave the operator's terminal without echo.
            previous = promptSignals.map { signal($0, restoreTerminalAndDie) }
            var quiet = saved
            quiet.c_lflag &= ~tcflag_t(ECHO)
            tcsetattr(STDIN_FILENO, TCSAFLUSH, &quiet)
        }
        defer {
            if canHideEcho {
                tcsetattr(STDIN_FILENO, TCSAFLUSH, &saved)
                for (number, handler) in zip(promptSignals, previous) { signal(number, handler) }
            }
            Console.write("\n", to: STDERR_FILENO)
        }
        guard let line = readLine(strippingNewline: true) else { return [] }
        return Array(line.utf8)
    }
}

/// The terminal's settings before a prompt hid the echo. Safe unsynchronized: written once, on the only thread that
/// reads the prompt, before `restoreTerminalAndDie` is installed; only read after that, by the handler.
nonisolated(unsafe) private var savedTerminal = termios()

/// A signal at the no-echo prompt: the terminal is given back as it was (`tcsetattr` is async-signal-safe), then
/// the signal takes its default action.
private func restoreTerminalAndDie(_ number: Int32) {
    tcsetattr(STDIN_FILENO, TCSANOW, &savedTerminal)
    signal(number, SIG_DFL)
    raise(number)
}
