import BackstopCore
import BackstopIdentity
import BackstopTransport
import Foundation
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
/// the upstream URL, the rewritten headers with the credential injected (or the attempt signed), TLS and connect
/// timeout. `wall` is the attempt's time (seconds since 1970): a SigV4 signature is dated with it.
enum UpstreamRequestBuilder {
    /// `endpoint`: the index of the upstream endpoint the attempt was given (nil: the first).
    static func request(
        head: ClientRequestHead, destination: ExchangeDestination, credential: ExchangeStateMachine.Credential,
        body: TransportRequestBody, mayResend: Bool, connectTimeout: Duration, wall: Double, endpoint: Int? = nil
    ) -> TransportRequest {
        let url: String
        let hostHeader: String
        var tls = TransportTLSOptions()
        var passthrough = false
        var signing: (source: SigV4Source, target: String)?
        switch destination {
        case .upstream(let upstream, var path):
            if case .awsSigV4(let source) = upstream.auth {
                // A signed request goes with its target in AWS's encoding: what is signed is then what is sent.
                path = source.signer.wireTarget(path)
                signing = (source, path)
            }
            if let endpoint, upstream.endpointOrigins.indices.contains(endpoint) {
                url = upstream.endpointOrigins[endpoint] + path
                hostHeader = upstream.endpointHostHeaders[endpoint]
            } else {
                url = upstream.origin + path
                hostHeader = upstream.hostHeader
            }
            tls = upstream.tls
        case .passthrough(let passthroughURL):
            url = passthroughURL
            hostHeader = authority(of: passthroughURL) ?? head.headers.first(name: "host") ?? ""
            passthrough = true
        }
        let injected = credential.secret.flatMap { destination.upstream?.credentialHeader?.header(for: $0) }
        var headers = HeaderRewriter.upstreamRequestHeaders(head.headers, upstreamHost: hostHeader, injecting: injected)
        if case .aws(let credentials) = credential, let (source, target) = signing {
            sign(
                &headers, signer: source.signer, payload: source.payload, credentials: credentials,
                method: head.method.rawValue, path: target, host: hostHeader, body: body, wall: wall)
        }
        return TransportRequest(
            url: url, method: head.method.rawValue, headers: headers, body: body, connectTimeout: connectTimeout,
            tls: tls, mayResend: mayResend, passthrough: passthrough)
    }

    /// Signs the attempt (docs/reference/aws-sigv4.md): the path and query as sent, the `Host` sent, the body's hash
    /// (or `UNSIGNED-PAYLOAD`), the client's `x-amz-*` headers; the signature's headers replace any the client sent
    /// under those names (`Authorization` included), and a client's `x-amz-security-token` is dropped.
    static func sign(
        _ headers: inout HeaderFields, signer: SigV4Signer, payload signing: AWSPayloadSigning,
        credentials: SigV4Credentials, method: String, path: String, host: String, body: TransportRequestBody,
        wall: Double
    ) {
        let payload: SigV4Signer.Payload
        switch (signing, body) {
        case (.unsigned, _): payload = .unsigned
        case (.signed, .empty): payload = .signed([UInt8]())
        case (.signed, .buffered(let buffer)):
            payload = buffer.withUnsafeReadableBytes { SigV4Signer.Payload.signed($0) }
        case (.signed, .streaming):
            // Never: the exchange refuses a body it cannot keep (413) when the payload is signed. Were one to stream,
            // the empty body's hash makes the upstream refuse it, rather than take an unsigned body.
            payload = .signed([UInt8]())
        }
        let query = path.firstIndex(of: "?")
        var clientHeaders: [(name: String, value: String)] = []
        for index in headers.indices where headers.nameCount(at: index) > 6 {
            // Only an `x-amz-` name is lowercased (a string per field of every signed request otherwise).
            let first = headers.withName(at: index) { $0.first }
            guard first == UInt8(ascii: "x") || first == UInt8(ascii: "X") else { continue }
            let name = headers.name(at: index).lowercased()
            if SigV4Signer.signsClientHeader(named: name) { clientHeaders.append((name, headers.value(at: index))) }
        }
        let signature = signer.sign(
            SigV4Signer.Request(
                method: method, path: query.map { String(path[..<$0]) } ?? path,
                query: query.map { String(path[path.index(after: $0)...]) }, host: host),
            payload: payload, credentials: credentials, date: Int64(wall.rounded(.down)), clientHeaders: clientHeaders)
        for name in SigV4Signer.ownHeaderNames { headers.remove(name: name) }
        for header in signature.headers { headers.remove(name: header.name) }
        for header in signature.headers { headers.append(name: header.name, value: header.value) }
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
        case .aws: nil
        }
    }
}
