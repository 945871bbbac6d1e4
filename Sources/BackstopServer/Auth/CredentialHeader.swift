import BackstopCore
import NIOConcurrencyHelpers

/// The auth header an upstream injects (`auth.header`, `auth.scheme`, `auth.client_auth_header`;
/// docs/reference/config.md#auth), with the last value it was built for kept: a token is the same for thousands of
/// requests, and building `Bearer <1 KiB token>` anew cost each one ~3k instructions (docs/performance.md).
final class CredentialHeader: Sendable {
    let name: String
    let scheme: String
    let replacesClient: Bool
    /// The last secret and the header made of it (its value built and checked once). A token is compared by its
    /// storage first (the token source hands out the same string until it changes), so a hit costs a lock and a
    /// pointer comparison.
    private let last = NIOLockedValueBox<(secret: String, header: HeaderRewriter.InjectedHeader)?>(nil)

    init(name: String, scheme: String, policy: ClientAuthHeaderPolicy) {
        self.name = name
        self.scheme = scheme
        self.replacesClient = policy == .replace
    }

    /// The header for `secret`: `scheme secret`, or the secret alone when the scheme is empty.
    func header(for secret: String) -> HeaderRewriter.InjectedHeader {
        last.withLockedValue { last in
            if let last, last.secret == secret { return last.header }
            let header = HeaderRewriter.InjectedHeader(
                name: name, value: scheme.isEmpty ? secret : scheme + " " + secret, replacesClient: replacesClient)
            last = (secret, header)
            return header
        }
    }
}
