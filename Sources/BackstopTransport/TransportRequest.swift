import BackstopCore
import NIOCore

/// One upstream attempt as the transport performs it: a fully resolved URL, final headers and a body source.
public struct TransportRequest: Sendable {
    /// Absolute URL (`https://host:port/path?query`), sent byte for byte (curl's path normalisation is off).
    public var url: String
    public var method: String
    /// Headers exactly as they go upstream (hop-by-hop already removed, `Host` already set), as their bytes: the
    /// client's fields are copied from its head, never made into strings.
    public var headers: HeaderFields
    public var body: TransportRequestBody
    public var connectTimeout: Duration
    public var tls: TransportTLSOptions
    /// Whether the request may reach the upstream twice. When false, libcurl must not resend it by itself: a
    /// request sent on a reused connection that dies before any response byte is normally resent on a fresh one
    /// (harmless for GET, a duplicate for a POST the upstream may already have processed).
    public var mayResend: Bool
    /// A passthrough request (`unmatched: passthrough`): the destination guard also refuses link-local and
    /// metadata addresses for it.
    public var passthrough: Bool

    public init(
        url: String, method: String, headers: HeaderFields, body: TransportRequestBody = .empty,
        connectTimeout: Duration = .seconds(2), tls: TransportTLSOptions = TransportTLSOptions(),
        mayResend: Bool = true,
        passthrough: Bool = false
    ) {
        self.mayResend = mayResend
        self.passthrough = passthrough
        self.url = url
        self.method = method
        self.headers = headers
        self.body = body
        self.connectTimeout = connectTimeout
        self.tls = tls
    }
}

/// TLS settings of one transfer.
public struct TransportTLSOptions: Sendable, Hashable {
    public var caFile: String?
    public var insecureSkipVerify: Bool
    /// HTTP/2 offered by ALPN (curl's `CURL_HTTP_VERSION_2TLS`); false (the default) offers HTTP/1.1 only.
    public var http2: Bool
    /// A client certificate to present (mutual TLS); nil: none.
    public var clientIdentity: TransportClientIdentity?
    public init(
        caFile: String? = nil, insecureSkipVerify: Bool = false, http2: Bool = false,
        clientIdentity: TransportClientIdentity? = nil
    ) {
        self.caFile = caFile
        self.insecureSkipVerify = insecureSkipVerify
        self.http2 = http2
        self.clientIdentity = clientIdentity
    }

    /// No CA file, verification on, HTTP/1.1 only and no client certificate: what an idle handle has with only its
    /// fixed options set.
    var isDefault: Bool { caFile == nil && !insecureSkipVerify && !http2 && clientIdentity == nil }

    /// An upstream's `tls` section.
    public init(_ tls: TLSConfig) {
        self.init(caFile: tls.caFile, insecureSkipVerify: tls.insecureSkipVerify, http2: tls.http2)
    }

    /// A token endpoint's `auth.tls` section: verification is always on.
    public init(_ tls: TokenEndpointTLS) {
        self.init(caFile: tls.caFile, insecureSkipVerify: false)
    }
}

/// A client certificate chain and its private key, PEM, handed to curl from memory (`CURLOPT_SSLCERT_BLOB` /
/// `CURLOPT_SSLKEY_BLOB`, copied by curl): never written to a file, not even a temporary one. Curl keys TLS
/// sessions and connection reuse on the certificate, so a connection or session made with one identity never
/// serves a request with another or none.
public struct TransportClientIdentity: Sendable, Hashable, CustomStringConvertible, CustomDebugStringConvertible,
    CustomReflectable
{
    public let certificateChainPEM: [UInt8]
    public let privateKeyPEM: [UInt8]

    public init(certificateChainPEM: [UInt8], privateKeyPEM: [UInt8]) {
        self.certificateChainPEM = certificateChainPEM
        self.privateKeyPEM = privateKeyPEM
    }

    // The key must never reach a log through interpolation of the TLS options.
    public var description: String { "TransportClientIdentity(\(certificateChainPEM.count)-byte chain, key redacted)" }
    public var debugDescription: String { description }
    public var customMirror: Mirror { Mirror(self, children: ["chainBytes": certificateChainPEM.count]) }
}

/// Where an attempt's request body comes from.
public enum TransportRequestBody: Sendable {
    /// No body (no `Content-Length` sent for GET/HEAD-like methods, `Content-Length: 0` otherwise).
    case empty
    /// A complete body held in memory; replayable, so usable for retries.
    case buffered(ByteBuffer)
    /// A body still arriving from the client; can be sent once only.
    case streaming(RequestBodyStream)
}
