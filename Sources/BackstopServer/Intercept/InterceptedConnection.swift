import BackstopCore

/// The `CONNECT` an intercepted connection came from: every request inside it is handled as an absolute-form
/// `https://host/…` request for the intercepting upstream (docs/reference/https-clients.md#interception).
struct InterceptedConnection: CustomStringConvertible, CustomReflectable {
    let target: ConnectTarget
    let upstreamName: String
    /// The client's address, for access lines (the channel is already active when this handler is added).
    let client: String
    /// The `clients` entry that allowed the `CONNECT`, for access lines.
    var clientEntry: String? = nil
    /// The `CONNECT`'s `Proxy-Authorization`: requests inside are decided with it (clients send it on the `CONNECT`
    /// only). Never logged: the description leaves it out.
    var proxyAuthorization: String? = nil

    var description: String {
        "InterceptedConnection(\(target.host):\(target.port), upstream \(upstreamName), \(client))"
    }
    var customMirror: Mirror { Mirror(self, children: ["description": description]) }
}
