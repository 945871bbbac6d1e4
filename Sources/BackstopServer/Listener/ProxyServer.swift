import BackstopCore
import BackstopIdentity
import BackstopKeychain
import BackstopPeer
import BackstopQueue
import BackstopStatus
import BackstopTracing
import BackstopTransport
import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import NIOPosix

#if canImport(Glibc)
import Glibc
#endif

/// Binds every proxy listener and the admin listener of a config and serves them on one event loop group.
public final class ProxyServer: Sendable {
    public let runtime: ProxyRuntime
    /// The libcurl engine behind `runtime.transport` (its thread is stopped on drain).
    private let curl: CurlMultiTransport
    private let group: MultiThreadedEventLoopGroup
    private let channels: NIOLockedValueBox<[(ListenerConfig, Channel)]>
    private let adminChannel: NIOLockedValueBox<Channel?>
    private let ready = NIOLockedValueBox(false)
    /// The `tracing` section read at start (a reload does not change it).
    public let tracingConfig: TracingConfig?
    /// The span exporter and the token managers' store watchers, run by `run()`.
    private let background = BackgroundWork()
    /// Set by `stopWaitingForRequests()`: the drain stops waiting for requests in flight.
    private let drainCut = OnceFlag()
    /// Reads the host's rtnetlink announcements once `start()` ran (nil before, or when no socket could be opened).
    let networkMonitor = NIOLockedValueBox<NetworkChangeMonitor?>(nil)
    /// The client certificates the config names, as read at start and on the last reload.
    private let clientCertificates = NIOLockedValueBox<[ClientCertificateInventory.Item]>([])

    /// The keychain opened at start (reloads keep it).
    public let keychain: FileKeychain?
    /// Where oauth2 tokens live (reloads keep it).
    public let tokenStores: (any TokenStoreProvider)?
    /// What the token stores did (`backstop_token_store_*`).
    public let tokenStoreMetrics: TokenStoreMetrics
    /// Token refresh outcomes by upstream, for metrics.
    public let tokenRefreshes = TokenRefreshCounters()
    /// Queued deliveries finished, and the spool's budget (`spool.max_bytes`), for metrics; the budget is nil
    /// without a spool.
    public let queueMetrics: QueueMetrics
    private let spoolBudget: SpoolBudget?

    /// How many NIO event loops serve client connections: one per CPU this process may use (NIO's count, which
    /// follows cgroup quotas and cpusets, as nginx's `worker_processes auto` and HAProxy's and Envoy's defaults
    /// do), at most 4 — one transport thread serves them all, and beyond a few loops it is the limit. With one
    /// loop on 2 cores, requests from 256 clients queued behind each other on it (docs/performance.md#event-loops-per-cpu).
    public static var defaultEventLoopThreads: Int { min(max(System.coreCount, 1), 4) }

    /// Creates the runtime for `config` (transport thread included); call `start()` to bind. `keychain` is the
    /// opened keychain when the config has one.
    /// `intercept` is the interception CA for `config` (`InterceptAuthority.load`), when an upstream intercepts.
    /// `tokenStores` keeps oauth2 tokens (default: the keychain). `queue` is the open queue store and the spool's
    /// budget when an upstream has `delivery: queue` (`run` opens them): the server delivers from it.
    public init(
        config: Config, logger: Logger, keychain: FileKeychain? = nil, intercept: InterceptAuthority? = nil,
        tokenStores: (any TokenStoreProvider)? = nil, tokenStoreMetrics: TokenStoreMetrics = TokenStoreMetrics(),
        queue: (store: QueueStore, budget: SpoolBudget)? = nil,
        eventLoopThreads: Int = ProxyServer.defaultEventLoopThreads
    ) {
        self.tokenStoreMetrics = tokenStoreMetrics
        // One budget for spooled bodies and queued deliveries; without a keychain there is no queue, but bodies
        // are still spooled (each under its own key).
        let spoolBudget = queue?.budget ?? config.spool.map { SpoolBudget(limit: $0.maxBytes) }
        self.spoolBudget = spoolBudget
        if queue == nil, let spool = config.spool {
            // The queue's store creates the directory; without one, the spooled bodies need it all the same.
            do throws(QueueError) {
                try QueueStore.createDirectory(spool.directory)
            } catch {
                logger.warning(
                    "cannot create spool.dir; large bodies are not spooled",
                    metadata: ["error": .string(error.description)])
            }
        }
        _ = ProcessMetrics.startTime
        self.group = MultiThreadedEventLoopGroup(numberOfThreads: eventLoopThreads)
        self.keychain = keychain
        let transport = CurlMultiTransport()
        self.curl = transport
        let stores =
            tokenStores
            ?? keychain.map { KeychainTokenStoreProvider(keychain: $0, logger: logger, metrics: tokenStoreMetrics) }
        self.tokenStores = stores
        self.tracingConfig = config.tracing
        var tracer: Tracer?
        if let tracing = config.tracing {
            tracer = Self.makeTracer(
                tracing, fetcher: TransportFetcher(transport: transport, eventLoop: group.next()), logger: logger)
        }
        let clock = SystemClock()
        let outage = OutageMetrics()
        let upstreams = Self.makeUpstreams(
            config, previous: [], keychain: keychain, stores: stores,
            fetcher: TransportFetcher(transport: transport, eventLoop: group.next()), logger: logger,
            counters: tokenRefreshes, tracer: tracer, background: background, clock: clock, outage: outage)
        // The deliverer's private connections are served by this runtime's pipeline, which exists only below.
        let deliveryRuntime = NIOLockedValueBox<ProxyRuntime?>(nil)
        let group = self.group
        let queueMetrics = QueueMetrics()
        self.queueMetrics = queueMetrics
        let deliverer = queue.map { queue in
            QueueDeliverer(
                store: queue.store,
                sender: LoopbackDeliverySender(group: group) { socket in
                    guard let runtime = deliveryRuntime.withLockedValue({ $0 }) else {
                        throw ChannelError.ioOnClosedChannel
                    }
                    try await Self.serveDeliveryConnection(socket, group: group, runtime: runtime)
                },
                lanes: DeliveryLaneSettings.lanes(of: config), metrics: queueMetrics, logger: logger,
                memory: DeliveryMemory(
                    room: {
                        guard let runtime = deliveryRuntime.withLockedValue({ $0 }) else { return 0 }
                        return runtime.snapshot.config.limits.bufferMemory - runtime.keptBodyMemory
                    },
                    take: { bytes in
                        _ = deliveryRuntime.withLockedValue({ $0 })?.reserveBodyMemory(bytes, limit: .max)
                    },
                    give: { bytes in deliveryRuntime.withLockedValue({ $0 })?.releaseBodyMemory(bytes) }))
        }
        let runtime = ProxyRuntime(
            snapshot: ConfigSnapshot(
                config: config, upstreams: upstreams, intercept: intercept,
                clients: Self.clientsInForce(config, keychain: keychain, logger: logger)),
            transport: transport, logger: logger, clock: clock, tracer: tracer, queue: deliverer,
            background: background, outageMetrics: outage,
            bodySpool: config.spool.flatMap { spool in
                spoolBudget.map { BodySpool(directory: spool.directory, budget: $0) }
            })
        self.runtime = runtime
        deliveryRuntime.withLockedValue { $0 = runtime }
        self.channels = NIOLockedValueBox([])
        self.adminChannel = NIOLockedValueBox(nil)
        readClientCertificates(config)
    }

    /// Reads the client certificates `config` names and warns about each that expires within 14 days or cannot be
    /// used (docs/reference/operations.md#logs).
    private func readClientCertificates(_ config: Config) {
        let keychain = self.keychain
        let items = ClientCertificateInventory.read(config) { name in (try? keychain?.entry(name))?.value }
        clientCertificates.withLockedValue { $0 = items }
        let now = Date()
        for item in items {
            var metadata: Logger.Metadata = [
                "upstream": .string(item.upstream), "target": .string(item.target.rawValue),
                "entry": .string(item.entry),
            ]
            if let problem = item.problem {
                metadata["problem"] = .string(problem)
                runtime.logger.warning("client certificate unusable", metadata: metadata)
            } else if let expiry = item.notValidAfter, item.expiresSoon(now: now) {
                metadata["not_after"] = .string(ISO8601Time.format(epochSeconds: expiry.timeIntervalSince1970))
                metadata["days_left"] = .stringConvertible(Int((expiry.timeIntervalSince(now) / 86_400).rounded(.down)))
                runtime.logger.warning("client certificate expires soon", metadata: metadata)
            }
        }
    }

    /// An event loop of the server's group (for timers).
    public var anyEventLoop: EventLoop { group.next() }

    /// Every event loop of the server's group (the systemd watchdog checks that each one still runs).
    public var eventLoops: [EventLoop] { Array(group.makeIterator()) }

    /// The addresses actually bound (ports resolved when the config said 0), in config order.
    public var boundAddresses: [SocketAddress] {
        channels.withLockedValue { $0.compactMap { $0.1.localAddress } }
    }

    /// The admin listener's bound address, if any.
    public var adminAddress: SocketAddress? { adminChannel.withLockedValue { $0?.localAddress } }

    /// Whether `/readyz` answers 200.
    public var isReady: Bool { ready.withLockedValue { $0 } && !runtime.isDraining }

    /// Binds all listeners; throws naming the address that failed.
    public func start() async throws {
        let config = runtime.snapshot.config
        for listener in config.listeners {
            let channel = try await bind(listener, maxConnections: config.limits.maxConnections)
            channels.withLockedValue { $0.append((listener, channel)) }
        }
        if let admin = config.admin {
            let channel = try await bindAdmin(admin, limits: config.limits)
            adminChannel.withLockedValue { $0 = channel }
        }
        updateDestinationGuard()
        if let queue = runtime.tracer?.queue {
            background.spawn { await queue.run() }
        }
        await watchNetworkChanges()
        if let deliverer = runtime.queue {
            background.spawn { await deliverer.run() }
        }
        ready.withLockedValue { $0 = true }
    }

    /// Runs the server's background work (the span exporter, token managers adopting what other instances store)
    /// until `drainAndStop` ends it. Call it alongside `start()`: `backstop run` runs it in its service group.
    public func run() async { await background.run() }

    /// The tracer of a `tracing` section: spans POSTed to its collector through the shared transport, ids seeded
    /// from the system's random source (docs/reference/operations.md#tracing).
    static func makeTracer(_ config: TracingConfig, fetcher: TransportFetcher, logger: Logger) -> Tracer {
        let queue = SpanExportQueue(
            encoder: OTLPEncoder(serviceName: config.serviceName, serviceVersion: BackstopVersion.current),
            sender: OTLPHTTPSender(url: config.exportURL, fetcher: fetcher), logger: logger)
        return Tracer(
            sampleRatio: config.sampleRatio, queue: queue, clock: SystemClock(), seed: UInt64.random(in: .min ... .max))
    }

    /// Tells the transport which addresses are Backstop's own (a connection there is a loop), after every bind.
    private func updateDestinationGuard() {
        var endpoints: [DestinationGuard.Endpoint] = []
        var addresses = channels.withLockedValue { $0.compactMap { $0.1.localAddress } }
        if let admin = adminAddress { addresses.append(admin) }
        for address in addresses {
            guard let port = address.port, let bytes = Self.addressBytes(address) else { continue }
            endpoints.append(DestinationGuard.Endpoint(address: bytes, port: port))
        }
        let guardian = DestinationGuard(ownEndpoints: endpoints, localAddresses: Self.interfaceAddresses())
        curl.setDestinationGuard(guardian)
        runtime.destinationGuard = guardian
    }

    static func addressBytes(_ address: SocketAddress) -> [UInt8]? {
        switch address {
        case .v4(let v4): withUnsafeBytes(of: v4.address.sin_addr.s_addr) { Array($0) }
        case .v6(let v6): withUnsafeBytes(of: v6.address.sin6_addr) { Array($0) }
        case .unixDomainSocket: nil
        }
    }

    /// This host's interface addresses (for listeners bound to a wildcard address).
    static func interfaceAddresses() -> [[UInt8]] {
        let devices = (try? System.enumerateDevices()) ?? []
        return devices.compactMap { $0.address.flatMap(addressBytes) }
    }

    /// Ends a drain's wait for requests in flight now (an operator's second stop signal): what is still in flight
    /// is cut as when `timeout` runs out. Before a drain, the next drain does not wait.
    public func stopWaitingForRequests() { drainCut.set() }

    /// Stops accepting, waits for in-flight requests (up to `timeout`, or until `stopWaitingForRequests()`), then
    /// closes everything.
    public func drainAndStop(timeout: Duration) async {
        runtime.beginDraining()
        // Deliveries in flight are given back untried (sent again after the restart) rather than answered
        // `shutting-down` by the drain.
        runtime.queue?.stop()
        let listening = channels.withLockedValue { $0 }
        for (listener, channel) in listening {
            try? await channel.close()
            if case .unix(let path) = listener.address { unlink(path) }
        }
        let runtime = self.runtime
        let drainCut = self.drainCut
        _ = await withTimeLimit(timeout) {
            await withTaskGroup(of: Void.self) { group in
                group.addTask { await runtime.waitUntilNoRequests() }
                group.addTask { await drainCut.wait() }
                await group.next()
                group.cancelAll()
            }
        }
        // What the drain gave up on is cut now, while the event loops answer it (503 `shutting-down`) and the
        // tracer can still export its spans: cut later, its spans would miss the last export, and its answers could
        // come after the loops shut down. Bounded: what is not in a transfer (a backoff, a token wait) is not waited
        // for beyond a second.
        curl.cutTransfersInFlight()
        _ = await withTimeLimit(.seconds(1)) { await runtime.waitUntilNoRequests() }
        if let admin = adminChannel.withLockedValue({ $0 }) { try? await admin.close() }
        if let monitor = networkMonitor.withLockedValue({ $0 }) { try? await monitor.stop().get() }
        if let queue = runtime.tracer?.queue {
            // The last spans get one try, bounded: a collector that is down must not hold the drain.
            queue.shutdown()
            _ = await withTimeLimit(OTLPHTTPSender.callTimeout) { await queue.waitUntilFinished() }
        }
        for upstream in runtime.snapshot.upstreams {
            if case .oauth2(let manager, _) = upstream.auth { await manager.stop() }
        }
        // What still runs (an export the collector never answered) is cancelled while the transport and the event
        // loops it needs to end are still up; `run()` returns.
        await background.finish()
        await curl.shutdown()
        // Anything the shutdown still cut is answered on its connection's event loop, which must still run then:
        // work scheduled on a loop that is shutting down is refused (a crash in later SwiftNIO versions).
        _ = await withTimeLimit(.seconds(1)) { await runtime.waitUntilNoRequests() }
        try? await group.shutdownGracefully()
    }

    /// The pipeline of a client connection: a request decoder and no response encoder (the proxy handler writes
    /// responses as bytes). What follows a CONNECT head (a TLS ClientHello sent without waiting for the 200) is
    /// handed on to the tunnel when the decoder leaves the pipeline. `delivery`: the deliverer's private connection
    /// (docs/reference/behaviour.md#queued-delivery).
    static func addProxyHandlers(to channel: Channel, runtime: ProxyRuntime, limits: Limits, delivery: Bool) throws {
        let sync = channel.pipeline.syncOperations
        let headTimer = HeadTimeoutHandler(timeout: limits.headerTimeout, now: runtime.clock.monotonic)
        let decoder = ClientRequestDecoder(
            maxHeadBytes: ClientRequestDecoder.maxHeadBytes(limits), forwardsLeftOverBytes: true)
        let proxy = ProxyHandler(
            runtime: runtime, idleTimeout: limits.clientIdleTimeout, headTimer: headTimer, delivery: delivery)
        decoder.deliver(to: proxy)
        try sync.addHandler(headTimer)
        try sync.addHandler(decoder)
        try sync.addHandler(proxy)
    }

    /// Serves the proxy's end of one of the deliverer's socket pairs like an accepted client connection.
    static func serveDeliveryConnection(
        _ socket: NIOBSDSocket.Handle, group: any EventLoopGroup, runtime: ProxyRuntime
    ) async throws {
        let limits = runtime.snapshot.config.limits
        _ = try await ClientBootstrap(group: group).channelInitializer { channel in
            channel.eventLoop.makeCompletedFuture {
                try addProxyHandlers(to: channel, runtime: runtime, limits: limits, delivery: true)
            }
        }.withConnectedSocket(socket).get()
    }

    /// `TCP_NOTSENT_LOWAT` on a TCP client connection: the kernel takes a response's bytes only while fewer than this
    /// wait unsent, and says the socket is writable again once half of them went out. Without it a loopback socket
    /// took ~4.8 MB at once and said nothing until ~1.1 MB had drained: a client reading steadily at 200 KB/s made no
    /// progress Backstop could see for 5 s, and `timeouts.idle` cut it (docs/reference/config.md#timeouts). With it a
    /// steady reader shows progress every 64 KiB, and a stalled one holds less in the kernel. (A unix socket says
    /// writable once three quarters of its smaller buffer is free: nothing to set.)
    static let notSentLowWater = ChannelOptions.Types.SocketOption(
        level: .tcp, name: NIOBSDSocket.Option(rawValue: CInt(TCP_NOTSENT_LOWAT)))
    static let notSentLowWaterBytes: SocketOptionValue = 128 * 1024

    private func bind(_ listener: ListenerConfig, maxConnections: Int) async throws -> Channel {
        let runtime = self.runtime
        let filter = ClientAccessFilter(allowClients: listener.allowClients)
        // One per listener: each holds its own descriptor in reserve.
        let acceptFailures = AcceptFailures(logger: runtime.logger)
        let bootstrap = ServerBootstrap(group: group)
            .serverChannelOption(.backlog, value: 1024)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .serverChannelInitializer { [acceptFailures] channel in
                channel.eventLoop.makeCompletedFuture {
                    let pipeline = channel.pipeline.syncOperations
                    try pipeline.addHandler(acceptFailures.backoffHandler(listener: "\(listener.address)"))
                    try pipeline.addHandler(ConnectionLimiter(limit: maxConnections))
                }
            }
            .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
            .childChannelOption(.maxMessagesPerRead, value: 16)
            .childChannelInitializer { [acceptFailures] channel in
                if let shed = acceptFailures.shed(channel) { return shed }
                guard filter.allows(channel.remoteAddress) else {
                    return channel.close()
                }
                // The limits in force when the connection arrives: a reload's header_timeout, max_header_bytes and
                // client_idle_timeout apply to kept listeners' next connections (max_connections needs a restart).
                let limits = runtime.snapshot.config.limits
                return channel.eventLoop.makeCompletedFuture {
                    try Self.addProxyHandlers(to: channel, runtime: runtime, limits: limits, delivery: false)
                }
            }
        do {
            switch listener.address {
            case .tcp(let host, let port):
                return try await bootstrap.childChannelOption(Self.notSentLowWater, value: Self.notSentLowWaterBytes)
                    .bind(host: host, port: port).get()
            case .unix(let path):
                try UnixListenerPath.ensureNotInUse(path)
                return try await UnixListenerPath.bindPrivately(path) { bindPath in
                    try await bootstrap.bind(unixDomainSocketPath: bindPath, cleanupExistingSocketFile: true).get()
                }
            }
        } catch {
            throw ListenerError(address: listener.address, setting: "listen", error)
        }
    }

    /// The `/metrics` page: request and retry metrics, server state, token expiries, process metrics.
    public func metricsText() -> String {
        var out = PrometheusText()
        out.family("backstop_build_info", .gauge, "Always 1; the version is a label.")
        out.sample("backstop_build_info", ["version": BackstopVersion.current], 1)
        out.family("backstop_client_connections", .gauge, "Client connections open now, over every proxy listener.")
        out.sample("backstop_client_connections", runtime.openClientConnections)
        out.family(
            "backstop_kept_body_bytes", .gauge,
            "Bytes of request bodies kept in memory for retries now (bounded by limits.buffer_memory).")
        out.sample("backstop_kept_body_bytes", runtime.keptBodyMemory)
        let reloads = runtime.reloadCounts
        out.family("backstop_config_reloads_total", .counter, "Config reloads (SIGHUP), by result.")
        out.sample("backstop_config_reloads_total", ["result": "success"], reloads.success)
        out.sample("backstop_config_reloads_total", ["result": "failure"], reloads.failure)
        out.family(
            "backstop_config_last_reload_success_timestamp_seconds", .gauge,
            "When the config was last loaded successfully (start or reload), seconds since the Unix epoch.")
        out.sample(
            "backstop_config_last_reload_success_timestamp_seconds",
            reloads.lastSuccess > 0 ? reloads.lastSuccess : ProcessMetrics.startTime)
        out.family(
            "backstop_token_expiry_timestamp_seconds", .gauge,
            "When the access token in use expires, seconds since the Unix epoch (absent while none is held or it has no expiry)."
        )
        for upstream in runtime.snapshot.upstreams {
            guard case .oauth2(let manager, _) = upstream.auth, let expiry = manager.currentExpiry else { continue }
            out.sample("backstop_token_expiry_timestamp_seconds", ["upstream": upstream.config.name], expiry)
        }
        let dropped = runtime.tracer?.queue.dropped ?? (queueFull: 0, exportFailed: 0)
        out.family(
            "backstop_spans_dropped_total", .counter,
            "Trace spans dropped: the export queue was full, or the collector did not accept their batch.")
        out.sample("backstop_spans_dropped_total", ["reason": "queue-full"], dropped.queueFull)
        out.sample("backstop_spans_dropped_total", ["reason": "export-failed"], dropped.exportFailed)
        out.family("backstop_spans_exported_total", .counter, "Trace spans the collector accepted.")
        out.sample("backstop_spans_exported_total", runtime.tracer?.queue.exported ?? 0)
        out.family(
            "backstop_client_certificate_expiry_seconds", .gauge,
            "Seconds until a configured client certificate expires (negative once expired), by upstream and target.")
        let now = Date()
        for item in clientCertificates.withLockedValue({ $0 }) {
            guard let expiry = item.notValidAfter else { continue }
            out.sample(
                "backstop_client_certificate_expiry_seconds",
                ["upstream": item.upstream, "target": item.target.rawValue],
                Int64(expiry.timeIntervalSince(now)))
        }
        return runtime.metrics.render(
            inflight: runtime.inflightRequests, tokenRefreshes: tokenRefreshes.snapshot,
            keychainWriteErrors: tokenRefreshes.keychainWriteErrorCount) + out.text + runtime.tunnelMetrics.render()
            + runtime.upgradeMetrics.render() + runtime.outageMetrics.render() + tokenStoreMetrics.render()
            + queueMetricsText()
            + ProcessMetrics.render()
    }

    /// The spool and queue families, present with a queue (docs/reference/operations.md#metrics).
    private func queueMetricsText() -> String {
        guard let deliverer = runtime.queue, let spoolBudget else { return "" }
        let queued = runtime.snapshot.config.upstreams.filter { $0.delivery == .queue }.map(\.name)
        return queueMetrics.render(
            queueUpstreams: queued, snapshot: deliverer.snapshot, spoolBytes: spoolBudget.used,
            now: runtime.clock.wall())
    }

    /// The admin listener gets the proxy listeners' protections: `allow_clients`, the connection cap, the idle
    /// timeout and the head timeout of `limits` (a trickled head must not keep health probes out).
    private func bindAdmin(_ admin: AdminConfig, limits: Limits) async throws -> Channel {
        let address = admin.address
        let filter = ClientAccessFilter(allowClients: admin.allowClients)
        let idle = TimeAmount.nanoseconds(limits.clientIdleTimeout.nanosecondsClamped)
        let headTimeout = limits.headerTimeout
        let clock = runtime.clock
        let maxConnections = limits.maxConnections
        let state = AdminState(
            isReady: { [weak self] in self?.isReady ?? false },
            metricsText: { [weak self] in self?.metricsText() ?? "" },
            statusSnapshot: { [weak self] in self?.statusSnapshot() })
        let acceptFailures = AcceptFailures(logger: runtime.logger)
        let bootstrap = ServerBootstrap(group: group)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .serverChannelInitializer { [acceptFailures] channel in
                channel.eventLoop.makeCompletedFuture {
                    let pipeline = channel.pipeline.syncOperations
                    try pipeline.addHandler(acceptFailures.backoffHandler(listener: "\(address)"))
                    try pipeline.addHandler(ConnectionLimiter(limit: maxConnections))
                }
            }
            .childChannelInitializer { [acceptFailures] channel in
                if let shed = acceptFailures.shed(channel) { return shed }
                guard filter.allows(channel.remoteAddress) else {
                    return channel.close()
                }
                return channel.eventLoop.makeCompletedFuture {
                    let sync = channel.pipeline.syncOperations
                    let headTimer = HeadTimeoutHandler(timeout: headTimeout, now: clock.monotonic)
                    try sync.addHandler(IdleStateHandler(readTimeout: idle))
                    try sync.addHandler(headTimer)
                    // No pipelining assistance: its handler traps (debug) on a response written while no request is in
                    // flight, which the 408 for a head that never completed is. The admin handler answers each request
                    // as soon as it ends, so pipelined requests are answered in order without it.
                    try sync.configureHTTPServerPipeline(withPipeliningAssistance: false)
                    try sync.addHandler(AdminHandler(state: state, headTimer: headTimer))
                }
            }
        do {
            switch address {
            case .tcp(let host, let port): return try await bootstrap.bind(host: host, port: port).get()
            case .unix(let path):
                try UnixListenerPath.ensureNotInUse(path)
                return try await UnixListenerPath.bindPrivately(path) { bindPath in
                    try await bootstrap.bind(unixDomainSocketPath: bindPath, cleanupExistingSocketFile: true).get()
                }
            }
        } catch {
            throw ListenerError(address: address, setting: "admin.listen", error)
        }
    }
}

/// A listener could not be bound.
/// A listener that could not be bound: `cannot listen on 127.0.0.1:8080 (listen): Address already in use (errno 98)`.
public struct ListenerError: Error, CustomStringConvertible {
    public var address: ListenAddress
    /// The config key that names the address: `listen` or `admin.listen`.
    public var setting: String
    public var underlying: String

    init(address: ListenAddress, setting: String, _ error: any Error) {
        self.address = address
        self.setting = setting
        // NIO's own text (`bind(descriptor:ptr:bytes:): Address already in use) (errno: 98)`) names its internals.
        if let io = error as? IOError {
            underlying = "\(String(cString: strerror(io.errnoCode))) (errno \(io.errnoCode))"
        } else if error is UnixDomainSocketPathWrongType {
            underlying = "the path exists and is not a socket (left as it is)"
        } else {
            underlying = "\(error)"
        }
    }

    public var description: String { "cannot listen on \(address) (\(setting)): \(underlying)" }
}

extension ProxyServer {
    /// Swaps in a new config for new requests; requests in flight finish on their snapshot. Token managers of
    /// upstreams whose auth section did not change are kept (no needless refresh). Listeners that left the config
    /// stop accepting (their open connections finish), new ones are bound; a listener that cannot be bound is
    /// reported and skipped. The admin listener and `limits.max_connections` of listeners kept need a restart.
    public func reload(config: Config, intercept: InterceptAuthority? = nil) async {
        let previous = runtime.snapshot.upstreams
        let upstreams = Self.makeUpstreams(
            config, previous: previous, keychain: keychain, stores: tokenStores,
            fetcher: TransportFetcher(transport: runtime.transport, eventLoop: group.next()), logger: runtime.logger,
            counters: tokenRefreshes, tracer: runtime.tracer, background: background, clock: runtime.clock,
            outage: runtime.outageMetrics)
        runtime.outageMetrics.keepStates(of: Set(config.upstreams.map(\.name)))
        runtime.swap(
            to: ConfigSnapshot(
                config: config, upstreams: upstreams, intercept: intercept,
                clients: Self.clientsInForce(config, keychain: keychain, logger: runtime.logger)))
        runtime.queue?.update(lanes: DeliveryLaneSettings.lanes(of: config))
        readClientCertificates(config)
        // Managers that were replaced stop adopting tokens from the store.
        for old in previous {
            guard case .oauth2(let manager, _) = old.auth,
                !upstreams.contains(where: {
                    if case .oauth2(let kept, _) = $0.auth { kept === manager } else { false }
                })
            else { continue }
            await manager.stop()
        }

        let current = channels.withLockedValue { $0 }
        for (listener, channel) in current where !config.listeners.contains(listener) {
            try? await channel.close()
            if case .unix(let path) = listener.address { unlink(path) }
            channels.withLockedValue { $0.removeAll { $0.1 === channel } }
            runtime.logger.notice("listener removed", metadata: ["address": .string("\(listener.address)")])
        }
        for listener in config.listeners where !current.contains(where: { $0.0 == listener }) {
            do {
                let channel = try await bind(listener, maxConnections: config.limits.maxConnections)
                channels.withLockedValue { $0.append((listener, channel)) }
                runtime.logger.notice("listener added", metadata: ["address": .string("\(listener.address)")])
            } catch {
                runtime.logger.error("cannot add listener", metadata: ["error": .string("\(error)")])
            }
        }
        updateDestinationGuard()
    }

    /// `clients` resolved with this host's users and groups and the keychain (docs/reference/config.md#clients);
    /// nil without the section. `run` and every reload call it first and refuse a config it throws for.
    public static func clientPolicy(
        for config: Config, keychain: FileKeychain?
    ) throws(ClientPolicyError)
        -> ClientAccessPolicy?
    {
        guard let clients = config.clients else { return nil }
        return try ClientAccessPolicy.resolve(
            clients, user: UnixAccounts.userID(named:), group: UnixAccounts.groupID(named:),
            secret: { name in (try? keychain?.entry(name))?.value })
    }

    /// The policy a snapshot enforces. One that cannot be resolved (a user deleted since `run` checked it) refuses
    /// every client rather than let them all through.
    static func clientsInForce(_ config: Config, keychain: FileKeychain?, logger: Logger) -> ClientAccessPolicy? {
        do throws(ClientPolicyError) {
            return try clientPolicy(for: config, keychain: keychain)
        } catch {
            logger.error(
                "clients cannot be resolved; every client is refused", metadata: ["error": .string(error.description)])
            return ClientAccessPolicy(entries: [])
        }
    }

    static func makeUpstreams(
        _ config: Config, previous: [UpstreamRuntime], keychain: FileKeychain?, stores: (any TokenStoreProvider)?,
        fetcher: TransportFetcher, logger: Logger, counters: TokenRefreshCounters, tracer: Tracer?,
        background: BackgroundWork, clock: any BackstopClock, outage: OutageMetrics
    ) -> [UpstreamRuntime] {
        config.upstreams.map { upstream in
            let old = previous.first { $0.config.name == upstream.name }
            let health = UpstreamHealth.carried(
                old?.health, for: upstream, clock: clock, metrics: outage, logger: logger)
            // Read at every start and reload, so a rotated entry is presented from the reload on; a problem is
            // logged by `readClientCertificates`.
            let identity = upstream.tls.clientCertEntry.map { TokenClientCredentials.clientIdentity($0, keychain) }
            if let old, old.config.auth == upstream.auth {
                return UpstreamRuntime(
                    config: upstream, auth: old.auth, budget: old.budget, clientIdentity: identity, health: health)
            }
            let auth: AuthRuntime
            switch upstream.auth {
            case .none:
                auth = .none
            case .staticToken(let staticConfig):
                guard let keychain else { auth = .none; break }
                auth = .staticToken(StaticTokenSource(keychain: keychain, entry: staticConfig.entry), staticConfig)
            case .awsSigV4(let aws):
                // `check` requires a keychain for any auth; without one nothing could be signed.
                guard let keychain else { auth = .none; break }
                auth = .awsSigV4(SigV4Source(keychain: keychain, config: aws))
            case .oauth2(let oauth):
                guard let stores else { auth = .none; break }
                // The token endpoint's own TLS settings: verification on, the upstream's `tls` never applies.
                let tls = TransportTLSOptions(oauth.tls)
                let manager = TokenManager(
                    upstreamName: upstream.name, config: oauth, store: stores.store(forPrefix: oauth.keychainPrefix),
                    secrets: keychain, fetcher: fetcher, tls: tls, logger: logger, counters: counters,
                    background: background, tracer: tracer)
                background.spawn { await manager.run() }
                auth = .oauth2(manager, oauth)
            }
            return UpstreamRuntime(
                config: upstream, auth: auth, budget: old?.budget, clientIdentity: identity, health: health)
        }
    }
}
