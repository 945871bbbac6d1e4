/// PEM files of a generated test CA and a `localhost` / `127.0.0.1` server certificate it signed.
public struct TestCertificateSet: Sendable {
    /// The CA certificate: the trust root a client needs (`curl --cacert`, `CURLOPT_CAINFO`).
    public let caCertPath: String
    public let caKeyPath: String
    public let serverCertPath: String
    public let serverKeyPath: String

    public init(caCertPath: String, caKeyPath: String, serverCertPath: String, serverKeyPath: String) {
        self.caCertPath = caCertPath
        self.caKeyPath = caKeyPath
        self.serverCertPath = serverCertPath
        self.serverKeyPath = serverKeyPath
    }

    /// The server certificate and key, ready for `TestOrigin.start(tls:)`.
    public var serverIdentity: TestTLSIdentity {
        TestTLSIdentity(certificatePath: serverCertPath, keyPath: serverKeyPath)
    }

    /// The server certificate and key, requiring client certificates issued by `clientCAPath` (mutual TLS).
    public func serverIdentity(requiringClientCertificatesFrom clientCAPath: String) -> TestTLSIdentity {
        TestTLSIdentity(certificatePath: serverCertPath, keyPath: serverKeyPath, clientCAPath: clientCAPath)
    }
}
