/// One-shot raw HTTP exchanges: bytes go out exactly as given, responses come back decoded.
public enum RawHTTP {
    /// Connects, sends `request`, reads one response and closes. `timeout` covers the whole exchange.
    public static func exchange(
        host: String = "127.0.0.1",
        port: Int,
        request: [UInt8],
        timeout: Duration,
        readDelayPerChunk: Duration = .zero
    ) async throws -> RawHTTPResponse {
        let deadline = Deadline(timeout)
        let connection = try await RawHTTPConnection.connect(
            host: host, port: port, readDelayPerChunk: readDelayPerChunk, connectTimeout: timeout)
        return try await exchange(on: connection, requests: [request], deadline: deadline)[0]
    }

    /// `exchange` with the UTF-8 bytes of `request`.
    public static func exchange(
        host: String = "127.0.0.1",
        port: Int,
        request: String,
        timeout: Duration,
        readDelayPerChunk: Duration = .zero
    ) async throws -> RawHTTPResponse {
        try await exchange(
            host: host, port: port, request: Array(request.utf8), timeout: timeout,
            readDelayPerChunk: readDelayPerChunk)
    }

    /// `exchange` over a unix-domain socket.
    public static func exchange(
        unixPath: String,
        request: [UInt8],
        timeout: Duration,
        readDelayPerChunk: Duration = .zero
    ) async throws -> RawHTTPResponse {
        let deadline = Deadline(timeout)
        let connection = try await RawHTTPConnection.connect(
            unixPath: unixPath, readDelayPerChunk: readDelayPerChunk, connectTimeout: timeout)
        return try await exchange(on: connection, requests: [request], deadline: deadline)[0]
    }

    /// Sends all `requests` pipelined on one connection and returns their responses in order.
    public static func exchangeMany(
        host: String = "127.0.0.1",
        port: Int,
        requests: [[UInt8]],
        timeout: Duration,
        readDelayPerChunk: Duration = .zero
    ) async throws -> [RawHTTPResponse] {
        let deadline = Deadline(timeout)
        let connection = try await RawHTTPConnection.connect(
            host: host, port: port, readDelayPerChunk: readDelayPerChunk, connectTimeout: timeout)
        return try await exchange(on: connection, requests: requests, deadline: deadline)
    }

    /// `exchangeMany` over a unix-domain socket.
    public static func exchangeMany(
        unixPath: String,
        requests: [[UInt8]],
        timeout: Duration,
        readDelayPerChunk: Duration = .zero
    ) async throws -> [RawHTTPResponse] {
        let deadline = Deadline(timeout)
        let connection = try await RawHTTPConnection.connect(
            unixPath: unixPath, readDelayPerChunk: readDelayPerChunk, connectTimeout: timeout)
        return try await exchange(on: connection, requests: requests, deadline: deadline)
    }

    /// Builds request bytes: `METHOD target HTTP/1.1`, `Host`, the given headers, then `Content-Length` for a body
    /// unless `headers` already frame it.
    public static func request(
        _ method: String,
        _ target: String,
        host: String = "localhost",
        headers: [(String, String)] = [],
        body: [UInt8]? = nil
    ) -> [UInt8] {
        var text = "\(method) \(target) HTTP/1.1\r\nHost: \(host)\r\n"
        for (name, value) in headers {
            text += "\(name): \(value)\r\n"
        }
        let framed =
            HeaderLookup.contains("content-length", in: headers)
            || HeaderLookup.contains("transfer-encoding", in: headers)
        if let body, !framed {
            text += "Content-Length: \(body.count)\r\n"
        }
        text += "\r\n"
        return Array(text.utf8) + (body ?? [])
    }

    /// A `GET` request for `target`; see `request(_:_:host:headers:body:)`.
    public static func request(
        _ target: String, host: String = "localhost", headers: [(String, String)] = []
    )
        -> [UInt8]
    {
        request("GET", target, host: host, headers: headers)
    }

    private static func exchange(
        on connection: RawHTTPConnection, requests: [[UInt8]], deadline: Deadline
    ) async throws -> [RawHTTPResponse] {
        do {
            try await connection.sendPipelined(requests)
            var responses: [RawHTTPResponse] = []
            for _ in requests {
                responses.append(try await connection.nextResponse(timeout: deadline.remaining))
            }
            await connection.close()
            return responses
        } catch {
            await connection.close()
            throw error
        }
    }
}

/// A point in time a multi-step operation must finish by.
struct Deadline {
    let instant: ContinuousClock.Instant
    let total: Duration

    init(_ total: Duration) {
        self.total = total
        self.instant = .now.advanced(by: total)
    }

    var remaining: Duration {
        max(.zero, ContinuousClock.now.duration(to: instant))
    }
}
