import BackstopTestSupport
import Foundation
import Testing

/// Streaming both ways with bounded memory: the daemon runs as its own process so its RSS is its own.
@Suite("Streaming", .serialized)
struct StreamingTests {
    /// Starts the built daemon with one upstream `app.test` → origin and returns it with its proxy port.
    private func startDaemon(
        origin: TestOrigin, directory: String, extra: String = ""
    ) async throws
        -> (DaemonProcess, Int)
    {
        let port = try FreePort.reserveClosedPort()
        let configPath = directory + "/backstop.yaml"
        try """
        version: 1
        listen: [127.0.0.1:\(port)]
        log: {level: warning}
        limits: {max_request_body: 64MiB}
        upstreams:
          - name: app
            match: {hosts: [app.test]}
            url: \(origin.baseURL)
        \(extra)
        """.write(toFile: configPath, atomically: true, encoding: .utf8)
        let daemon = try DaemonProcess.start(
            binary: DaemonProcess.binaryPath(), arguments: ["run", "--config", configPath])
        try await daemon.waitUntilListening(port: port)
        return (daemon, port)
    }

    @Test("64 MiB responses (content-length and chunked) arrive byte-exact under 128 MiB daemon RSS")
    func largeResponses() async throws {
        let size = 64 << 20
        let directory = try TestFiles.makeTemporaryDirectory()
        defer { TestFiles.remove(directory) }
        let origin = try await TestOrigin.start { request in
            .stream(
                status: 200, headers: [], totalBytes: size, chunkSize: 256 << 10, chunked: request.uri == "/chunked")
        }
        let (daemon, port) = try await startDaemon(origin: origin, directory: directory)
        for path in ["/length", "/chunked"] {
            let response = try await RawHTTP.exchange(
                port: port, request: RawHTTP.request("GET", "http://app.test\(path)", host: "app.test"),
                timeout: .seconds(120))
            #expect(response.status == 200)
            #expect(response.body.count == size)
            #expect(TestPattern.verify(response.body, expectedLength: size), "\(path) body differs")
            if path == "/length" { #expect(response.header("Content-Length") == String(size)) }
        }
        let peak = try #require(daemon.peakRSS)
        #expect(peak < 128 << 20, "daemon peak RSS \(peak >> 20) MiB")
        await daemon.stop()
        try await origin.shutdown()
    }

    @Test("a slow reader still gets every byte while daemon memory stays bounded")
    func slowReader() async throws {
        let size = 24 << 20
        let directory = try TestFiles.makeTemporaryDirectory()
        defer { TestFiles.remove(directory) }
        let origin = try await TestOrigin.start { _ in
            .stream(status: 200, headers: [], totalBytes: size, chunkSize: 64 << 10, chunked: false)
        }
        let (daemon, port) = try await startDaemon(origin: origin, directory: directory)
        let baseline = try #require(daemon.currentRSS)
        let response = try await RawHTTP.exchange(
            port: port, request: RawHTTP.request("GET", "http://app.test/slow", host: "app.test"),
            timeout: .seconds(120), readDelayPerChunk: .milliseconds(1))
        #expect(response.body.count == size)
        #expect(TestPattern.verify(response.body, expectedLength: size))
        let peak = try #require(daemon.peakRSS)
        // The whole body never sits in the daemon: growth stays far below the body size.
        #expect(
            peak - baseline < 16 << 20, "daemon grew by \((peak - baseline) >> 20) MiB for a \(size >> 20) MiB body")
        await daemon.stop()
        try await origin.shutdown()
    }

    @Test(
        "a client reading steadily is progress for timeouts.idle: a 12 MiB body read at ~1.6 MB/s with idle 500ms arrives whole; one that reads nothing is cut"
    )
    func steadyReaderIsNotIdle() async throws {
        // Before the fix the loopback socket took ~4.8 MB at once (more than a 4 MiB body: why this one is larger)
        // and then said nothing until ~1.1 MB had drained, 0.7 s at this pace: the response was cut as idle.
        let size = 12 << 20
        let stalledSize = 64 << 20
        try await withOriginAndProxy(
            origin: { request in
                .stream(
                    status: 200, headers: [], totalBytes: request.uri.contains("stalled") ? stalledSize : size,
                    chunkSize: 64 << 10, chunked: false)
            },
            config: { singleUpstreamConfig($0, extra: "    timeouts: {idle: 500ms}") }
        ) { _, proxy in
            let response = try await RawHTTP.exchange(
                port: proxy.port, request: RawHTTP.request("GET", "http://app.test/steady", host: "app.test"),
                timeout: .seconds(60), readDelayPerChunk: .milliseconds(10))
            #expect(response.status == 200)
            #expect(response.body.count == size, "cut after \(response.body.count) bytes")
            #expect(TestPattern.verify(response.body, expectedLength: size))

            // A client that takes nothing is still idle: its 64 MiB response is cut once the kernel buffers are full
            // and 500 ms pass, its connection closed.
            let stalled = try BlockingSocket(port: proxy.port)
            #expect(stalled.send("GET http://app.test/stalled HTTP/1.1\r\nHost: app.test\r\n\r\n"))
            for open in [1, 0] {
                try await Poll.until(
                    "\(open) client connection(s) open", within: .seconds(10), every: .milliseconds(20)
                ) {
                    proxy.server.metricsText().contains("\nbackstop_client_connections \(open)\n")
                }
            }
            let fd = stalled.fd
            let received = try await BlockingSocket.onThread { () -> Int in
                // What the kernel held for it, then the close: read on a thread of its own (a blocking read).
                var buffer = [UInt8](repeating: 0, count: 64 << 10)
                var total = 0
                var info = timeval(tv_sec: 20, tv_usec: 0)
                setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &info, socklen_t(MemoryLayout<timeval>.size))
                while case let n = recv(fd, &buffer, buffer.count, 0), n > 0 { total += n }
                return total
            }()
            withExtendedLifetime(stalled) {}
            #expect(received > 0 && received < stalledSize, "\(received) bytes of \(stalledSize)")
        }
    }

    @Test("the first byte of a slow stream reaches the client before the upstream finishes")
    func firstByteEarly() async throws {
        let chunks = (0..<6).map { Array("chunk-\($0);".utf8) }
        try await withOriginAndProxy(
            origin: { _ in .chunked(status: 200, headers: [], chunks: chunks, interval: .milliseconds(400)) },
            config: { singleUpstreamConfig($0) }
        ) { _, proxy in
            let connection = try await RawHTTPConnection.connect(port: proxy.port)
            try await connection.send(RawHTTP.request("GET", "http://app.test/s", host: "app.test"))
            let head = try await connection.waitForResponseHead(timeout: .seconds(5))
            #expect(head.status == 200)
            try await connection.waitForBodyBytes(atLeast: 1, timeout: .seconds(5))
            // The upstream needs ≥ 2 s for all chunks; the response must still be incomplete now.
            #expect(connection.responsesReceived == 0)
            let full = try await connection.nextResponse(timeout: .seconds(10))
            #expect(full.bodyString == chunks.map { String(decoding: $0, as: UTF8.self) }.joined())
            await connection.close()
        }
    }

    @Test("a 32 MiB upload streams to the upstream intact")
    func largeUpload() async throws {
        let size = 32 << 20
        let payload = TestPattern.bytes(count: size)
        try await withOriginAndProxy(
            origin: { request in
                .text(200, "got \(request.body.count) ok=\(TestPattern.verify(request.body, expectedLength: size))")
            },
            config: { singleUpstreamConfig($0, extra: "limits: {max_request_body: 64MiB}") }
        ) { origin, proxy in
            let response = try await RawHTTP.exchange(
                port: proxy.port,
                request: RawHTTP.request("PUT", "http://app.test/upload", host: "app.test", body: payload),
                timeout: .seconds(120))
            #expect(response.status == 200)
            #expect(response.bodyString == "got \(size) ok=true")
            #expect(origin.requests.first?.header("Content-Length") == String(size))
        }
    }
}
