import BackstopCore
import Logging
import NIOCore

/// One access line per client request, whoever answered it: an upstream, or Backstop itself (a refusal, a local
/// error, a timeout). Field names are documented in docs/reference/operations.md#logs.
struct AccessRecord {
    /// Who asked for what: known when the request head arrives.
    struct Request {
        /// The client's address (`127.0.0.1:53210`, `[::1]:53210`, `unix`).
        var client: String
        var method: String
        /// The URL host (absolute form) or the `Host` header (origin form); `-` when there is none.
        var host: String
        /// The path without its query (a query may carry secrets).
        var path: String
        /// The `clients` entry that allowed the request (docs/reference/config.md#clients); nil without `clients`.
        var clientEntry: String? = nil
        /// The queued delivery the request stored (its `202`) or sends (the deliverer's try); nil otherwise.
        var delivery: String? = nil
    }

    var request: Request
    var status: Int
    /// The `X-Backstop-Error` reason, or what ended the response early (`client-closed`, …).
    var error: String?
    /// Why the last attempt failed, for people: curl's error, errno, the address tried.
    var reason: String?
    var upstream: String
    var attempts: Int
    /// The `retry.on` conditions that caused retries, in order.
    var retries: [String]
    var elapsed: Duration
    /// Response body bytes sent to the client.
    var bytes: Int
    /// The endpoint whose response was delivered, or whose attempt failed last (`scheme://host:port`); nil when no
    /// attempt was made (docs/reference/operations.md#logs).
    var endpoint: String? = nil

    /// The metadata of the `request` log line.
    var metadata: Logger.Metadata {
        var metadata: Logger.Metadata = [
            "client": .string(request.client),
            "method": .string(request.method),
            "host": .string(request.host),
            "path": .string(request.path),
            "status": .stringConvertible(status),
            "upstream": .string(upstream),
            "attempts": .stringConvertible(attempts),
            "ms": .stringConvertible(Milliseconds(elapsed)),
            "bytes": .stringConvertible(bytes),
        ]
        if let entry = request.clientEntry { metadata["client_entry"] = .string(entry) }
        if let endpoint { metadata["endpoint"] = .string(endpoint) }
        if let delivery = request.delivery { metadata["delivery"] = .string(delivery) }
        if let error { metadata["error"] = .string(error) }
        if let reason { metadata["reason"] = .string(reason) }
        if !retries.isEmpty { metadata["retries"] = .string(retries.joined(separator: ",")) }
        return metadata
    }

    /// The path of a request-target without its query: `/a/b?q` → `/a/b`, `http://h/a?q` → `/a`.
    static func path(of uri: String) -> String {
        if let target = RequestTarget.parse(uri) {
            switch target.form {
            case .origin, .absolute: return target.path
            case .asterisk, .authority: return "-"
            }
        }
        let withoutQuery = uri.firstIndex(of: "?").map { String(uri[..<$0]) } ?? uri
        // Never log what could not be parsed as is: control characters, overlong junk, and any target that is not
        // a path (an absolute URL refused for its `user:password@` would log the password; it goes into spans too).
        return withoutQuery.hasPrefix("/") && withoutQuery.utf8.count <= 256
            && withoutQuery.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F }) ? withoutQuery : "-"
    }
}

/// A duration in milliseconds with one decimal (`12.3`); a number in JSON logs.
struct Milliseconds: CustomStringConvertible, LogNumber {
    let tenths: Int64
    init(_ amount: Duration) { tenths = amount.nanosecondsClamped / 100_000 }
    var description: String { "\(tenths / 10).\(tenths % 10)" }
}

/// Metadata values that JSON log lines write as numbers rather than strings.
protocol LogNumber: CustomStringConvertible, Sendable {}
extension Int: LogNumber {}
extension Int64: LogNumber {}
extension UInt64: LogNumber {}
extension Int32: LogNumber {}
extension Double: LogNumber {}

extension ProxyRuntime {
    /// Writes the access line when `log.access_log` is on. The record is built only then: building it copies the
    /// request's strings, which a proxy with the access log off would pay on every request for nothing.
    func logAccess(_ record: @autoclosure () -> AccessRecord, enabled: Bool) {
        guard enabled else { return }
        logger.info("request", metadata: record().metadata)
    }
}

extension SocketAddress {
    /// `127.0.0.1:8080`, `[::1]:8080` or `unix:/path`, as people write addresses (NIO's own description adds
    /// the family and repeats the host).
    public var displayString: String {
        switch self {
        case .v4: "\(ipAddress ?? "?"):\(port ?? 0)"
        case .v6: "[\(ipAddress ?? "?")]:\(port ?? 0)"
        case .unixDomainSocket: "unix:\(pathname ?? "")"
        }
    }
}
