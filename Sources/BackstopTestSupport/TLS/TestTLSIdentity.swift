import NIOSSL

/// A server certificate chain and private key (PEM files) for a TLS `TestOrigin`.
public struct TestTLSIdentity: Sendable {
    public let certificatePath: String
    public let keyPath: String
    /// What the origin accepts by ALPN. The origin speaks HTTP/1.1 only: offering `h2` as well makes a client
    /// that takes it fail, which is how a test sees which protocols the client offered.
    public let applicationProtocols: [String]

    public init(certificatePath: String, keyPath: String, applicationProtocols: [String] = ["http/1.1"]) {
        self.certificatePath = certificatePath
        self.keyPath = keyPath
        self.applicationProtocols = applicationProtocols
    }

    func makeServerContext() throws -> NIOSSLContext {
        var configuration = TLSConfiguration.makeServerConfiguration(
            certificateChain: try NIOSSLCertificate.fromPEMFile(certificatePath).map { .certificate($0) },
            privateKey: .privateKey(try NIOSSLPrivateKey(file: keyPath, format: .pem))
        )
        configuration.minimumTLSVersion = .tlsv12
        configuration.applicationProtocols = applicationProtocols
        // Shutting an origin down should not wait for peers that never send close_notify.
        configuration.shutdownTimeout = .seconds(1)
        return try NIOSSLContext(configuration: configuration)
    }
}
