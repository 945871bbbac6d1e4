import BackstopCore
import Foundation

/// Every client certificate a config names, read from the keychain at start and on reload: what the expiry warning
/// (14 days) and `backstop_client_certificate_expiry_seconds{upstream,target}` report
/// (docs/reference/operations.md#metrics). Pure: the keychain comes in as a lookup.
public enum ClientCertificateInventory {
    /// Where a certificate is presented.
    public enum Target: String, Sendable, Equatable {
        case upstream
        case tokenEndpoint = "token_endpoint"
    }

    /// One configured certificate.
    public struct Item: Sendable, Equatable {
        public var upstream: String
        public var target: Target
        public var entry: String
        /// When the leaf expires; nil when the entry is missing or unusable (`problem` says why).
        public var notValidAfter: Date?
        public var problem: String?

        public init(upstream: String, target: Target, entry: String, notValidAfter: Date?, problem: String?) {
            self.upstream = upstream
            self.target = target
            self.entry = entry
            self.notValidAfter = notValidAfter
            self.problem = problem
        }

        /// Whether the warning is due at `now`: the certificate expires within 14 days, or already has.
        public func expiresSoon(now: Date) -> Bool {
            notValidAfter.map { $0.timeIntervalSince(now) < ClientCertificateBundle.expiryWarning } ?? false
        }
    }

    public static func read(_ config: Config, entry: (String) -> [UInt8]?) -> [Item] {
        var items: [Item] = []
        for upstream in config.upstreams {
            var named: [(Target, String)] = []
            if let name = upstream.tls.clientCertEntry { named.append((.upstream, name)) }
            if case .oauth2(let oauth) = upstream.auth, let name = oauth.tls.clientCertEntry {
                named.append((.tokenEndpoint, name))
            }
            for (target, name) in named {
                var item = Item(upstream: upstream.name, target: target, entry: name, notValidAfter: nil, problem: nil)
                if let bytes = entry(name) {
                    do {
                        let bundle = try ClientCertificateBundle(pem: bytes)
                        item.notValidAfter = bundle.notValidAfter
                        item.problem = bundle.unusableReason(now: Date())
                    } catch {
                        item.problem = error.description
                    }
                } else {
                    item.problem = "keychain entry '\(name)' is missing"
                }
                items.append(item)
            }
        }
        return items
    }
}
