import ArgumentParser
import BackstopCore
import BackstopKeychain
import BackstopQueue
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// `backstop deliveries …`: the queued deliveries and dead letters in `spool.dir` (docs/reference/cli.md#deliveries).
struct DeliveriesCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "deliveries",
        abstract: "List, retry and drop queued deliveries and dead letters (upstreams with delivery: queue).",
        subcommands: [DeliveriesListCommand.self, DeliveriesRetryCommand.self, DeliveriesDropCommand.self]
    )
}

/// Opens the config's queue store for one command (without taking the daemon's place as its deliverer).
enum DeliveriesCLI {
    /// Runs `body` with the store; nil when the spool holds no queue yet (nothing was ever queued).
    static func withStore<T>(_ options: ConfigOption, _ body: (QueueStore) async throws -> T) async throws -> T? {
        let config = try options.loadConfig()
        guard let spool = config.spool else {
            throw KeychainCLI.fail("no spool section in \(options.path): there is no queue")
        }
        guard let section = config.keychain else {
            throw KeychainCLI.fail("no keychain section in \(options.path): queued deliveries are sealed under its key")
        }
        // Only a spool that exists and can be searched, and holds no queue file, lists nothing: a missing spool.dir
        // (a typo, a different host) or one this user may not read (not the daemon's user) is an error, never the
        // empty queue a drain check would take for done (docs/reference/cli.md#deliveries).
        var info = stat()
        guard stat(spool.directory, &info) == 0 else {
            throw KeychainCLI.fail("spool.dir \(spool.directory): \(String(cString: strerror(errno)))")
        }
        guard (info.st_mode & S_IFMT) == S_IFDIR else {
            throw KeychainCLI.fail("spool.dir \(spool.directory) is not a directory")
        }
        let database = spool.directory + "/" + QueueStore.fileName
        guard access(database, F_OK) == 0 else {
            if errno == ENOENT { return nil }
            throw KeychainCLI.fail("\(database): \(String(cString: strerror(errno))) (run as the daemon's user)")
        }
        let key = try KeychainCLI.run { () throws(KeychainError) in
            try KeychainKey.load(KeychainCLI.keySource(section.key))
        }
        let store: QueueStore
        do {
            store = try await QueueStore.open(
                directory: spool.directory, key: key, budget: SpoolBudget(limit: spool.maxBytes), owner: false)
        } catch {
            throw KeychainCLI.fail(error.description)
        }
        do {
            let result = try await body(store)
            await store.close()
            return result
        } catch {
            await store.close()
            throw error
        }
    }

    /// A delivery id argument, or exit status 1 with the reason: bad input, like an id that names no delivery
    /// (docs/reference/cli.md#exit-codes).
    static func id(_ text: String) throws -> DeliveryID {
        guard let id = DeliveryID(text) else {
            throw KeychainCLI.fail("'\(text)' is not a delivery id (as printed by 'backstop deliveries list')")
        }
        return id
    }

    /// How long ago, in the two largest units: `45s`, `12m05s`, `3h07m`, `2d04h`.
    static func age(_ seconds: Double) -> String {
        let s = max(0, Int(seconds))
        switch s {
        case ..<60: return "\(s)s"
        case ..<3600: return String(format: "%dm%02ds", s / 60, s % 60)
        case ..<86_400: return String(format: "%dh%02dm", s / 3600, s % 3600 / 60)
        default: return String(format: "%dd%02dh", s / 86_400, s % 86_400 / 3600)
        }
    }
}

/// `backstop deliveries list [--dead]`.
struct DeliveriesListCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "list",
        abstract:
            "Print queued deliveries (or, with --dead, dead letters), oldest first; never a body or header value.",
        discussion: "Columns: ID, UPSTREAM, METHOD, PATH (without the query), AGE, ATTEMPTS, LAST_OUTCOME. An entry "
            + "that does not open shows METHOD and PATH as '?' and LAST_OUTCOME 'damaged'."
    )

    @Flag(name: .long, help: "Dead letters instead of queued deliveries.") var dead = false
    @OptionGroup var options: ConfigOption

    func run() async throws {
        let state: DeliveryState = dead ? .dead : .queued
        let lines =
            try await DeliveriesCLI.withStore(options) { store -> [String] in
                let now = Date().timeIntervalSince1970
                do throws(QueueError) {
                    // Every column one line of visible text (a tab or newline in an edited row would forge a row,
                    // an escape sequence reach the terminal): as in the logs, controls are written as escapes.
                    return try await store.list(state).map { d in
                        [
                            d.id.text, d.upstream, d.method ?? "?", d.path ?? "?",
                            DeliveriesCLI.age(now - d.acceptedAt),
                            String(d.attempts), d.lastOutcome ?? "-",
                        ].map(DisplayText.oneLine).joined(separator: "\t")
                    }
                } catch {
                    throw KeychainCLI.fail(error.description)
                }
            } ?? []
        for line in lines { Console.out(line) }
    }
}

/// `backstop deliveries retry ID | --all-dead`.
struct DeliveriesRetryCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "retry",
        abstract: "Put a dead letter (or, with --all-dead, every one) back in the queue, due at once.",
        discussion: "Its queue.max_age counts again from now. A running daemon sends it at its next look at the "
            + "queue (within a second)."
    )

    @Argument(help: "A dead letter's id.") var id: String?
    @Flag(name: .long, help: "Every dead letter.") var allDead = false
    @OptionGroup var options: ConfigOption

    func validate() throws {
        guard (id == nil) != !allDead else {
            throw ValidationError("give a delivery id or --all-dead, not both or neither")
        }
    }

    func run() async throws {
        let target = try id.map(DeliveriesCLI.id)
        let count =
            try await DeliveriesCLI.withStore(options) { store -> Int in
                do throws(QueueError) {
                    if let target { return try await store.retryDead(target) ? 1 : 0 }
                    return try await store.retryAllDead()
                } catch {
                    throw KeychainCLI.fail(error.description)
                }
            } ?? 0
        if let target, count == 0 { throw KeychainCLI.fail("no dead letter \(target)") }
        KeychainCLI.say("put \(count) dead letter\(count == 1 ? "" : "s") back in the queue")
    }
}

/// `backstop deliveries drop ID`.
struct DeliveriesDropCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "drop",
        abstract: "Delete one delivery, queued or dead; it is never sent (unless a daemon is sending it right now).")

    @Argument(help: "A delivery's id.") var id: String
    @OptionGroup var options: ConfigOption

    func run() async throws {
        let target = try DeliveriesCLI.id(id)
        let dropped =
            try await DeliveriesCLI.withStore(options) { store -> Bool in
                do throws(QueueError) {
                    return try await store.drop(target)
                } catch {
                    throw KeychainCLI.fail(error.description)
                }
            } ?? false
        guard dropped else { throw KeychainCLI.fail("no delivery \(target)") }
        KeychainCLI.say("dropped \(target)")
    }
}
