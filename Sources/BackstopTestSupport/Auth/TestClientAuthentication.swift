import BackstopCore
import Crypto
import Foundation
import _CryptoExtras

/// How `TestAuthServer` authenticates the client of a token call (RFC 6749 §2.3.1, RFC 7523 §2.2, OpenID Connect
/// Core §9), checked before any grant is looked at: a failure is answered 401 `invalid_client` and recorded.
public enum TestClientAuthentication: Sendable {
    /// `Authorization: Basic` with these (form-urlencoded before base64).
    case basic(id: String, secret: String)
    /// A `private_key_jwt` assertion signed by `key` for `clientID`, with `aud` the token URL.
    case privateKeyJWT(clientID: String, key: TestAssertionKey, keyID: String?)
}

/// The public key a test token endpoint verifies assertions with.
public enum TestAssertionKey: Sendable {
    case p256(P256.Signing.PublicKey)
    case rsa(_RSA.Signing.PublicKey)

    /// The public half of a PEM private key (PKCS#8, SEC1 or PKCS#1).
    public init(privateKeyPEM: [UInt8]) throws {
        let text = String(decoding: privateKeyPEM, as: UTF8.self)
        if let key = try? P256.Signing.PrivateKey(pemRepresentation: text) {
            self = .p256(key.publicKey)
        } else {
            self = .rsa(try _RSA.Signing.PrivateKey(pemRepresentation: text).publicKey)
        }
    }

    var algorithm: String {
        switch self {
        case .p256: "ES256"
        case .rsa: "RS256"
        }
    }

    func verifies(_ signature: [UInt8], over input: [UInt8]) -> Bool {
        switch self {
        case .p256(let key):
            guard let parsed = try? P256.Signing.ECDSASignature(rawRepresentation: signature) else { return false }
            return key.isValidSignature(parsed, for: input)
        case .rsa(let key):
            return key.isValidSignature(
                _RSA.Signing.RSASignature(rawRepresentation: signature), for: input, padding: .insecurePKCS1v1_5)
        }
    }
}

/// A verified client assertion's header and claims, as the token endpoint saw them.
public struct TestVerifiedAssertion: Sendable, Equatable {
    public var header: [String: String]
    public var issuer: String
    public var subject: String
    public var audience: String
    public var jti: String
    public var issuedAt: Int64
    public var expiresAt: Int64
}

enum TestAssertionVerifier {
    /// The assertion's claims when its form, signature and claims are right for `clientID` and `audience` at
    /// `now` (seconds); else why not.
    static func verify(
        _ assertion: String, key: TestAssertionKey, keyID: String?, clientID: String, audience: String, now: Int64
    ) -> Result<TestVerifiedAssertion, TestAuthRefusal> {
        let parts = assertion.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, let headerBytes = base64URL(parts[0]), let claimBytes = base64URL(parts[1]),
            let signature = base64URL(parts[2])
        else { return .failure("not a compact JWS") }
        guard let header = try? JSONSerialization.jsonObject(with: Data(headerBytes)) as? [String: Any],
            let claims = try? JSONSerialization.jsonObject(with: Data(claimBytes)) as? [String: Any]
        else { return .failure("header or claims are not JSON objects") }
        guard header["alg"] as? String == key.algorithm else { return .failure("alg is not \(key.algorithm)") }
        guard header["kid"] as? String == keyID else { return .failure("kid is not \(keyID ?? "absent")") }
        guard key.verifies(signature, over: Array((parts[0] + "." + parts[1]).utf8)) else {
            return .failure("signature does not verify")
        }
        guard let iss = claims["iss"] as? String, let sub = claims["sub"] as? String,
            let aud = claims["aud"] as? String,
            let jti = claims["jti"] as? String, !jti.isEmpty, let iat = (claims["iat"] as? NSNumber)?.int64Value,
            let exp = (claims["exp"] as? NSNumber)?.int64Value
        else { return .failure("a required claim is missing") }
        guard iss == clientID, sub == clientID else { return .failure("iss/sub is not the client id") }
        guard aud == audience else { return .failure("aud is not the token endpoint") }
        guard exp > now, exp - now <= 300, iat <= now + 5, exp > iat else { return .failure("iat/exp out of range") }
        return .success(
            TestVerifiedAssertion(
                header: header.compactMapValues { $0 as? String }, issuer: iss, subject: sub, audience: aud, jti: jti,
                issuedAt: iat, expiresAt: exp))
    }

    static func base64URL(_ text: Substring) -> [UInt8]? {
        var standard = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while standard.utf8.count % 4 != 0 { standard += "=" }
        return Base64.decode(Array(standard.utf8))
    }
}

/// Why the test token endpoint refused a client (written as a string literal where it is made).
public struct TestAuthRefusal: Error, Sendable, Equatable, ExpressibleByStringInterpolation, CustomStringConvertible {
    public var description: String
    public init(stringLiteral value: String) { description = value }
    public init(stringInterpolation: DefaultStringInterpolation) {
        description = String(stringInterpolation: stringInterpolation)
    }
}
