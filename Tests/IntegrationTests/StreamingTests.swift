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
