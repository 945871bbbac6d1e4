import Yams

/// Where the parts of one `clients` entry were written.
struct ClientSite {
    var name: SourceLocation
    /// The `match` key's value node (`unix_user: ...`, `proxy_auth: ...`).
    var match: SourceLocation
    /// Each named upstream with where it was written (empty for `*`).
    var upstreams: [(name: String, location: SourceLocation)]
}

extension ConfigBuilder {
    /// The `clients` section (docs/reference/config.md#clients): a non-empty list of entries, each with a name, one
    /// way to recognise the client, and the upstreams it may use.
    mutating func clients(_ node: Node) -> [ClientConfig]? {
        guard let items = reader.sequence(node, "clients") else { return nil }
        if items.isEmpty {
            reader.fail(
                node,
                "'clients' needs at least one entry (remove the section to let every client use every "
                    + "upstream)")
        }
        var out: [ClientConfig] = []
        var firstByName: [String: SourceLocation] = [:]
        for (index, item) in items.enumerated() {
            guard let (client, site) = client(item, index: index) else { continue }
            if let first = firstByName[client.name] {
                reader.fail(
                    at: site.name, "duplicate client name '\(client.name)' (first defined at line \(first.line))")
                continue
            }
            firstByName[client.name] = site.name
            out.append(client)
            clientSites.append(site)
        }
        return out
    }

    private mutating func client(_ node: Node, index: Int) -> (ClientConfig, ClientSite)? {
        let path = "clients[\(index)]"
        guard let map = reader.mapping(node, path, allowed: ["name", "match", "upstreams"]) else { return nil }
        var name: String?
        if let n = map["name"], let v = reader.string(n, "\(path).name") {
            if Self.isUpstreamName(v) { name = v } else { reader.fail(n, "client name '\(v)' must match [a-z0-9_-]+") }
        } else if map["name"] == nil {
            reader.fail(node, "\(path) needs 'name'")
        }
        let label = name.map { "client '\($0)'" } ?? path
        var match: (ClientMatch, SourceLocation)?
        if let n = map["match"] {
            match = clientMatch(n, label)
        } else {
            reader.fail(node, "\(label) needs 'match' (one of unix_user, unix_group, proxy_auth)")
        }
        var upstreams: (ClientUpstreams, [(String, SourceLocation)])?
        if let n = map["upstreams"] {
            upstreams = clientUpstreams(n, label)
        } else {
            reader.fail(node, "\(label) needs 'upstreams' (a list of upstream names, or '*' for all)")
        }
        guard let name, let nameNode = map["name"], let match, let upstreams else { return nil }
        let site = ClientSite(
            name: reader.location(nameNode), match: match.1,
            upstreams: upstreams.1.map { (name: $0.0, location: $0.1) })
        return (ClientConfig(name: name, match: match.0, upstreams: upstreams.0, location: match.1), site)
    }

    /// Exactly one of `unix_user`, `unix_group`, `proxy_auth`.
    private mutating func clientMatch(_ node: Node, _ label: String) -> (ClientMatch, SourceLocation)? {
        let keys = ["unix_user", "unix_group", "proxy_auth"]
        let errorsBefore = reader.errors.count
        guard let map = reader.mapping(node, "\(label): match", allowed: keys) else { return nil }
        let present = keys.filter { map[$0] != nil }
        guard present.count == 1, let key = present.first, let value = map[key] else {
            // An unknown key was reported already: one error per mistake.
            if present.isEmpty && reader.errors.count == errorsBefore {
                reader.fail(node, "\(label): match needs one of unix_user, unix_group, proxy_auth")
            } else if present.count > 1 {
                reader.fail(
                    map.keyNode(present[1])!,
                    "\(label): match takes one of unix_user, unix_group, proxy_auth, "
                        + "not \(present.joined(separator: " and ")) (write one entry for each)")
            }
            return nil
        }
        let location = reader.location(value)
        switch key {
        case "proxy_auth":
            guard let entry = entryName(value, "\(label): match.proxy_auth", content: .proxyCredentials) else {
                return nil
            }
            return (.proxyAuth(entry: entry), location)
        default:
            guard let text = reader.string(value, "\(label): match.\(key)") else { return nil }
            let principal: UnixPrincipal
            if text.utf8.allSatisfy({ (48...57).contains($0) }) {
                guard let id = UInt32(text), id != UInt32.max else {
                    reader.fail(value, "\(label): match.\(key) '\(text)' is not a valid id")
                    return nil
                }
                principal = .id(id)
            } else if Self.isUnixName(text) {
                principal = .name(text)
            } else {
                reader.fail(value, "\(label): match.\(key) '\(text)' is not a user or group name or a numeric id")
                return nil
            }
            let match: ClientMatch = key == "unix_user" ? .unixUser(principal) : .unixGroup(principal)
            return (match, location)
        }
    }

    /// `'*'` or a non-empty list of upstream names (checked against the upstreams once all are known).
    private mutating func clientUpstreams(
        _ node: Node, _ label: String
    ) -> (ClientUpstreams, [(String, SourceLocation)])? {
        if case .scalar(let scalar) = node {
            guard scalar.string == "*" else {
                reader.fail(node, "\(label): upstreams must be a list of upstream names or '*', not '\(scalar.string)'")
                return nil
            }
            return (.all, [])
        }
        guard let list = reader.stringList(node, "\(label): upstreams") else { return nil }
        if list.isEmpty {
            reader.fail(
                node,
                "\(label): upstreams is empty: the client could use nothing (remove the entry, or list "
                    + "upstreams)")
            return nil
        }
        if list.count > 1, let star = list.first(where: { $0.0 == "*" }) {
            reader.fail(star.1, "\(label): upstreams: '*' already means every upstream; list names or '*' alone")
            return nil
        }
        if list.count == 1, list[0].0 == "*" { return (.all, []) }
        var names: [(String, SourceLocation)] = []
        for (text, item) in list {
            if names.contains(where: { $0.0 == text }) {
                reader.fail(item, "\(label): upstreams lists '\(text)' twice")
                continue
            }
            names.append((text, reader.location(item)))
        }
        return (.only(names.map(\.0)), names)
    }

    /// What `useradd` accepts, roughly: letters, digits, `_`, `-`, `.`, not starting with `-`; at most 32 bytes.
    static func isUnixName(_ text: String) -> Bool {
        guard let first = text.utf8.first, first != UInt8(ascii: "-"), text.utf8.count <= 32 else { return false }
        return text.utf8.allSatisfy {
            (48...57).contains($0) || (65...90).contains($0) || (97...122).contains($0) || $0 == 95 || $0 == 45
                || $0 == 46
        }
    }
}
