/// What the kernel says about a client connection, gathered once at accept (docs/reference/config.md#clients).
public struct ClientConnection: Sendable, Equatable {
    /// The peer's user: `SO_PEERCRED` on a unix socket, the socket owner for a loopback TCP client; nil for a remote
    /// client or when the kernel could not tell.
    public var uid: UInt32?
    /// The groups of that user (primary and supplementary), resolved when the connection was accepted.
    public var groups: Set<UInt32>

    public init(uid: UInt32? = nil, groups: Set<UInt32> = []) {
        self.uid = uid
        self.groups = groups
    }
}

/// What a request asks to use.
public enum ClientTarget: Sendable, Equatable {
    /// A configured upstream (also a `CONNECT` an intercepting upstream answers).
    case upstream(String)
    /// No upstream: passthrough (`unmatched: passthrough`) or a blind `CONNECT` tunnel. Only `upstreams: '*'` allows it.
    case unrouted
}

/// The answer for one request.
public enum ClientDecision: Sendable, Equatable {
    /// Go on; the access line names `client`.
    case allow(client: String)
    /// 403 `client-denied`: no entry matched (and no `proxy_auth` entry could), or the matching entry does not list
    /// the target.
    case deny
    /// 407 `proxy-auth-required` with `Proxy-Authenticate: Basic`: only a `proxy_auth` entry could still match.
    case challenge
}

/// The `clients` section resolved for decisions: user and group names turned into ids, `proxy_auth` entries into
/// the credentials they hold. Pure: `decide` does no I/O, so every combination is tested as data.
public struct ClientAccessPolicy: Sendable, Equatable {
    /// How an entry recognises its client.
    public enum Rule: Sendable, Equatable, CustomStringConvertible {
        case user(UInt32)
        case group(UInt32)
        /// `user:password` bytes, compared in constant time with what the client presents.
        case basic(credentials: [UInt8])

        // The credentials never reach a log through interpolation.
        public var description: String {
            switch self {
            case .user(let uid): "user(\(uid))"
            case .group(let gid): "group(\(gid))"
            case .basic: "basic(<redacted>)"
            }
        }
    }

    /// One resolved `clients` entry.
    public struct Entry: Sendable, Equatable {
        public var name: String
        public var rule: Rule
        public var upstreams: ClientUpstreams
        public init(name: String, rule: Rule, upstreams: ClientUpstreams) {
            self.name = name
            self.rule = rule
            self.upstreams = upstreams
        }
    }

    /// `Proxy-Authenticate` sent with a 407 (RFC 7617 §2: a realm is required).
    public static let challenge = (name: "Proxy-Authenticate", value: "Basic realm=\"backstop\", charset=\"UTF-8\"")

    public let entries: [Entry]
    /// Whether any entry is `proxy_auth`: then a client that matches nothing is asked for credentials.
    public let challenges: Bool
    /// Whether any entry is `unix_group`: only then are a client's groups looked up.
    public let usesGroups: Bool

    public init(entries: [Entry]) {
        self.entries = entries
        challenges = entries.contains { if case .basic = $0.rule { true } else { false } }
        usesGroups = entries.contains { if case .group = $0.rule { true } else { false } }
    }

    /// The first entry that matches the connection and the presented `Proxy-Authorization` decides: allowed when it
    /// lists `target`, else denied. With no match: a challenge when a `proxy_auth` entry exists, else denied.
    public func decide(
        connection: ClientConnection, proxyAuthorization: String?, target: ClientTarget
    ) -> ClientDecision {
        let presented = proxyAuthorization.flatMap(ProxyAuthorization.basicCredentials)
        for entry in entries where matches(entry.rule, connection, presented) {
            let allowed: Bool
            switch target {
            case .upstream(let name): allowed = entry.upstreams.allows(name)
            case .unrouted: allowed = entry.upstreams == .all
            }
            return allowed ? .allow(client: entry.name) : .deny
        }
        return challenges ? .challenge : .deny
    }

    private func matches(_ rule: Rule, _ connection: ClientConnection, _ presented: [UInt8]?) -> Bool {
        switch rule {
        case .user(let uid): connection.uid == uid
        case .group(let gid): connection.uid != nil && connection.groups.contains(gid)
        case .basic(let credentials): presented.map { ConstantTime.equals($0, credentials) } ?? false
        }
    }

    /// Resolves `clients` with the host's user and group databases and the keychain, all injected.
    public static func resolve(
        _ clients: [ClientConfig], user: (String) -> UInt32?, group: (String) -> UInt32?,
        secret: (String) -> [UInt8]?
    ) throws(ClientPolicyError) -> ClientAccessPolicy {
        var entries: [Entry] = []
        for client in clients {
            let rule: Rule
            switch client.match {
            case .unixUser(.id(let uid)): rule = .user(uid)
            case .unixUser(.name(let name)):
                guard let uid = user(name) else { throw .unknownUser(client: client.name, name: name) }
                rule = .user(uid)
            case .unixGroup(.id(let gid)): rule = .group(gid)
            case .unixGroup(.name(let name)):
                guard let gid = group(name) else { throw .unknownGroup(client: client.name, name: name) }
                rule = .group(gid)
            case .proxyAuth(let entry):
                guard let value = secret(entry) else { throw .missingEntry(client: client.name, entry: entry) }
                guard value.contains(UInt8(ascii: ":")) else {
                    throw .notCredentials(client: client.name, entry: entry)
                }
                rule = .basic(credentials: value)
            }
            entries.append(Entry(name: client.name, rule: rule, upstreams: client.upstreams))
        }
        return ClientAccessPolicy(entries: entries)
    }
}

/// Why `clients` cannot be put in force (at start or reload; the old policy then stays).
public enum ClientPolicyError: Error, Sendable, Equatable, CustomStringConvertible {
    case unknownUser(client: String, name: String)
    case unknownGroup(client: String, name: String)
    case missingEntry(client: String, entry: String)
    case notCredentials(client: String, entry: String)

    public var description: String {
        switch self {
        case .unknownUser(let client, let name): "client '\(client)': unix_user '\(name)' is not a user on this host"
        case .unknownGroup(let client, let name): "client '\(client)': unix_group '\(name)' is not a group on this host"
        case .missingEntry(let client, let entry):
            "client '\(client)': proxy_auth entry '\(entry)' is not in the keychain; store it with: "
                + "backstop keychain set \(entry)"
        case .notCredentials(let client, let entry):
            "client '\(client)': proxy_auth entry '\(entry)' does not hold user:password"
        }
    }
}
