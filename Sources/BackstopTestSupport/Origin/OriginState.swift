import NIOConcurrencyHelpers
import NIOCore

/// Everything a `TestOrigin` shares between its connections and the test, behind one lock.
final class OriginState: Sendable {
    private struct Inner {
        var nextRequestIndex = 0
        var acceptedConnections = 0
        /// Sorted by `index`: requests can complete out of head order across connections.
        var requests: [RecordedRequest] = []
        /// Requests recorded, kept or not.
        var recorded = 0
        var openConnections: [Int: any Channel] = [:]
        var isShutDown = false
        var bodyBytesSent = 0
    }

    private let inner = NIOLockedValueBox(Inner())
    /// Whether requests are kept for `requests` (a long soak keeps only the count: memory stays flat).
    let keepsRequests: Bool

    init(keepsRequests: Bool = true) { self.keepsRequests = keepsRequests }

    var requests: [RecordedRequest] {
        inner.withLockedValue { $0.requests }
    }

    var requestCount: Int {
        inner.withLockedValue { $0.recorded }
    }

    var connectionCount: Int {
        inner.withLockedValue { $0.acceptedConnections }
    }

    var openConnectionCount: Int {
        inner.withLockedValue { $0.openConnections.count }
    }

    var bodyBytesSent: Int {
        inner.withLockedValue { $0.bodyBytesSent }
    }

    func addBodyBytesSent(_ count: Int) {
        inner.withLockedValue { $0.bodyBytesSent += count }
    }

    /// Returns the connection's id, or nil when the origin is already shutting down (the caller closes it). The
    /// connection counts as open until its socket closes, whoever closes it: a script that is still waiting (`.delay`)
    /// does not notice the proxy closing it, and would otherwise keep it counted until its wait is over.
    func registerConnection(_ channel: any Channel) -> Int? {
        let id: Int? = inner.withLockedValue { state in
            guard !state.isShutDown else { return nil }
            state.acceptedConnections += 1
            let id = state.acceptedConnections
            state.openConnections[id] = channel
            return id
        }
        // Outside the lock: on a channel already closed, the callback runs at once.
        if let id { channel.closeFuture.whenComplete { _ in self.unregisterConnection(id) } }
        return id
    }

    private func unregisterConnection(_ id: Int) {
        _ = inner.withLockedValue { $0.openConnections.removeValue(forKey: id) }
    }

    func takeRequestIndex() -> Int {
        inner.withLockedValue { state in
            defer { state.nextRequestIndex += 1 }
            return state.nextRequestIndex
        }
    }

    func record(_ request: RecordedRequest) {
        inner.withLockedValue { state in
            state.recorded += 1
            guard keepsRequests else { return }
            let position = state.requests.lastIndex { $0.index < request.index }.map { $0 + 1 } ?? 0
            state.requests.insert(request, at: position)
        }
    }

    /// Marks the origin as shut down and hands back the connections still open, for the caller to close.
    func beginShutdown() -> [any Channel] {
        inner.withLockedValue { state in
            state.isShutDown = true
            return Array(state.openConnections.values)
        }
    }
}
