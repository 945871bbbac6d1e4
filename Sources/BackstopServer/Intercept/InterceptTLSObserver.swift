import BackstopCore
import Foundation
import Logging
import NIOCore
import NIOSSL
import NIOTLS

/// Sits right behind the TLS handler of an intercepted connection (docs/reference/https-clients.md#interception):
/// decides the ClientHello's name (it must be the `CONNECT` host, or absent), installs the TLS handler with that
/// name's leaf, counts and logs how the handshake ended, and writes the connection's `tunnel` access line when it
/// closes. A client that sends something other than a TLS handshake is logged and closed.
///
/// Event-loop confined, like every handler.
final class InterceptTLSObserver: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer

    enum Outcome: String {
        case pending, established
        case handshakeFailed = "handshake-failed"
        case sniMismatch = "sni-mismatch"
    }

    private let intercepted: InterceptedConnection
    private let authority: InterceptAuthority
    private let runtime: ProxyRuntime
    private let accessLog: Bool
    private let started: Duration
    private var outcome = Outcome.pending
    private var problem: String?
    /// Sees the client's bytes before the TLS handler does, for an alert BoringSSL cannot read.
    private let watcher = ClientRecordWatcher()

    init(intercepted: InterceptedConnection, authority: InterceptAuthority, runtime: ProxyRuntime, accessLog: Bool) {
        self.intercepted = intercepted
        self.authority = authority
        self.runtime = runtime
        self.accessLog = accessLog
        self.started = runtime.clock.monotonic()
    }

    /// The ClientHello reader in front of everything: what it calls once it has read the ClientHello (or found it
    /// is none). Installs the TLS handler for the agreed name before the held bytes are handed on.
    func makeClientHelloHandler(channel: Channel) -> ByteToMessageHandler<ClientHelloNameHandler> {
        let loopBound = NIOLoopBound(self, eventLoop: channel.eventLoop)
        return ByteToMessageHandler(
            ClientHelloNameHandler { answer in
                loopBound.value.nameChosen(answer, channel: channel)
            })
    }

    private func nameChosen(_ answer: ClientHelloServerName, channel: Channel) -> EventLoopFuture<Void> {
        let host = intercepted.target.host
        switch answer {
        case .name(let raw):
            // A fully qualified name with its root dot (`api.example.com.`) names the same host.
            let name = raw.hasSuffix(".") ? String(raw.dropLast()) : raw
            if name.asciiLowercased() != host {
                // No leaf is minted for a name the CONNECT did not ask for.
                let refusal = InterceptRefusal.sniMismatch(sni: String(name.prefix(255)), connect: host)
                refuse(.sniMismatch, refusal, channel)
                return channel.eventLoop.makeFailedFuture(refusal)
            }
        case .unreadable(let why):
            let refusal = InterceptRefusal.unreadableClientHello(why)
            refuse(.handshakeFailed, refusal, channel)
            return channel.eventLoop.makeFailedFuture(refusal)
        case .absent, .notTLS, .needMore:
            // No name: the CONNECT host's. Not TLS at all: the TLS handler says what it is (its reason names).
            break
        }
        // Minting runs on the thread pool; the ClientHello's bytes wait in the reader meanwhile.
        return authority.context(forHost: host, on: channel.eventLoop).assumeIsolated().flatMapThrowing { context in
            let pipeline = channel.pipeline.syncOperations
            try pipeline.addHandler(self.watcher, position: .before(self))
            try pipeline.addHandler(NIOSSLServerHandler(context: context), position: .before(self))
        }.flatMapErrorThrowing { error in
            self.refuse(.handshakeFailed, error, channel)
            throw error
        }.nonisolated()
    }

    private func refuse(_ outcome: Outcome, _ error: any Error, _ channel: Channel) {
        finish(outcome, problem: "\(error)")
        channel.close(promise: nil)
    }

    private func finish(_ outcome: Outcome, problem: String?) {
        guard self.outcome == .pending else { return }
        self.outcome = outcome
        self.problem = problem
        let metric: TunnelMetrics.InterceptResult =
            switch outcome {
            case .established, .pending: .established
            case .handshakeFailed: .handshakeFailed
            case .sniMismatch: .sniMismatch
            }
        runtime.tunnelMetrics.record(metric)
        if outcome != .established {
            runtime.logger.warning(
                "intercepted connection refused",
                metadata: [
                    "client": .string(intercepted.client), "host": .string(intercepted.target.host),
                    "result": .string(outcome.rawValue), "problem": .string(problem ?? "-"),
                ])
        }
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if case TLSUserEvent.handshakeCompleted? = event as? TLSUserEvent {
            finish(.established, problem: nil)
            context.pipeline.syncOperations.removeHandler(watcher, promise: nil)
        }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        guard error is NIOSSLError || error is BoringSSLError || error is InterceptRefusal else {
            context.fireErrorCaught(error)
            return
        }
        if outcome == .pending {
            finish(.handshakeFailed, problem: clientAlert ?? Self.describe(error))
        }
        // After the handshake, TLS errors (a client that closes without close_notify) end the connection quietly.
        context.close(promise: nil)
    }

    func channelInactive(context: ChannelHandlerContext) {
        if outcome == .pending {
            finish(.handshakeFailed, problem: clientAlert ?? Self.closedDuringHandshake)
        }
        if accessLog {
            var metadata: Logger.Metadata = [
                "mode": .string("intercept"),
                "client": .string(intercepted.client),
                "host": .string(intercepted.target.host),
                "port": .stringConvertible(intercepted.target.port),
                "upstream": .string(intercepted.upstreamName),
                "result": .string(outcome.rawValue),
                "ms": .stringConvertible(Milliseconds(runtime.clock.monotonic() - started)),
            ]
            if let entry = intercepted.clientEntry { metadata["client_entry"] = .string(entry) }
            runtime.logger.info("tunnel", metadata: metadata)
        }
        context.fireChannelInactive()
    }

    /// The alert the client sent in plaintext, by BoringSSL's name for it (`TLSV1_ALERT_UNKNOWN_CA`).
    private var clientAlert: String? { watcher.scanner.alert.map(TLSAlertScanner.name(ofAlert:)) }

    /// BoringSSL's reason names, without its error codes and source paths: `TLSV1_ALERT_UNKNOWN_CA`,
    /// `WRONG_VERSION_NUMBER`, `HTTP_REQUEST`; another error's own description.
    static let closedDuringHandshake =
        "the connection closed before the TLS handshake ended (by the client, or after limits.client_idle_timeout)"

    static func describe(_ error: any Error) -> String {
        let text = "\(error)"
        let reasons = TLSAlertScanner.reasonNames(in: text)
        if !reasons.isEmpty { return reasons.joined(separator: ",") }
        // BoringSSL's own words for a client that closed without an alert, inside NIO's error dump.
        if text.contains("EOF during handshake") { return closedDuringHandshake }
        return text.count > 300 ? String(text.prefix(300)) + "…" : text
    }
}

/// Hands what the client sends to a `TLSAlertScanner`, in front of the TLS handler, until the handshake ends.
/// Event-loop confined, like every handler.
final class ClientRecordWatcher: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer

    private(set) var scanner = TLSAlertScanner()

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        scanner.scan(unwrapInboundIn(data).readableBytesView)
        context.fireChannelRead(data)
    }
}
