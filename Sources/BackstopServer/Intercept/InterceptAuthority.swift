import BackstopCA
import BackstopCore
import BackstopKeychain
import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import NIOSSL

/// The interception CA of one config snapshot (docs/reference/https-clients.md#the-local-ca): an intermediate minted
/// in memory from the keychain's root, with name constraints permitting only the intercepting upstreams' names, and
/// a bounded in-memory cache of TLS server contexts, one per host, each with a leaf minted on first use. Nothing of
/// it is ever written to disk; a reload mints a new intermediate and starts an empty cache, and so does the first
/// minting within 30 days of the intermediate's end (reading the root from the keychain again).
///
/// Minting (a P-256 key, a signature, a TLS context; the keychain read and decrypted when the intermediate is
/// renewed) runs on NIO's thread pool, never on an event loop, and no lock is held meanwhile: the lock guards only
/// the cache and the list of handshakes waiting for a name being minted (`LeafMinting`), so every handshake for
/// that name waits on one minting.
public final class InterceptAuthority: Sendable {
    /// Cached leaves at most; past it, the one closest to renewal is dropped.
    static let maxCachedLeaves = 1024
    /// An intermediate this close to its end is replaced (with an empty leaf cache) at the next minting, so a
    /// daemon that is never reloaded keeps serving valid chains.
    static let intermediateRenewal: TimeInterval = 30 * 86_400

    /// The intermediate in use and its NIOSSL form.
    private struct Signer: Sendable {
        var intermediate: CAIdentity
        var certificate: NIOSSLCertificate

        init(root: CAIdentity, hostPatterns: [String], now: Date) throws {
            intermediate = try CertificateMinter.makeIntermediate(root: root, hostPatterns: hostPatterns, now: now)
            certificate = try NIOSSLCertificate(bytes: intermediate.certificateDER, format: .der)
        }

        func nearsItsEnd(at now: Date) -> Bool {
            intermediate.certificate.notValidAfter.timeIntervalSince(now) < InterceptAuthority.intermediateRenewal
        }
    }

    private struct State: Sendable {
        var signer: Signer
        var leaves = LeafMinting<NIOSSLContext, EventLoopPromise<NIOSSLContext>>(capacity: maxCachedLeaves)
        /// Leaves minted since start (diagnostics and tests).
        var minted = 0
    }

    /// Reads the root from the keychain again: its key is held only while an intermediate is minted.
    private let loadRoot: @Sendable () throws -> CAIdentity
    private let hostPatterns: [String]
    private let leafLifetime: TimeInterval
    private let state: NIOLockedValueBox<State>
    private let threadPool: NIOThreadPool

    init(
        root: CAIdentity, hostPatterns: [String], leafLifetime: Duration, now: Date,
        threadPool: NIOThreadPool = .singleton, loadRoot: @escaping @Sendable () throws -> CAIdentity
    ) throws {
        self.loadRoot = loadRoot
        self.hostPatterns = hostPatterns
        self.leafLifetime = TimeInterval(leafLifetime.secondsAndAttoseconds.seconds)
        self.threadPool = threadPool
        self.state = NIOLockedValueBox(State(signer: try Signer(root: root, hostPatterns: hostPatterns, now: now)))
    }

    /// The intermediate signing leaves now.
    public var intermediate: CAIdentity { state.withLockedValue { $0.signer.intermediate } }

    /// The authority for `config`, or nil when no upstream intercepts. Fails with what to do when the root CA is
    /// missing, unreadable or expired.
    public static func load(
        config: Config, keychain: FileKeychain?, now: Date = Date()
    ) throws(InterceptSetupError)
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
                root: root, hostPatterns: patterns,
                leafLifetime: config.intercept?.leafLifetime ?? InterceptConfig().leafLifetime,
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

    /// The server context for `host`, on `eventLoop`: the cached one, or one minted on the thread pool (with a new
    /// intermediate first when the current one nears its end); handshakes asking for a name being minted share that
    /// minting. Fails at once for a host no pattern permits.
    func context(
        forHost host: String, now: Date = Date(), on eventLoop: any EventLoop
    ) -> EventLoopFuture<NIOSSLContext> {
        guard permits(host) else { return eventLoop.makeFailedFuture(InterceptRefusal.hostNotPermitted(host)) }
        let promise = eventLoop.makePromise(of: NIOSSLContext.self)
        let (lookup, signer) = state.withLockedValue { state in
            (state.leaves.lookup(host, now: now, waiter: promise), state.signer)
        }
        switch lookup {
        case .cached(let context):
            promise.succeed(context)
        case .wait:
            break
        case .mint:
            threadPool.runIfActive(eventLoop: eventLoop) { [self] in
                try mint(host, signer: signer, now: now)
            }.whenComplete { [self] result in
                finish(host, result, now: now)
            }
        }
        return promise.futureResult
    }

    /// A leaf for `host` and its TLS context; a new intermediate too when `signer`'s nears its end. Thread pool.
    private func mint(_ host: String, signer: Signer, now: Date) throws -> (NIOSSLContext, renewed: Signer?) {
        var renewed: Signer?
        if signer.nearsItsEnd(at: now) {
            renewed = try Signer(root: try loadRoot(), hostPatterns: hostPatterns, now: now)
        }
        let issuer = renewed ?? signer
        let leaf = try CertificateMinter.makeLeaf(
            host: host, issuer: issuer.intermediate, lifetime: leafLifetime, now: now)
        var tls = TLSConfiguration.makeServerConfiguration(
            certificateChain: [
                .certificate(try NIOSSLCertificate(bytes: CAIdentity.der(leaf.certificate), format: .der)),
                .certificate(issuer.certificate),
            ],
            privateKey: .privateKey(try NIOSSLPrivateKey(bytes: Array(leaf.privateKey.derRepresentation), format: .der))
        )
        tls.minimumTLSVersion = .tlsv12
        tls.applicationProtocols = ["http/1.1"]
        return (try NIOSSLContext(configuration: tls), renewed)
    }

    /// Caches what was minted (installing a renewed intermediate unless a newer one already is) and answers every
    /// handshake that waited for `host`.
    private func finish(_ host: String, _ result: Result<(NIOSSLContext, renewed: Signer?), any Error>, now: Date) {
        let context = try? result.get().0
        let waiters = state.withLockedValue { state in
            if case .success(let minted) = result {
                state.minted += 1
                if let renewed = minted.renewed,
                    renewed.intermediate.certificate.notValidAfter > state.signer.intermediate.certificate.notValidAfter
                {
                    state.signer = renewed
                    state.leaves.dropLeaves()
                }
            }
            return state.leaves.minted(host, leaf: context, renewAfter: now + leafLifetime * 3 / 4)
        }
        for waiter in waiters {
            switch result {
            case .success(let minted): waiter.succeed(minted.0)
            case .failure(let error): waiter.fail(error)
            }
        }
    }

    /// Leaves cached now (for tests and diagnostics).
    public var cachedLeafCount: Int { state.withLockedValue { $0.leaves.cachedCount } }
    /// Leaves minted since start (for tests and diagnostics).
    var mintedLeafCount: Int { state.withLockedValue { $0.minted } }
}

/// Why a TLS handshake inside an intercepted `CONNECT` was refused before any leaf was minted.
enum InterceptRefusal: Error, CustomStringConvertible {
    case hostNotPermitted(String)
    case sniMismatch(sni: String, connect: String)
    /// A ClientHello framed as TLS that cannot be read (`ClientHelloServerName.unreadable`).
    case unreadableClientHello(String)

    var description: String {
        switch self {
        case .hostNotPermitted(let host): "no intercepting upstream matches \(host)"
        case .sniMismatch(let sni, let connect): "the ClientHello names \(sni), the CONNECT named \(connect)"
        case .unreadableClientHello(let why): "the ClientHello cannot be read: \(why)"
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
