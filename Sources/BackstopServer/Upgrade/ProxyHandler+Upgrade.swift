import BackstopCore
import BackstopTransport
import NIOCore
import NIOHTTP1

/// Upgrade requests (docs/reference/behaviour.md#upgrades): an admitted request that asks for a protocol upgrade,
/// to an upstream that allows them, leaves the HTTP handler: `UpgradeRelay` takes the channel over.
extension ProxyHandler {
    /// Hands the request to an `UpgradeRelay` when it is an upgrade Backstop relays; false leaves it to the
    /// exchange (no upgrade asked for, a passthrough destination, a request with a body, or a transport that
    /// cannot open raw connections), which forwards it without `Upgrade` (a hop-by-hop field).
    func upgradeIfAsked(
        _ head: ClientRequestHead, _ accepted: RequestAdmission.Accepted, clientEntry: String?,
        context: ChannelHandlerContext
    ) -> Bool {
        guard case .upstream(let upstream, let path) = accepted.destination, !accepted.framing.hasBody,
            let upgrade = accepted.upgrade,
            let opener = runtime.transport as? any ConnectionOpening
        else { return false }
        // Admission refuses upgrades to an upstream with `upgrades: false` before this (400 upgrade-not-allowed).
        let now = self.now
        feed { $0.headAdmitted(.upgrade, now: now, into: &$1) }
        cancelTimer()
        let relay = UpgradeRelay(
            request: UpgradeRelay.Request(
                head: head, upstream: upstream, path: path, target: accepted.target, upgrade: upgrade,
                record: AccessRecord.Request(
                    client: clientAddress, method: head.method.rawValue, host: accepted.clientHost,
                    path: accepted.target.path, clientEntry: clientEntry)),
            runtime: runtime, opener: opener, eventLoop: context.eventLoop)
        // The decoder is still delivering this head (its end comes next): change the pipeline once it is done.
        let loopBound = NIOLoopBound((self, relay), eventLoop: context.eventLoop)
        context.eventLoop.execute {
            let (handler, relay) = loopBound.value
            guard let context = handler.context, context.channel.isActive else { return }
            handler.handOverToUpgrade(context, relay: relay)
        }
        return true
    }

    /// Puts the relay where the HTTP decoder was and leaves the pipeline, decoder last: bytes the client sent after
    /// its head reach the relay, which holds them until the upstream has switched protocols.
    private func handOverToUpgrade(_ context: ChannelHandlerContext, relay: UpgradeRelay) {
        let pipeline = context.pipeline.syncOperations
        machine.handedOver()
        do {
            let decoder = try pipeline.handler(type: ClientRequestDecoder.self)
            try pipeline.addHandler(relay, position: .after(decoder))
            pipeline.removeHandler(context: context, promise: nil)
            if let headTimer { pipeline.removeHandler(headTimer, promise: nil) }
            pipeline.removeHandler(decoder, promise: nil)
            relay.start()
        } catch {
            context.close(promise: nil)
        }
    }
}
