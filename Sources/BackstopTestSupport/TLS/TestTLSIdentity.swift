import NIOSSL

/// A server certificate chain and private key (PEM files) for a TLS `TestOrigin`.
public struct TestTLSIdentity: Sendable {
    public let certificatePath: String
    public let keyPath: String
    /// What the origin accepts by ALPN. The origin speaks HTTP/1.1 only: offering `h2` as well makes a client
    /// that takes it fail, which is how a test sees which protocols the client offered.
    public let applicationProtocols: [String]
    /// When set, the origin requires a client certificate issued by this CA (mutual TLS): a handshake without
    /// one, or with another, fails.
    public let clientCAPath: String?

    public init(
        certificatePath: String, keyPath: String, applicationProtocols: [String] = ["http/1.1"],
        clientCAPath: String? = nil
    ) {
        self.certificatePath = certificatePath
        self.keyPath = keyPath
        self.applicationProtocols = applicationProtocols
        self.clientCAPath = clientCAPath
    }

    func makeServerContext() throws -> NIOSSLContext {
        var configuration = TLSConfiguration.makeServerConfiguration(
            certificateChain: try NIOSSLCertificate.fromPEMFile(certificatePath).map { .certificate($0) },
            privateKey: .privateKey(try NIOSSLPrivateKey(file: keyPath, format: .pem))
        )
        configuration.minimumTLSVersion = .tlsv12
        if let clientCAPath {
            configuration.certificateVerification = .noHostnameVerification
            configuration.trustRoots = .file(clientCAPath)
        }
        configuration.applicationProtocols = applicationProtocols
        // Shutting an origin down should not wait for peers that never send close_notify.
        configuration.shutdownTimeout = .seconds(1)
        return try NIOSSLContext(configuration: configuration)
    }
}
