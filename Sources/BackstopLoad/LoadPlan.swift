import NIOCore
import NIOHTTP1
import NIOSSL

/// What every connection does, fixed before the run: where to connect, whether to open a CONNECT tunnel and TLS
/// inside it, and the request to repeat.
struct LoadPlan: Sendable {
    /// The TCP peer: the proxy, or the origin itself without `--proxy`.
    var peerHost: String
    var peerPort: Int
    /// `host:port` of the CONNECT request line, when tunnelling.
    var tunnelAuthority: String?
    /// TLS towards the origin (inside the tunnel, or directly for an `https` URL without a proxy).
    var tls: NIOSSLContext?
    /// SNI and the name the origin's certificate must carry (nil for an IP literal: the peer address is checked).
    var serverHostname: String?
    var request: HTTPRequestHead
    /// A connection that reads nothing for this long (CONNECT answer, handshake or response) counts an error.
    var timeout: TimeAmount
}

/// One `host:port` (IPv6 literals in brackets).
struct Authority: Sendable, Equatable {
    var host: String
    var port: Int

    /// Parses `host:port`; `defaultPort` when the port is missing and one is allowed.
    init?(_ text: String, defaultPort: Int? = nil) {
        var host = Substring(text)
        var port = defaultPort
        if host.hasPrefix("[") {
            guard let close = host.firstIndex(of: "]") else { return nil }
            let rest = host[host.index(after: close)...]
            host = host[host.index(after: host.startIndex)..<close]
            if !rest.isEmpty {
                guard rest.hasPrefix(":"), let value = Int(rest.dropFirst()) else { return nil }
                port = value
            }
        } else if let colon = host.lastIndex(of: ":") {
            guard let value = Int(host[host.index(after: colon)...]) else { return nil }
            port = value
            host = host[..<colon]
        }
        guard !host.isEmpty, let port, (1...65535).contains(port) else { return nil }
        self.host = String(host)
        self.port = port
    }

    /// As it goes in a Host header or request line (brackets around IPv6, port left out when it is `defaultPort`).
    func text(omittingPort defaultPort: Int? = nil) -> String {
        let name = host.contains(":") ? "[\(host)]" : host
        return port == defaultPort ? name : "\(name):\(port)"
    }

    /// Whether the host is an IP literal (no SNI is sent for those).
    var isIPLiteral: Bool {
        host.contains(":") || (host.split(separator: ".").count == 4 && host.allSatisfy { $0 == "." || $0.isNumber })
    }
}

/// An `http://` or `https://` URL split into what the load client needs.
struct LoadURL: Sendable {
    var secure: Bool
    var authority: Authority
    /// Path and query, `/` when the URL has none.
    var path: String

    init?(_ text: String) {
        let secure: Bool
        let rest: Substring
        if text.hasPrefix("http://") {
            secure = false
            rest = text.dropFirst(7)
        } else if text.hasPrefix("https://") {
            secure = true
            rest = text.dropFirst(8)
        } else {
            return nil
        }
        let slash = rest.firstIndex(of: "/") ?? rest.endIndex
        guard let authority = Authority(String(rest[..<slash]), defaultPort: secure ? 443 : 80) else { return nil }
        self.secure = secure
        self.authority = authority
        self.path = slash == rest.endIndex ? "/" : String(rest[slash...])
    }

    /// The absolute form sent to a proxy.
    var absolute: String {
        (secure ? "https://" : "http://") + authority.text(omittingPort: secure ? 443 : 80) + path
    }
}
