import NIOSSL

/// A server certificate chain and private key (PEM files) for a TLS `TestOrigin`.
public struct TestTLSIdentity: Sendable {
    public let certificatePath: String
    public let keyPath: String

    public init(certificatePath: String, keyPath: String) {
        self.certificatePath = certificatePath
        self.keyPath = keyPath
    }

    func makeServerContext() throws -> NIOSSLContext {
        var configuration = TLSConfiguration.makeServerConfiguration(
            certificateChain: try NIOSSLCertificate.fromPEMFile(certificatePath).map { .certificate($0) },
            privateKey: .privateKey(try NIOSSLPrivateKey(file: keyPath, format: .pem))
        )
        configuration.minimumTLSVersion = .tlsv12
        configuration.applicationProtocols = ["http/1.1"]
        // Shutting an origin down should not wait for peers that never send close_notify.
        configuration.shutdownTimeout = .seconds(1)
        return try NIOSSLContext(configuration: configuration)
    }
}
