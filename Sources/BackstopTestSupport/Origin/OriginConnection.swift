import NIOCore
import NIOHTTP1

/// Serves the requests of one accepted TCP connection, strictly one at a time (pipelined requests wait in the
/// inbound stream until the previous response is written).
struct OriginConnection {
    let id: Int
    let channel: NIOAsyncChannel<HTTPServerRequestPart, Never>
    let state: OriginState
    let script: TestOrigin.Script
    let sendsContinue: Bool

    private struct PendingRequest {
        let index: Int
        let head: HTTPRequestHead
        let arrivedAt: ContinuousClock.Instant
        var body: [UInt8] = []
    }

    func serve() async {
        do {
            try await channel.executeThenClose { inbound in
                try await serveRequests(inbound)
            }
        } catch {
            // Resets, client aborts and decode errors are what these tests provoke; the connection just ends (its
            // socket's close takes it off `OriginState`'s open connections).
        }
    }

    private func serveRequests(_ inbound: NIOAsyncChannelInboundStream<HTTPServerRequestPart>) async throws {
        var pending: PendingRequest?
        var hung = false
        for try await part in inbound {
            if hung {
                continue
            }
            switch part {
            case .head(let head):
                pending = PendingRequest(index: state.takeRequestIndex(), head: head, arrivedAt: .now)
                if sendsContinue && Self.expectsContinue(head) {
                    try await writeContinue()
                }
            case .body(let buffer):
                pending?.body.append(contentsOf: buffer.readableBytesView)
            case .end:
                guard let finished = pending else { continue }
                pending = nil
                let request = record(finished)
                let responder = OriginResponder(channel: channel.channel, request: request, state: state)
                switch try await responder.perform(script(request)) {
                case .keepAlive:
                    continue
                case .close:
                    return
                case .hang:
                    hung = true
                }
            }
        }
    }

    private func record(_ pending: PendingRequest) -> RecordedRequest {
        let request = RecordedRequest(
            index: pending.index,
            method: pending.head.method.rawValue,
            uri: pending.head.uri,
            version: "HTTP/\(pending.head.version.major).\(pending.head.version.minor)",
            headers: pending.head.headers.map { (name: $0.name, value: $0.value) },
            body: pending.body,
            connectionID: id,
            arrivedAt: pending.arrivedAt
        )
        state.record(request)
        return request
    }

    /// curl waits up to a second for `100 Continue` before sending a large upload; answering at once keeps
    /// upload tests fast.
    private static func expectsContinue(_ head: HTTPRequestHead) -> Bool {
        head.version == .http1_1
            && head.headers["expect"].contains { $0.lowercased() == "100-continue" }
    }

    private func writeContinue() async throws {
        var buffer = channel.channel.allocator.buffer(capacity: 25)
        buffer.writeStaticString("HTTP/1.1 100 Continue\r\n\r\n")
        try await channel.channel.writeAndFlush(buffer)
    }
}
