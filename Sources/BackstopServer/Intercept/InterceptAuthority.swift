import BackstopCA
import BackstopCore
import BackstopKeychain
import Foundation
import NIOConcurrencyHelpers
import NIOSSL

/// The interception CA of one config snapshot (docs/reference/https-clients.md#the-local-ca): an intermediate minted
/// in memory from the keychain's root, with name constraints permitting only the intercepting upstreams' names, and
/// a bounded in-memory cache of TLS server contexts, one per host, each with a leaf minted on first use. Nothing of
/// it is ever written to disk; a reload mints a new intermediate and starts an empty cache, and so does the first
/// handshake within 30 days of the intermediate's end (reading the root from the keychain again).
public final class InterceptAuthority: Sendable {
    /// Cached leaves at most; past it, the one closest to renewal is dropped.
    static let maxCachedLeaves = 1024
    /// An intermediate this close to its end is replaced (with an empty leaf cache) at the next handshake, so a
    /// daemon that is never reloaded keeps serving valid chains.
    static let intermediateRenewal: TimeInterval = 30 * 86_400

    private struct Leaf {
        let context: NIOSSLContext
        /// Re-minted after three quarters of its lifetime, so a client never gets a leaf about to expire.
        let renewAfter: Date
    }

    /// The intermediate in use, its NIOSSL form, and the leaves it signed.
    private struct Signer {
        var intermediate: CAIdentity
        var certificate: NIOSSLCertificate
        var leaves: [String: Leaf] = [:]

        init(root: CAIdentity, hostPatterns: [String], now: Date) throws {
            intermediate = try CertificateMinter.makeIntermediate(root: root, hostPatterns: hostPatterns, now: now)
            certificate = try NIOSSLCertificate(bytes: intermediate.certificateDER, format: .der)
        }
    }

    /// Reads the root from the keychain again: its key is held only while an intermediate is minted.
    private let loadRoot: @Sendable () throws -> CAIdentity
    private let hostPatterns: [String]
    private let leafLifetime: TimeInterval
    private let signer: NIOLockedValueBox<Signer>

    init(
        root: CAIdentity, hostPatterns: [String], leafLifetime: Duration, now: Date,
        loadRoot: @escaping @Sendable () throws -> CAIdentity
    ) throws {
        self.loadRoot = loadRoot
        self.hostPatterns = hostPatterns
        self.leafLifetime = TimeInterval(leafLifetime.components.seconds)
        self.signer = NIOLockedValueBox(try Signer(root: root, hostPatterns: hostPatterns, now: now))
    }

    /// The intermediate signing leaves now.
    public var intermediate: CAIdentity { signer.withLockedValue { $0.intermediate } }

    /// The authority for `config`, or nil when no upstream intercepts. Fails with what to do when the root CA is
    /// missing, unreadable or expired.
    public static func load(config: Config, keychain: FileKeychain?, now: Date = Date()) throws(InterceptSetupError)
        -> InterceptAuthority?
    {
        let patterns = config.upstreams.filter(\.intercept).flatMap(\.match.hosts)
        guard !patterns.isEmpty else { return nil }
        let entryName = config.intercept?.caEntry ?? InterceptConfig().caEntry
        guard let keychain else { throw .noKeychain }
        let entry: KeychainEntry?
        do throws(KeychainError) {
            entry = try keychain.entry(entryName)
        } catch {
            throw .keychain(error.description)
        }
        guard let entry else { throw .missingRoot(entry: entryName) }
        let root: CAIdentity
        do throws(CABundleError) {
            root = try CAIdentity(pemBundle: entry.stringValue ?? "")
        } catch {
            throw .unreadableRoot(entry: entryName, problem: error.description)
        }
        guard root.certificate.notValidAfter > now else { throw .expiredRoot(entry: entryName) }
        do {
            return try InterceptAuthority(
                root: root, hostPatterns: patterns, leafLifetime: config.intercept?.leafLifetime ?? InterceptConfig().leafLifetime,
                now: now,
                loadRoot: {
                    guard let bundle = try keychain.entry(entryName)?.stringValue else {
                        throw InterceptSetupError.missingRoot(entry: entryName)
                    }
                    return try CAIdentity(pemBundle: bundle)
                })
        } catch {
            throw .minting("\(error)")
        }
    }

    /// Whether a leaf may be minted for `host`: it matches one of the intercepting upstreams' host patterns.
    func permits(_ host: String) -> Bool { Router.hostRank(hostPatterns, host) != nil }

    /// The server context for `host`, minting its leaf on first use (and a new intermediate when the current one
    /// nears its end). Throws for a host no pattern permits.
    func context(forHost host: String, now: Date = Date()) throws -> NIOSSLContext {
        guard permits(host) else { throw InterceptRefusal.hostNotPermitted(host) }
        return try signer.withLockedValue { signer in
            if signer.intermediate.certificate.notValidAfter.timeIntervalSince(now) < Self.intermediateRenewal {
                signer = try Signer(root: try loadRoot(), hostPatterns: hostPatterns, now: now)
            }
            if let cached = signer.leaves[host], cached.renewAfter > now { return cached.context }
            let leaf = try CertificateMinter.makeLeaf(
                host: host, issuer: signer.intermediate, lifetime: leafLifetime, now: now)
            var tls = TLSConfiguration.makeServerConfiguration(
                certificateChain: [
                    .certificate(try NIOSSLCertificate(bytes: CAIdentity.der(leaf.certificate), format: .der)),
                    .certificate(signer.certificate),
                ],
                privateKey: .privateKey(try NIOSSLPrivateKey(bytes: Array(leaf.privateKey.derRepresentation), format: .der)))
            tls.minimumTLSVersion = .tlsv12
            tls.applicationProtocols = ["http/1.1"]
            let context = try NIOSSLContext(configuration: tls)
            if signer.leaves.count >= Self.maxCachedLeaves,
                let soonest = signer.leaves.min(by: { $0.value.renewAfter < $1.value.renewAfter })
            {
                signer.leaves[soonest.key] = nil
            }
            signer.leaves[host] = Leaf(context: context, renewAfter: now + leafLifetime * 3 / 4)
            return context
        }
    }

    /// Leaves minted and cached now (for tests and diagnostics).
    public var cachedLeafCount: Int { signer.withLockedValue { $0.leaves.count } }
}

/// Why a TLS handshake inside an intercepted `CONNECT` was refused before any leaf was minted.
enum InterceptRefusal: Error, CustomStringConvertible {
    case hostNotPermitted(String)
    case sniMismatch(sni: String, connect: String)

    var description: String {
        switch self {
        case .hostNotPermitted(let host): "no intercepting upstream matches \(host)"
        case .sniMismatch(let sni, let connect): "the ClientHello names \(sni), the CONNECT named \(connect)"
        }
    }
}

/// Why interception cannot start (at start: refuse to run; on reload: keep the old config).
public enum InterceptSetupError: Error, Equatable, CustomStringConvertible {
    case noKeychain
    case keychain(String)
    case missingRoot(entry: String)
    case unreadableRoot(entry: String, problem: String)
    case expiredRoot(entry: String)
    case minting(String)

    public var description: String {
        switch self {
        case .noKeychain:
            "an upstream intercepts but the config has no keychain for the root CA"
        case .keychain(let problem):
            "cannot read the root CA from the keychain: \(problem)"
        case .missingRoot(let entry):
            "an upstream intercepts but keychain entry '\(entry)' holds no root CA; create one with 'backstop ca init'"
        case .unreadableRoot(let entry, let problem):
            "keychain entry '\(entry)' is not a usable root CA (\(problem)); replace it with 'backstop ca init' after "
                + "'backstop keychain delete \(entry)'"
        case .expiredRoot(let entry):
            "the root CA in keychain entry '\(entry)' has expired; create a new one (docs/reference/https-clients.md)"
        case .minting(let problem):
            "cannot mint the interception intermediate: \(problem)"
        }
    }
}
