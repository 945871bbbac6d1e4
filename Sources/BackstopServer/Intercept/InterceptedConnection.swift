import BackstopCore

/// The `CONNECT` an intercepted connection came from: every request inside it is handled as an absolute-form
/// `https://host/…` request for the intercepting upstream (docs/reference/https-clients.md#interception).
struct InterceptedConnection {
    let target: ConnectTarget
    let upstreamName: String
    /// The client's address, for access lines (the channel is already active when this handler is added).
    let client: String
}
