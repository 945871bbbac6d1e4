import NIOCore

/// Carries out one `OriginAction` on a connection.
///
/// Every write is awaited before the next is produced: with at most one chunk in flight, a slow reader stalls the
/// generator instead of letting the outbound buffer grow.
struct OriginResponder {
    /// What the connection does after the action.
    enum Outcome {
        case keepAlive
        case close
        case hang
    }

    let channel: any Channel
    let request: RecordedRequest
    let state: OriginState

    private var requestWantsClose: Bool {
        if HeaderLookup.hasCloseToken(in: request.headers.map { ($0.name, $0.value) }) {
            return true
        }
        let keepAliveRequested = HeaderLookup.hasToken(
            "keep-alive", inHeader: "connection", of: request.headers.map { ($0.name, $0.value) })
        return request.version == "HTTP/1.0" && !keepAliveRequested
    }

    private var isHead: Bool {
        request.method == "HEAD"
    }

    func perform(_ action: OriginAction) async throws -> Outcome {
        switch action {
        case .respond(let status, let headers, let body):
            return try await respond(status: status, headers: headers, body: body)
        case .chunked(let status, let headers, let chunks, let interval):
            return try await chunked(status: status, headers: headers, chunks: chunks, interval: interval)
        case .stream(let status, let headers, let totalBytes, let chunkSize, let chunked, let interval):
            return try await stream(
                status: status, headers: headers, totalBytes: totalBytes,
                chunkSize: chunkSize, chunked: chunked, interval: interval)
        case .closeDelimited(let status, let headers, let body):
            var all = headers
            if !HeaderLookup.contains("connection", in: all) {
                all.append(("Connection", "close"))
            }
            var buffer = ResponseHead.encode(status: status, headers: all, allocator: channel.allocator)
            let bodyCount = isHead ? 0 : body.count
            buffer.writeBytes(body.prefix(bodyCount))
            try await channel.writeAndFlush(buffer)
            state.addBodyBytesSent(bodyCount)
            return .close
        case .raw(let bytes, let close):
            var buffer = channel.allocator.buffer(capacity: bytes.count)
            buffer.writeBytes(bytes)
            try await channel.writeAndFlush(buffer)
            return close ? .close : .keepAlive
        case .hang:
            return .hang
        case .reset:
            try await reset()
            return .close
        case .delay(let duration, let next):
            try await Task.sleep(for: duration)
            return try await perform(next)
        }
    }

    private func respond(status: Int, headers: [(String, String)], body: [UInt8]) async throws -> Outcome {
        var all = headers
        let sendsBody = ResponseHead.allowsBody(status: status)
        if sendsBody && !Self.hasFraming(all) {
            all.append(("Content-Length", String(body.count)))
        }
        let close = addConnectionClose(to: &all)
        var buffer = ResponseHead.encode(status: status, headers: all, allocator: channel.allocator)
        let bodyCount = sendsBody && !isHead ? body.count : 0
        buffer.writeBytes(body.prefix(bodyCount))
        try await channel.writeAndFlush(buffer)
        state.addBodyBytesSent(bodyCount)
        return close ? .close : .keepAlive
    }

    private func chunked(
        status: Int, headers: [(String, String)], chunks: [[UInt8]], interval: Duration
    ) async throws -> Outcome {
        var all = headers
        if !Self.hasFraming(all) {
            all.append(("Transfer-Encoding", "chunked"))
        }
        let close = addConnectionClose(to: &all)
        try await channel.writeAndFlush(ResponseHead.encode(status: status, headers: all, allocator: channel.allocator))
        guard !isHead else { return close ? .close : .keepAlive }
        var first = true
        for chunk in chunks where !chunk.isEmpty {
            if !first {
                try await sleepIfPositive(interval)
            }
            first = false
            var buffer = channel.allocator.buffer(capacity: chunk.count + 16)
            buffer.writeString(String(chunk.count, radix: 16) + "\r\n")
            buffer.writeBytes(chunk)
            buffer.writeStaticString("\r\n")
            try await channel.writeAndFlush(buffer)
            state.addBodyBytesSent(chunk.count)
        }
        try await writeLastChunk()
        return close ? .close : .keepAlive
    }

    private func stream(
        status: Int, headers: [(String, String)], totalBytes: Int, chunkSize: Int, chunked: Bool, interval: Duration
    ) async throws -> Outcome {
        precondition(chunkSize > 0, "chunkSize must be positive")
        var all = headers
        if !Self.hasFraming(all) {
            all.append(chunked ? ("Transfer-Encoding", "chunked") : ("Content-Length", String(totalBytes)))
        }
        let close = addConnectionClose(to: &all)
        try await channel.writeAndFlush(ResponseHead.encode(status: status, headers: all, allocator: channel.allocator))
        guard !isHead else { return close ? .close : .keepAlive }
        var offset = 0
        while offset < totalBytes {
            if offset > 0 {
                try await sleepIfPositive(interval)
            }
            let count = min(chunkSize, totalBytes - offset)
            var buffer = channel.allocator.buffer(capacity: count + 16)
            if chunked {
                buffer.writeString(String(count, radix: 16) + "\r\n")
            }
            TestPattern.write(into: &buffer, offset: offset, count: count)
            if chunked {
                buffer.writeStaticString("\r\n")
            }
            try await channel.writeAndFlush(buffer)
            state.addBodyBytesSent(count)
            offset += count
        }
        if chunked {
            try await writeLastChunk()
        }
        return close ? .close : .keepAlive
    }

    private func writeLastChunk() async throws {
        var buffer = channel.allocator.buffer(capacity: 5)
        buffer.writeStaticString("0\r\n\r\n")
        try await channel.writeAndFlush(buffer)
    }

    /// Closing after the response when the request asked for it, or when the script's headers said so.
    private func addConnectionClose(to headers: inout [(String, String)]) -> Bool {
        if HeaderLookup.hasCloseToken(in: headers) {
            return true
        }
        guard requestWantsClose else { return false }
        if !HeaderLookup.contains("connection", in: headers) {
            headers.append(("Connection", "close"))
        }
        return true
    }

    private func reset() async throws {
        // SO_LINGER {on, 0 s} makes close() discard unsent data and send RST instead of FIN.
        if let provider = channel as? any SocketOptionProvider {
            try await provider.setSoLinger(NIOLinger(l_onoff: 1, l_linger: 0)).get()
        }
        try await channel.close()
    }

    private static func hasFraming(_ headers: [(String, String)]) -> Bool {
        HeaderLookup.contains("content-length", in: headers) || HeaderLookup.contains("transfer-encoding", in: headers)
    }
}
