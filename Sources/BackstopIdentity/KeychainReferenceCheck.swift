import BackstopCore
import Foundation

/// `check --online` for the keychain entries the identity settings name (docs/reference/cli.md#check---online):
/// each must exist and hold what its setting needs (a certificate chain with the key that belongs to it, a key the
/// assertion algorithm can use, `user:password`, a non-empty secret, a value that can go in a header). Pure: the
/// keychain comes in as a lookup.
public enum KeychainReferenceCheck {
    public static func problems(
        _ references: [KeychainReference], entry: (String) -> [UInt8]?, now: Date
    ) -> [ConfigError] {
        var problems: [ConfigError] = []
        for reference in references {
            func fail(_ message: String) {
                problems.append(
                    ConfigError(
                        location: reference.location,
                        message: "\(reference.key): keychain entry '\(reference.entry)' \(message)"))
            }
            guard let value = entry(reference.entry) else {
                fail("is missing; store it with: backstop keychain set \(reference.entry)")
                continue
            }
            switch reference.content {
            case .clientCertificate:
                do {
                    let bundle = try ClientCertificateBundle(pem: value)
                    if let reason = bundle.unusableReason(now: now) { fail("is unusable: \(reason)") }
                } catch {
                    fail("is not a client certificate chain and key: \(error.description)")
                }
            case .assertionSigningKey:
                do {
                    _ = try ClientAssertionSigner(pem: value, keyID: nil)
                } catch {
                    fail("is unusable: \(error.description)")
                }
            case .proxyCredentials:
                if !value.contains(UInt8(ascii: ":")) { fail("does not hold user:password") }
            case .secret:
                if value.isEmpty { fail("is empty") }
            case .headerValue:
                if value.isEmpty {
                    fail("is empty")
                } else if !HTTPSyntax.isFieldValue(value) {
                    fail("holds a control character (CR, LF, …): it cannot go in a header, so nothing would be sent")
                }
            }
        }
        // By position, as every other `check` error.
        return problems.inFileOrder()
    }
}
