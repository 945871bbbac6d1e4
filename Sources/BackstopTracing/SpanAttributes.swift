import BackstopCore

/// Turns the facts of a request, an attempt or a refresh into span names, attributes and status, after
/// OpenTelemetry's HTTP semantic conventions (v1.26 stable names) plus the `backstop.*` attributes. Pure: the
/// tests compare whole attribute lists.
public enum SpanAttributes {
    /// Methods the conventions name as they are; any other is recorded as `_OTHER` with its original spelling.
    static let knownMethods: Set<String> = [
        "CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE",
    ]

    /// `{method}` for a known method, `HTTP` otherwise (the conventions' span name without a route template).
    public static func spanName(method: String) -> String {
        knownMethods.contains(method) ? method : "HTTP"
    }

    static func method(_ method: String, into attributes: inout [SpanAttribute]) {
        if knownMethods.contains(method) {
            attributes.append(SpanAttribute("http.request.method", .string(method)))
        } else {
            attributes.append(SpanAttribute("http.request.method", .string("_OTHER")))
            attributes.append(SpanAttribute("http.request.method_original", .string(method)))
        }
    }

    /// The server span's attributes and status. 5xx is an error for a server span; 4xx is the client's.
    public static func server(_ facts: RequestFacts) -> ([SpanAttribute], SpanStatus) {
        var a: [SpanAttribute] = []
        a.reserveCapacity(12)
        method(facts.method, into: &a)
        a.append(SpanAttribute("url.scheme", .string("http")))
        a.append(SpanAttribute("url.path", .string(limited(withoutQuery(facts.path)))))
        if let host = facts.serverAddress { a.append(SpanAttribute("server.address", .string(host))) }
        if let port = facts.serverPort { a.append(SpanAttribute("server.port", .int(Int64(port)))) }
        if let client = facts.clientAddress { a.append(SpanAttribute("client.address", .string(client))) }
        if let agent = facts.userAgent { a.append(SpanAttribute("user_agent.original", .string(limited(agent)))) }
        a.append(SpanAttribute("network.protocol.version", .string(facts.protocolVersion)))
        a.append(SpanAttribute("http.response.status_code", .int(Int64(facts.status))))
        if let upstream = facts.upstream { a.append(SpanAttribute("backstop.upstream", .string(upstream))) }
        a.append(SpanAttribute("backstop.attempts", .int(Int64(facts.attempts))))
        var status = SpanStatus.unset
        if let reason = facts.errorReason {
            a.append(SpanAttribute("error.type", .string(reason)))
            if facts.status >= 500 { status = .error(reason) }
        } else if facts.status >= 500 {
            a.append(SpanAttribute("error.type", .string(String(facts.status))))
            status = .error(String(facts.status))
        }
        return (a, status)
    }

    /// A client span's attributes and status: any 4xx/5xx or transport failure is an error of that attempt.
    public static func client(_ facts: AttemptFacts) -> ([SpanAttribute], SpanStatus) {
        var a: [SpanAttribute] = []
        a.reserveCapacity(16)
        method(facts.method, into: &a)
        let url = withoutQuery(facts.url)
        a.append(SpanAttribute("url.full", .string(limited(url))))
        if let (host, port) = hostAndPort(url) {
            a.append(SpanAttribute("server.address", .string(host)))
            a.append(SpanAttribute("server.port", .int(Int64(port))))
        }
        if facts.attempt > 1 { a.append(SpanAttribute("http.request.resend_count", .int(Int64(facts.attempt - 1)))) }
        if let status = facts.status { a.append(SpanAttribute("http.response.status_code", .int(Int64(status)))) }
        if let version = facts.protocolVersion { a.append(SpanAttribute("network.protocol.version", .string(version))) }
        a.append(SpanAttribute("backstop.upstream", .string(facts.upstream)))
        a.append(SpanAttribute("backstop.endpoint", .string(facts.endpoint)))
        a.append(SpanAttribute("backstop.attempt", .int(Int64(facts.attempt))))
        a.append(SpanAttribute("backstop.outcome", .string(facts.outcome)))
        if let reason = facts.retryReason { a.append(SpanAttribute("backstop.retry_reason", .string(reason))) }
        if let backoff = facts.backoffMilliseconds { a.append(SpanAttribute("backstop.backoff_ms", .int(backoff))) }
        a.append(SpanAttribute("backstop.hedge", .bool(facts.hedge)))
        var status = SpanStatus.unset
        if let failure = facts.failure {
            a.append(SpanAttribute("error.type", .string(failure)))
            status = .error(failure)
        } else if let code = facts.status, code >= 400 {
            a.append(SpanAttribute("error.type", .string(String(code))))
            status = .error(String(code))
        } else if facts.status == nil {
            a.append(SpanAttribute("error.type", .string(facts.outcome)))
            status = .error(facts.outcome)
        }
        return (a, status)
    }

    /// A token refresh span's attributes and status.
    public static func refresh(_ facts: RefreshFacts) -> ([SpanAttribute], SpanStatus) {
        var a = [
            SpanAttribute("backstop.upstream", .string(facts.upstream)),
            SpanAttribute("server.address", .string(facts.tokenEndpointHost)),
            SpanAttribute("backstop.outcome", .string(facts.outcome)),
        ]
        guard let failure = facts.failure else { return (a, .unset) }
        a.append(SpanAttribute("error.type", .string(failure)))
        return (a, .error(failure))
    }

    /// `url` up to its `?`: a query may carry an API key or a signature, and no secret is ever an attribute.
    /// The longest value a client-supplied attribute (a path, a URL, a user agent) keeps, in UTF-8 bytes: a span
    /// waits in a queue of 2,048 and goes out in batches of 512, and a 64 KiB path in each would hold ~130 MiB and
    /// make a batch larger than collectors accept (OpenTelemetry's `AttributeValueLengthLimit`, set for them).
    public static let valueLimit = 1024

    /// `value` cut to at most `valueLimit` UTF-8 bytes, between two scalars.
    static func limited(_ value: String) -> String {
        guard value.utf8.count > valueLimit else { return value }
        let scalars = value.unicodeScalars
        var bytes = 0
        var end = scalars.startIndex
        while end != scalars.endIndex, bytes + UTF8.width(scalars[end]) <= valueLimit {
            bytes += UTF8.width(scalars[end])
            end = scalars.index(after: end)
        }
        return String(scalars[..<end])
    }

    static func withoutQuery(_ url: String) -> String {
        guard let mark = url.firstIndex(of: "?") else { return url }
        return String(url[..<mark])
    }

    /// Host and port of an absolute `http(s)://` URL (the scheme's port when none is written), as the request
    /// target parser (`RequestTarget`) reads it.
    public static func hostAndPort(_ url: String) -> (String, Int)? {
        guard let target = RequestTarget.parse(url), case .absolute(let scheme, let host, let port) = target.form
        else { return nil }
        return (host, port ?? (scheme == "https" ? 443 : 80))
    }

    /// `host[:port]` or `[v6][:port]` (a `Host` header, a socket address as NIO prints it) as host and port, as
    /// `RequestTarget.parseAuthority` reads it; nil when malformed.
    public static func split(authority: Substring) -> (String, Int?)? {
        RequestTarget.parseAuthority(String(authority)).map { ($0.host, $0.port) }
    }
}
