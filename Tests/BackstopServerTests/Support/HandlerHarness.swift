import BackstopCore
import BackstopTestSupport
import BackstopTransport
import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
import NIOHTTP1
import NIOPosix
import Testing

@testable import BackstopServer

/// Where a handler test runs: the same test, written once against `HandlerHarness`, runs in an `EmbeddedChannel`
/// (no sockets, no threads, time moved by hand) and live (a loopback listener with the daemon's pipeline, a real
/// client socket, the event loop's own thread and clock). Tests that move time run embedded only.
enum HandlerHarnessMode: String, CaseIterable, CustomTestStringConvertible, Sendable {
    case embedded, live
    var testDescription: String { rawValue }

    /// A harness of this mode serving `yaml` (upstreams and limits; version and listen are added).
    func harness(_ yaml: String) throws -> any HandlerHarness {
        switch self {
        case .embedded: try EmbeddedHandlerHarness(yaml)
        case .live: try LiveHandlerHarness(yaml)
        }
    }
}

/// One client connection to a `ProxyHandler` whose transfers the test starts and answers (`ScriptedTransport`).
/// Every wait is bounded (`HandlerHarnessLimits.wait`); embedded waits return at once.
protocol HandlerHarness {
    var transport: ScriptedTransport { get }
    /// Sends bytes from the client.
    func send(_ text: String) throws
    /// What the client received since the last call; live, waits until `complete` holds of it (or the wait ends).
    func output(until complete: (String) -> Bool) throws -> String
    /// Waits until `count` transfers were started; whether they were.
    func waitForTransfers(_ count: Int) -> Bool
    /// Waits until the proxy closed the client connection; whether it did.
    func waitForClose() -> Bool
    /// The client goes away.
    func disconnect() throws
    /// Runs what the proxy has to do (the event loop's queued work): embedded only; live, the loop runs by itself.
    func runPending()
}

extension HandlerHarness {
    func output() throws -> String { try output(until: { _ in true }) }

    /// Answers transfer `index` with a complete response.
    func answer(_ index: Int, status: Int = 200, body: String = "ok", contentLength: Bool = true) {
        deliver(
            index,
            [
                .head(UpstreamResponseHead(status: status, contentLength: contentLength ? body.utf8.count : nil)),
                .body(ByteBuffer(string: body)), .end,
            ])
    }

    /// Delivers `events` to transfer `index`'s exchange.
    func deliver(_ index: Int, _ events: [TransportEvent]) {
        transport.transfers[index].deliver(events)
        runPending()
    }

    /// Waits until `condition` holds (live: checked every millisecond for up to `HandlerHarnessLimits.wait`).
    func eventually(_ condition: () -> Bool) -> Bool {
        Poll.holdsBlocking(within: HandlerHarnessLimits.wait, condition)
    }
}

/// Whether `text` holds a whole response with a `Content-Length` (head and that many body bytes).
func isWholeResponse(_ text: String) -> Bool {
    let bytes = Array(text.utf8)
    guard let end = text.range(of: "\r\n\r\n") else { return false }
    let head = text[..<end.lowerBound].lowercased()
    guard let line = head.split(separator: "\r\n").first(where: { $0.hasPrefix("content-length:") }),
        let length = Int(line.dropFirst("content-length:".count).trimmingCharacters(in: .whitespaces))
    else { return false }
    return bytes.count - text[..<end.upperBound].utf8.count >= length
}

enum HandlerHarnessLimits {
    /// The longest a live harness waits for anything.
    static let wait = Duration.seconds(5)
}

/// The config a harness serves.
private func harnessConfig(_ yaml: String) throws -> Config {
    try ConfigLoader.parse(yaml: "version: 1\nlisten: [127.0.0.1:0]\n" + yaml, file: "t.yaml", baseDirectory: "/")
}

private func harnessRuntime(_ config: Config, transport: ScriptedTransport, clock: any BackstopClock) -> ProxyRuntime {
    let upstreams = config.upstreams.map { UpstreamRuntime(config: $0, auth: .none) }
    return ProxyRuntime(
        snapshot: ConfigSnapshot(config: config, upstreams: upstreams), transport: transport,
        logger: Logger(label: "test") { _ in SwiftLogNoOpLogHandler() }, clock: clock)
}

/// A transport that records each transfer and lets the test answer it. Like curl's, a transfer holds its event sink
/// and the transport keeps no strong reference once it is started: when the exchange lets go of it, it is gone (a
/// leak shows as a transfer still alive after its exchange ended).
final class ScriptedTransport: TransferStarting, Sendable {
    struct Started {
        let request: TransportRequest
        let eventLoop: any EventLoop
        weak var transfer: ScriptedTransfer?
        var handle: ScriptedTransfer { transfer! }

        /// Delivers `events` as the transport does: on the requester's event loop.
        func deliver(_ events: [TransportEvent]) {
            let sink = handle.sink
            eventLoop.execute { sink(events) }
        }
    }

    private let started = NIOLockedValueBox<[Started]>([])
    var transfers: [Started] { started.withLockedValue { $0 } }

    func start(
        _ request: TransportRequest, on eventLoop: EventLoop,
        sink: @escaping @Sendable ([TransportEvent]) -> Void
    ) -> any TransferHandle {
        let handle = ScriptedTransfer(sink: sink)
        started.withLockedValue { $0.append(Started(request: request, eventLoop: eventLoop, transfer: handle)) }
        return handle
    }
}

final class ScriptedTransfer: TransferHandle, Sendable {
    let sink: @Sendable ([TransportEvent]) -> Void
    private let state = NIOLockedValueBox((cancelled: false, consumed: 0, abandoned: nil as Duration?))
    init(sink: @escaping @Sendable ([TransportEvent]) -> Void) { self.sink = sink }
    var cancelled: Bool { state.withLockedValue { $0.cancelled } }
    var abandoned: Duration? { state.withLockedValue { $0.abandoned } }
    func cancel() { state.withLockedValue { $0.cancelled = true } }
    func consumed(_ bytes: Int) { state.withLockedValue { $0.consumed += bytes } }
    func abandon(within limit: Duration) { state.withLockedValue { $0.abandoned = limit } }
}

/// The request decoder and a proxy handler in an `EmbeddedChannel`, on a manual clock.
struct EmbeddedHandlerHarness: HandlerHarness {
    let channel: EmbeddedChannel
    let transport = ScriptedTransport()
    let clock = ManualClock()

    init(_ yaml: String) throws {
        let config = try harnessConfig(yaml)
        let runtime = harnessRuntime(config, transport: transport, clock: clock)
        channel = EmbeddedChannel()
        // The daemon's own pipeline: the decoder hands parts to the proxy handler directly.
        try ProxyServer.addProxyHandlers(to: channel, runtime: runtime, limits: config.limits, delivery: false)
        // Connecting makes the channel active, as an accepted one is.
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 40000)).wait()
    }

    func send(_ text: String) throws { try channel.writeInbound(ByteBuffer(string: text)) }

    func output(until complete: (String) -> Bool) throws -> String {
        var text = ""
        while let buffer = try channel.readOutbound(as: ByteBuffer.self) { text += String(buffer: buffer) }
        return text
    }

    func waitForTransfers(_ count: Int) -> Bool { transport.transfers.count >= count }
    func waitForClose() -> Bool { !channel.isActive }
    func disconnect() throws { _ = try channel.finish(acceptAlreadyClosed: true) }
    func runPending() { channel.embeddedEventLoop.run() }

    /// Moves the manual clock and the event loop's time together.
    func advance(by amount: Duration) {
        clock.advance(by: amount)
        channel.embeddedEventLoop.advanceTime(by: .nanoseconds(amount.nanosecondsClamped))
    }
}

/// The daemon's client pipeline (`ProxyServer.addProxyHandlers`) behind a listener on 127.0.0.1, reached over a
/// real socket; the event loop runs on its own thread with the system clock.
final class LiveHandlerHarness: HandlerHarness {
    let transport = ScriptedTransport()
    private let server: Channel
    private let client: BlockingSocket

    init(_ yaml: String) throws {
        let config = try harnessConfig(yaml)
        let runtime = harnessRuntime(config, transport: transport, clock: SystemClock())
        let limits = config.limits
        server = try ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try ProxyServer.addProxyHandlers(to: channel, runtime: runtime, limits: limits, delivery: false)
                }
            }
            .bind(host: "127.0.0.1", port: 0).wait()
        client = try BlockingSocket(port: server.localAddress?.port ?? 0)
    }

    deinit { try? server.close().wait() }

    func send(_ text: String) throws {
        guard client.send(text) else { throw RawHTTPError.connectFailed("the proxy closed the connection") }
    }

    func output(until complete: (String) -> Bool) throws -> String {
        let deadline = ContinuousClock.now + HandlerHarnessLimits.wait
        var text = String(decoding: client.received, as: UTF8.self)
        while !complete(text), ContinuousClock.now < deadline {
            guard client.waitForData(timeout: deadline - ContinuousClock.now) == .data else { break }
            text = String(decoding: client.received, as: UTF8.self)
        }
        client.clear()
        return text
    }

    func waitForTransfers(_ count: Int) -> Bool { eventually { transport.transfers.count >= count } }

    func waitForClose() -> Bool {
        let deadline = ContinuousClock.now + HandlerHarnessLimits.wait
        while ContinuousClock.now < deadline {
            if client.waitForData(timeout: deadline - ContinuousClock.now) == .closed { return true }
        }
        return false
    }

    func disconnect() throws {
        guard shutdown(client.fd, Int32(SHUT_RDWR)) == 0 else {
            throw RawHTTPError.connectFailed("shutdown: errno \(errno)")
        }
    }
    func runPending() {}
}
