import BackstopCore
import Crypto
import _CryptoExtras

/// Signs `private_key_jwt` client assertions (RFC 7523 §2.2, OpenID Connect Core §9): `iss` = `sub` = the client
/// id, `aud` = the token endpoint URL, a unique `jti`, `iat`, and `exp` `lifetime` seconds later. ES256 for a P-256
/// key (JOSE's raw `r || s` signature, RFC 7518 §3.4), RS256 for RSA (PKCS #1 v1.5 with SHA-256). Time and the
/// `jti`'s randomness come from the caller, so tests know every claim.
public struct ClientAssertionSigner: Sendable {
    /// The JWS `alg`.
    public enum Algorithm: String, Sendable {
        case es256 = "ES256"
        case rs256 = "RS256"
    }

    /// `exp - iat`: well inside the 5 minutes the spec allows, and short enough that a captured assertion is
    /// worthless soon.
    public static let lifetime: Int64 = 60

    public let algorithm: Algorithm
    public let keyID: String?
    private let key: ClientPrivateKey

    public init(key: ClientPrivateKey, keyID: String?) throws(ClientIdentityError) {
        switch key {
        case .p256: algorithm = .es256
        case .rsa: algorithm = .rs256
        case .p384, .p521: throw .keyUnusableForAssertion(key.kind)
        }
        self.key = key
        self.keyID = keyID
    }

    /// From a `client_key_entry`'s bytes.
    public init(pem: [UInt8], keyID: String?) throws(ClientIdentityError) {
        try self.init(key: ClientPrivateKey(pem: pem), keyID: keyID)
    }

    /// A compact JWS `header.claims.signature`, for one token request only.
    public func assertion(
        clientID: String, audience: String, now: Int64, jti: String
    ) throws(ClientIdentityError)
        -> String
    {
        var header: [(String, JSONObjectWriter.Value)] = [
            ("alg", .string(algorithm.rawValue)), ("typ", .string("JWT")),
        ]
        if let keyID { header.append(("kid", .string(keyID))) }
        let claims: [(String, JSONObjectWriter.Value)] = [
            ("iss", .string(clientID)), ("sub", .string(clientID)), ("aud", .string(audience)), ("jti", .string(jti)),
            ("iat", .integer(now)), ("exp", .integer(now + Self.lifetime)),
        ]
        let signingInput =
            Base64.encodeURL(JSONObjectWriter.object(header)) + "."
            + Base64.encodeURL(JSONObjectWriter.object(claims))
        let data = Array(signingInput.utf8)
        let signature: [UInt8]
        do {
            switch key {
            case .p256(let p256): signature = Array(try p256.signature(for: data).rawRepresentation)
            case .rsa(let rsa):
                signature = Array(try rsa.signature(for: data, padding: .insecurePKCS1v1_5).rawRepresentation)
            case .p384, .p521: throw ClientIdentityError.keyUnusableForAssertion(key.kind)
            }
        } catch {
            throw .signingFailed
        }
        return signingInput + "." + Base64.encodeURL(signature)
    }

    /// As above with a `jti` of 16 random bytes (128 bits: unique without any record of the ones used).
    public func assertion<R: RandomNumberGenerator>(
        clientID: String, audience: String, now: Int64, random: inout R
    )
        throws(ClientIdentityError) -> String
    {
        var bytes: [UInt8] = []
        for _ in 0..<2 { withUnsafeBytes(of: random.next().littleEndian) { bytes += $0 } }
        return try assertion(clientID: clientID, audience: audience, now: now, jti: Base64.encodeURL(bytes))
    }

    /// As above with the `jti`'s 16 bytes from the system's generator: what the daemon sends, unpredictable so
    /// that no one can pre-empt a `jti` a provider records against replays.
    public func assertion(clientID: String, audience: String, now: Int64) throws(ClientIdentityError) -> String {
        try assertion(clientID: clientID, audience: audience, now: now, jti: Base64.encodeURL(SystemRandom.bytes(16)))
    }
}
