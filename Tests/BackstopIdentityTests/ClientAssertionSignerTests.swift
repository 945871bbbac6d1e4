import BackstopCore
import BackstopIdentity
import Crypto
import Foundation
import Testing
import _CryptoExtras

/// `private_key_jwt` assertions (RFC 7523 §2.2, OpenID Connect Core §9): exact header and claims, signatures that
/// verify with the public key, a fresh `jti` per assertion.
@Suite("Client assertions")
struct ClientAssertionSignerTests {
    static func decode(_ part: Substring) -> [UInt8] {
        var text = part.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while text.count % 4 != 0 { text += "=" }
        return Base64.decode(Array(text.utf8)) ?? []
    }

    @Test("ES256: exact header and claims, a 64-byte r||s signature that verifies")
    func es256() throws {
        let key = P256.Signing.PrivateKey()
        let signer = try ClientAssertionSigner(pem: Array(key.pemRepresentation.utf8), keyID: "key-2026-11")
        #expect(signer.algorithm == .es256)
        let jwt = try signer.assertion(
            clientID: "backstop-prod", audience: "https://idp.test/oauth/token",
            now: 1_700_000_000, jti: "j-1")
        let parts = jwt.split(separator: ".", omittingEmptySubsequences: false)
        #expect(parts.count == 3)
        #expect(
            String(decoding: Self.decode(parts[0]), as: UTF8.self)
                == #"{"alg":"ES256","typ":"JWT","kid":"key-2026-11"}"#)
        #expect(
            String(decoding: Self.decode(parts[1]), as: UTF8.self)
                == #"{"iss":"backstop-prod","sub":"backstop-prod","aud":"https://idp.test/oauth/token","jti":"j-1","#
                + #""iat":1700000000,"exp":1700000060}"#)
        let signature = Self.decode(parts[2])
        #expect(signature.count == 64)
        let parsed = try P256.Signing.ECDSASignature(rawRepresentation: signature)
        #expect(key.publicKey.isValidSignature(parsed, for: Array((parts[0] + "." + parts[1]).utf8)))
        #expect(!key.publicKey.isValidSignature(parsed, for: Array((parts[0] + "." + parts[1] + "x").utf8)))
        #expect(ClientAssertionSigner.lifetime > 0 && ClientAssertionSigner.lifetime <= 300)
    }

    @Test("RS256: PKCS#1 v1.5 over SHA-256, deterministic, verifies; no kid when none is configured")
    func rs256() throws {
        let key = try _RSA.Signing.PrivateKey(keySize: .bits2048)
        let signer = try ClientAssertionSigner(pem: Array(key.pemRepresentation.utf8), keyID: nil)
        #expect(signer.algorithm == .rs256)
        let jwt = try signer.assertion(clientID: "c", audience: "https://idp.test/t", now: 10, jti: "j")
        #expect(jwt == (try signer.assertion(clientID: "c", audience: "https://idp.test/t", now: 10, jti: "j")))
        let parts = jwt.split(separator: ".")
        #expect(String(decoding: Self.decode(parts[0]), as: UTF8.self) == #"{"alg":"RS256","typ":"JWT"}"#)
        let signature = _RSA.Signing.RSASignature(rawRepresentation: Self.decode(parts[2]))
        #expect(
            key.publicKey.isValidSignature(
                signature, for: Array((parts[0] + "." + parts[1]).utf8), padding: .insecurePKCS1v1_5))
    }

    @Test("the jti comes from the injected randomness: 128 bits, base64url, different on every call")
    func jti() throws {
        let signer = try ClientAssertionSigner(pem: Array(P256.Signing.PrivateKey().pemRepresentation.utf8), keyID: nil)
        var scripted = ScriptedRandom(0x0102_0304_0506_0708, 0xF0F1_F2F3_F4F5_F6F7)
        let jwt = try signer.assertion(clientID: "c", audience: "a", now: 0, random: &scripted)
        let claims = String(decoding: Self.decode(jwt.split(separator: ".")[1]), as: UTF8.self)
        let expected = Base64.encodeURL([8, 7, 6, 5, 4, 3, 2, 1, 0xF7, 0xF6, 0xF5, 0xF4, 0xF3, 0xF2, 0xF1, 0xF0])
        #expect(claims.contains(#""jti":"\#(expected)""#), "\(claims)")
        var random = SplitMix64(seed: 7)
        var seen: Set<String> = []
        for _ in 0..<200 {
            let claims = String(
                decoding: Self.decode(
                    try signer.assertion(clientID: "c", audience: "a", now: 0, random: &random).split(separator: ".")[1]
                ),
                as: UTF8.self)
            seen.insert(claims)
        }
        #expect(seen.count == 200)
    }

    @Test("the daemon's jti: 16 bytes from the system's generator, a new one on every call")
    func systemJTI() throws {
        let signer = try ClientAssertionSigner(pem: Array(P256.Signing.PrivateKey().pemRepresentation.utf8), keyID: nil)
        var seen: Set<String> = []
        for _ in 0..<100 {
            let claims = String(
                decoding: Self.decode(
                    try signer.assertion(clientID: "c", audience: "a", now: 0).split(separator: ".")[1]),
                as: UTF8.self)
            let jti = try #require(claims.split(separator: "\"jti\":\"").last?.split(separator: "\"").first)
            #expect(Self.decode(jti).count == 16, "\(claims)")
            seen.insert(String(jti))
        }
        #expect(seen.count == 100)
    }

    @Test("keys the algorithms cannot use are refused when the entry is read")
    func refused() throws {
        #expect(throws: ClientIdentityError.keyUnusableForAssertion("EC P-384")) {
            try ClientAssertionSigner(pem: Array(P384.Signing.PrivateKey().pemRepresentation.utf8), keyID: nil)
        }
        #expect(throws: ClientIdentityError.unexpectedKeyEntryBlock("CERTIFICATE")) {
            try ClientAssertionSigner(
                pem: Array("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".utf8),
                keyID: nil)
        }
        #expect(throws: ClientIdentityError.notPEM) { try ClientAssertionSigner(pem: Array("x".utf8), keyID: nil) }
    }
}
