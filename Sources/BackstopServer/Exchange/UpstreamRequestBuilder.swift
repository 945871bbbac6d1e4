import BackstopCore
import BackstopTransport
import NIOCore
import NIOHTTP1

/// Where an exchange sends its attempts.
enum ExchangeDestination {
    case upstream(UpstreamRuntime, path: String)
    /// `unmatched: passthrough`: the request's own URL, no retry, no auth.
    case passthrough(url: String)

    var upstream: UpstreamRuntime? {
        if case .upstream(let upstream, _) = self { return upstream }
        return nil
    }

    /// The upstream's name for logs and metrics; `-` for passthrough.
    var name: String { upstream?.config.name ?? "-" }

    /// Where attempts go, `scheme://host[:port]` (the request's own URL for passthrough), for the status page.
    var endpoint: String {
        switch self {
        case .upstream(let upstream, _): upstream.origin
        case .passthrough(let url): Self.origin(of: url)
        }
    }

    /// `scheme://authority` of an absolute URL: no path or query (they may carry what is not ours to show).
    static func origin(of url: String) -> String {
        guard let schemeEnd = url.range(of: "://") else { return url }
        let rest = url[schemeEnd.upperBound...]
        let end = rest.firstIndex { $0 == "/" || $0 == "?" || $0 == "#" } ?? rest.endIndex
        return String(url[..<end])
    }
}

/// Builds the transport request of one attempt from the client's head (docs/reference/behaviour.md#forwarding):
/// the upstream URL, the rewritten headers with the credential injected, TLS and connect timeout.
enum UpstreamRequestBuilder {
    static func request(
        head: HTTPRequestHead, destination: ExchangeDestination, credential: ExchangeStateMachine.Credential,
        body: TransportRequestBody, mayResend: Bool, connectTimeout: Duration
    ) -> TransportRequest {
        var pairs: [(name: String, value: String)] = []
        pairs.reserveCapacity(head.headers.count)
        for (name, value) in head.headers { pairs.append((name: name, value: value)) }
        let url: String
        let hostHeader: String
        var tls = TransportTLSOptions()
        var passthrough = false
        switch destination {
        case .upstream(let upstream, let path):
            url = upstream.origin + path
            hostHeader = upstream.hostHeader
            tls = upstream.tls
        case .passthrough(let passthroughURL):
            url = passthroughURL
            hostHeader = authority(of: passthroughURL) ?? head.headers.first(name: "host") ?? ""
            passthrough = true
        }
        var headers = HeaderRewriter.upstreamRequestHeaders(pairs, upstreamHost: hostHeader)
        if let injection = destination.upstream?.auth.injection, let secret = credential.secret {
            let value = injection.scheme.isEmpty ? secret : "\(injection.scheme) \(secret)"
            let clientSent = headers.contains { $0.name.caseInsensitiveEquals(injection.header) }
            if injection.policy == .replace || !clientSent {
                headers.removeAll { $0.name.caseInsensitiveEquals(injection.header) }
                headers.append((name: injection.header, value: value))
            }
        }
        return TransportRequest(
            url: url, method: head.method.rawValue, headers: headers, body: body, connectTimeout: connectTimeout,
            tls: tls, mayResend: mayResend, passthrough: passthrough)
    }

    /// `http://host:port/path` → `host:port`.
    static func authority(of url: String) -> String? {
        guard let schemeEnd = url.range(of: "://") else { return nil }
        let rest = url[schemeEnd.upperBound...]
        let end = rest.firstIndex { $0 == "/" || $0 == "?" } ?? rest.endIndex
        return String(rest[..<end])
    }
}

extension ExchangeStateMachine.Credential {
    /// The value that goes into the auth header.
    var secret: String? {
        switch self {
        case .none: nil
        case .value(let value): value
        case .token(let token): token.value
        }
    }
}
