import ArgumentParser
import BackstopCore
import BackstopKeychain
import BackstopQueue
import BackstopServer
import Foundation
import Logging
import NIOCore
import ServiceLifecycle
import UnixSignals

#if canImport(Glibc)
import Glibc
#endif

/// `backstop run`: serve until SIGTERM/SIGINT/SIGQUIT (graceful drain); SIGHUP reloads the config. The token store and the
/// daemon run as services of a swift-service-lifecycle `ServiceGroup`.
struct RunCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "run", abstract: "Run the daemon in the foreground.")
    @OptionGroup var options: ConfigOption

    @Option(name: .long, help: "How long a drain waits for in-flight requests (e.g. 30s).")
    var drainTimeout: String = "30s"

    /// Before anything is read: a malformed option is a usage error (exit 2) whatever the config holds
    /// (docs/reference/cli.md#exit-codes).
    func validate() throws {
        if DurationParser.parse(drainTimeout) == nil {
            throw ValidationError("--drain-timeout: '\(drainTimeout)' is not a duration (e.g. 30s)")
        }
    }

    func run() async throws {
        // A SIGHUP before the daemon can reload (config management, logrotate during a restart) must not kill it
        // with the default action: it is ignored (already from `Main`) until the signal sequence takes it, and the
        // config being loaded is the one read after it (docs/reference/operations.md#signals-reload-and-drain).
        signal(SIGHUP, SIG_IGN)
        // Before anything secret is in memory (docs/reference/operations.md#core-files).
        let coreDumpProblems = CoreDumps.disable()
        let configPath = options.path
        let config: Config
        do {
            config = try ConfigLoader.load(path: configPath)
        } catch let errors {
            for error in errors.errors { Console.error(error.description) }
            throw ExitCode(1)
        }
        // `validate` refused any other value.
        let drain = DurationParser.parse(drainTimeout) ?? .seconds(30)
        let logSettings = LogSettings(level: config.log.level.loggerLevel, format: config.log.format)
        LoggingSystem.bootstrap { label in LineLogHandler(label: label, settings: logSettings) }
        let logger = Logger(label: "backstop")
        for problem in coreDumpProblems {
            logger.warning(
                "core dumps may not be disabled: a crash could write secrets to a core file",
                metadata: [
                    "problem": .string(problem)
                ])
        }

        let problems = EnvironmentChecks.problems(in: config)
        for problem in problems { logger.error("config problem", metadata: ["detail": .string(problem.description)]) }
        if !EnvironmentChecks.refusals(in: config).isEmpty {
            logger.error("a ca_file would block every upstream; refusing to start")
            throw ExitCode(1)
        }
        for warning in PendingFeatures.warnings(in: config) {
            logger.warning("config not fully served by this build", metadata: ["detail": .string(warning)])
        }
        let keychain = try KeychainStartup.prepare(config: config, logger: logger)
        do throws(ClientPolicyError) {
            _ = try ProxyServer.clientPolicy(for: config, keychain: keychain)
        } catch {
            logger.error(
                "cannot put clients in force; refusing to start", metadata: ["error": .string(error.description)])
            throw ExitCode(1)
        }

        let intercept: InterceptAuthority?
        do {
            intercept = try InterceptAuthority.load(config: config, keychain: keychain)
        } catch {
            logger.error(
                "cannot set up interception; refusing to start", metadata: ["error": .string(error.description)])
            throw ExitCode(1)
        }
        let storeMetrics = TokenStoreMetrics()
        let tokenStores: (any TokenStoreProvider)?
        do throws(TokenStoreSetupError) {
            tokenStores = try TokenStoreStartup.open(
                config: config, keychain: keychain, logger: logger, metrics: storeMetrics)
        } catch {
            logger.error(
                "cannot set up the token store; refusing to start", metadata: ["error": .string(error.description)])
            throw ExitCode(1)
        }
        if case .postgres = config.tokenStore, let tokenStores {
            logger.notice("token store", metadata: ["store": .string(tokenStores.location)])
        }
        // The queue store is opened whenever a spool and a keychain exist, so a reload can add a `delivery: queue`
        // upstream (docs/reference/behaviour.md#queued-delivery).
        var queue: (store: QueueStore, budget: SpoolBudget)?
        if let spool = config.spool, let keychain {
            let budget = SpoolBudget(limit: spool.maxBytes)
            do throws(QueueError) {
                let store = try await QueueStore.open(
                    directory: spool.directory, key: keychain.sealingKey, budget: budget, owner: true)
                queue = (store, budget)
            } catch {
                logger.error(
                    "cannot open the delivery queue; refusing to start", metadata: ["error": .string(error.description)]
                )
                throw ExitCode(1)
            }
        }
        let server = ProxyServer(
            config: config, logger: logger, keychain: keychain, intercept: intercept, tokenStores: tokenStores,
            tokenStoreMetrics: storeMetrics, queue: queue)
        // Ignored until the sequence has registered, so an early SIGHUP or SIGTERM cannot kill the daemon with the
        // default action; from then on each arrives in `signals`.
        // SIGQUIT drains too: nginx's graceful stop, which operators send out of habit (its default action would
        // dump core, which the daemon refuses anyway: docs/reference/operations.md#core-files).
        for number in [SIGTERM, SIGINT, SIGQUIT, SIGHUP] { signal(number, SIG_IGN) }
        let signals = await UnixSignalsSequence(trapping: .sigterm, .sigint, .sigquit, .sighup)
        do {
            try await server.start()
        } catch {
            logger.error("startup failed", metadata: ["error": .string("\(error)")])
            await server.drainAndStop(timeout: .zero)
            await queue?.store.close()
            throw ExitCode(1)
        }
        let addresses = server.boundAddresses.map(\.displayString).joined(separator: ",")
        logger.notice(
            "listening",
            metadata: [
                "listeners": .string(addresses), "admin": .string(server.adminAddress?.displayString ?? "off"),
                "upstreams": .stringConvertible(config.upstreams.count),
            ])

        let environment = ProcessInfo.processInfo.environment
        let notifier = SystemdNotifier(environment: environment)
        notifier.notify("READY=1\n" + DaemonService.status(config))
        let released = StartupMemory.releaseStartupCode()
        logger.trace(
            "memory pages used only during startup handed back to the kernel",
            metadata: [
                "kib": .stringConvertible(released / 1024)
            ])
        var watchdog: RepeatedTask?
        if let interval = SystemdNotifier.watchdogInterval(environment: environment) {
            watchdog = notifier.startWatchdog(on: server.eventLoops, interval: interval)
        }

        // The daemon drains first; the token store (and its PostgreSQL client) stops after it, in reverse order.
        var services: [ServiceGroupConfiguration.ServiceConfiguration] = []
        if let tokenStores {
            services.append(
                .init(service: TokenStoreService(provider: tokenStores), successTerminationBehavior: .ignore))
        }
        services.append(
            .init(
                service: DaemonService(
                    server: server, signals: signals, configPath: configPath, drainTimeout: drain,
                    logger: logger, logSettings: logSettings, notifier: notifier, watchdog: watchdog),
                successTerminationBehavior: .gracefullyShutdownGroup))
        // The group's own lines (debug) are not the daemon's documented ones.
        let quiet = Logger(label: "backstop.lifecycle") { _ in SwiftLogNoOpLogHandler() }
        try await ServiceGroup(configuration: ServiceGroupConfiguration(services: services, logger: quiet)).run()
        // After the drain: no delivery is in flight any more, and what was claimed is queued again.
        await queue?.store.close()
        logger.notice("stopped")
    }
}

/// `backstop run` once the listeners are bound: the server's background work, a reload per SIGHUP, and on SIGTERM
/// or SIGINT the drain (docs/reference/operations.md#signals-reload-and-drain).
struct DaemonService: Service {
    let server: ProxyServer
    let signals: UnixSignalsSequence
    let configPath: String
    let drainTimeout: Duration
    let logger: Logger
    let logSettings: LogSettings
    let notifier: SystemdNotifier
    let watchdog: RepeatedTask?

    /// The systemd `STATUS=` line while serving `config`.
    static func status(_ config: Config) -> String {
        "STATUS=serving \(config.upstreams.count) upstream(s) on \(config.listeners.count) listener(s)"
    }

    func run() async {
        await withDiscardingTaskGroup { group in
            group.addTask { await server.run() }
            await serveUntilDrained()
        }
    }

    /// Reloads on SIGHUP until SIGTERM, SIGINT, SIGQUIT or the group's graceful shutdown, then drains.
    private func serveUntilDrained() async {
        var stoppedBy: UnixSignal?
        for await signal in signals.cancelOnGracefulShutdown() {
            guard signal == .sighup else {
                stoppedBy = signal
                break
            }
            notifier.notify("RELOADING=1\nMONOTONIC_USEC=\(SystemdNotifier.monotonicMicroseconds())")
            let active =
                await Reloader.reload(path: configPath, server: server, logger: logger, logSettings: logSettings)
                ?? server.runtime.snapshot.config
            notifier.notify("READY=1\n" + Self.status(active))
        }
        var metadata: Logger.Metadata = [:]
        if let stoppedBy { metadata["signal"] = .stringConvertible(stoppedBy.rawValue) }
        logger.notice("draining", metadata: metadata)
        notifier.notify("STOPPING=1\nSTATUS=draining")
        watchdog?.cancel()
        // A second stop signal during the drain stops waiting for requests in flight (an operator's second Ctrl-C or
        // `kill`). A sequence of its own, made now: `signals` allows one iterator, and holds the first signal.
        // SIGHUP is ignored while draining.
        let again = await UnixSignalsSequence(trapping: .sigterm, .sigint, .sigquit)
        await withDiscardingTaskGroup { group in
            group.addTask { [server, logger] in
                for await signal in again {
                    logger.notice(
                        "stopping without waiting for requests in flight",
                        metadata: ["signal": .stringConvertible(signal.rawValue)])
                    server.stopWaitingForRequests()
                    return
                }
            }
            await server.drainAndStop(timeout: drainTimeout)
            group.cancelAll()
        }
    }
}

/// The token store's background work (connections, listeners) for as long as the service group runs.
struct TokenStoreService: Service {
    let provider: any TokenStoreProvider

    func run() async {
        await cancelWhenGracefulShutdown { [provider] in await provider.run() }
    }
}

/// SIGHUP: re-read the config; keep the old one when the new one is invalid.
enum Reloader {
    /// Returns the new config when it was applied, nil when the old one stays.
    @discardableResult
    static func reload(path: String, server: ProxyServer, logger: Logger, logSettings: LogSettings) async -> Config? {
        let config: Config
        do {
            config = try ConfigLoader.load(path: path)
        } catch let errors {
            for error in errors.errors {
                logger.error(
                    "reload rejected; old config stays in force", metadata: ["detail": .string(error.description)])
            }
            server.runtime.recordReload(success: false, at: Date().timeIntervalSince1970)
            return nil
        }
        let refusals = EnvironmentChecks.refusals(in: config)
        if !refusals.isEmpty {
            for refusal in refusals {
                logger.error(
                    "reload rejected; old config stays in force", metadata: ["detail": .string(refusal.description)])
            }
            server.runtime.recordReload(success: false, at: Date().timeIntervalSince1970)
            return nil
        }
        let current = server.runtime.snapshot.config
        if config.keychain != current.keychain {
            // The keychain is opened (or created) once at start; applying half of a change would silently run
            // auth against the old keychain, or without one.
            logger.error(
                "reload rejected; old config stays in force",
                metadata: [
                    "detail": .string("the keychain section changed; restart backstop to use a different keychain")
                ])
            server.runtime.recordReload(success: false, at: Date().timeIntervalSince1970)
            return nil
        }
        if config.spool != current.spool {
            // The queue store and the spool's budget are opened once at start, like the keychain.
            logger.error(
                "reload rejected; old config stays in force",
                metadata: ["detail": .string("the spool section changed; restart backstop to use another spool")])
            server.runtime.recordReload(success: false, at: Date().timeIntervalSince1970)
            return nil
        }
        if config.tokenStore != current.tokenStore {
            // The store's connections are opened once at start, like the keychain.
            logger.error(
                "reload rejected; old config stays in force",
                metadata: [
                    "detail": .string("the token_store section changed; restart backstop to use another token store")
                ])
            server.runtime.recordReload(success: false, at: Date().timeIntervalSince1970)
            return nil
        }
        if config.admin != current.admin {
            logger.warning("admin listener changes take effect on restart")
        }
        if config.limits.maxConnections != current.limits.maxConnections,
            config.listeners.contains(where: current.listeners.contains)
        {
            // A listener's cap is fixed when it is bound; listeners the reload adds use the new one.
            logger.warning("limits.max_connections changes take effect on restart for listeners that stay")
        }
        if config.tracing != server.tracingConfig {
            logger.warning("tracing changes take effect on restart")
        }
        let intercept: InterceptAuthority?
        do {
            intercept = try InterceptAuthority.load(config: config, keychain: server.keychain)
        } catch {
            logger.error("reload rejected; old config stays in force", metadata: ["detail": .string(error.description)])
            server.runtime.recordReload(success: false, at: Date().timeIntervalSince1970)
            return nil
        }
        do throws(ClientPolicyError) {
            _ = try ProxyServer.clientPolicy(for: config, keychain: server.keychain)
        } catch {
            logger.error("reload rejected; old config stays in force", metadata: ["detail": .string(error.description)])
            server.runtime.recordReload(success: false, at: Date().timeIntervalSince1970)
            return nil
        }
        await server.reload(config: config, intercept: intercept)
        // log.level and log.format apply at once; log.access_log with the new snapshot.
        logSettings.apply(config.log)
        server.runtime.recordReload(success: true, at: Date().timeIntervalSince1970)
        logger.notice(
            "config reloaded",
            metadata: [
                "upstreams": .stringConvertible(config.upstreams.count),
                "log_level": .string(config.log.level.rawValue),
                "log_format": .string(config.log.format.rawValue),
            ])
        return config
    }
}

/// Opens (or creates) the keychain before serving, as docs/reference/operations.md#keychain describes.
enum KeychainStartup {
    static func prepare(config: Config, logger: Logger) throws -> FileKeychain? {
        guard let keychain = config.keychain else { return nil }
        let source: KeychainKeySource
        switch keychain.key {
        case .file(let path): source = .file(path: path)
        case .credential(let name): source = .credential(name: name)
        }
        do {
            let opened = try KeychainBootstrap.open(path: keychain.path, key: source)
            switch opened.outcome {
            case .createdKeyAndKeychain:
                logger.notice("created a new keychain and key file", metadata: ["keychain": .string(keychain.path)])
            case .createdKeychain:
                logger.notice("created an empty keychain", metadata: ["keychain": .string(keychain.path)])
            case .openedExisting:
                logger.info(
                    "keychain opened",
                    metadata: [
                        "keychain": .string(keychain.path), "entries": .stringConvertible(opened.entryCount),
                    ])
            }
            return opened.keychain
        } catch {
            logger.error("cannot open the keychain; refusing to start", metadata: ["error": .string(error.description)])
            throw ExitCode(1)
        }
    }
}
