import NIOCore

/// Starts upstream transfers and delivers their events, in order and batched, on the requester's event loop.
/// The exchange and the token fetcher depend on this rather than on `CurlMultiTransport`, so unit tests drive them
/// with a scripted transport.
public protocol TransferStarting: AnyObject, Sendable {
    /// `request` is taken: the transfer keeps it without copying its fields.
    func start(
        _ request: consuming TransportRequest, on eventLoop: EventLoop,
        sink: @escaping @Sendable ([TransportEvent]) -> Void
    ) -> any TransferHandle
}

/// One transfer in flight, as its requester controls it.
public protocol TransferHandle: AnyObject, Sendable {
    /// Stops the transfer; a `.failure(.cancelled)` event follows unless it already ended.
    func cancel()
    /// The requester wrote `bytes` of delivered body to its client (backpressure).
    func consumed(_ bytes: Int)
    /// The requester no longer wants the events but lets the transfer finish (connection reuse); it is cancelled
    /// if it has not finished within `limit`.
    func abandon(within limit: Duration)
}
