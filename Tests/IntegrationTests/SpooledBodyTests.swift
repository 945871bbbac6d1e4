import BackstopTestSupport
import Crypto
import Foundation
import Synchronization
import Testing

/// Bodies above `limits.retry_buffer` kept in the spool for retries, through the real daemon
/// (docs/reference/behaviour.md#spooled-bodies): sent again whole after a failed attempt, with the daemon's memory
/// bounded whatever the size, and nothing on disk but sealed chunks in a file without a name.
@Suite("Spooled bodies", .serialized)
struct SpooledBodyTests {
    /// An origin that reads each request's whole body, resets the first request's connection and answers later
    /// ones `200` with the SHA-256 of the body it received (hex); it keeps no request.
    final class HashingOrigin: Sendable {
        final class Count: Sendable { let value = Atomic(0) }
        let origin: TestOrigin
        private let counted = Count()
        /// Requests read whole so far.
        var count: Int { counted.value.load(ordering: .relaxed) }

        init(failFirst: Bool = true) async throws {
            let counted = self.counted
            origin = try await TestOrigin.start(keepsRequests: false) { request in
                let n = counted.value.add(1, ordering: .relaxed).newValue
                if failFirst && n == 1 { return .reset }
                let digest = SHA256.hash(data: request.body).map { String(format: "%02x", $0) }.joined()
                return .text(200, digest)
            }
        }
    }

    /// A daemon with a spool, no keychain, and upstream `big` (host `big.test`, PUT retried on a reset).
    final class Setup: Sendable {
        let directory: String
        let spool: String
        let port: Int
        let daemon: DaemonProcess

        init(origin: TestOrigin, maxBytes: String = "1GiB", maxBody: String = "300MiB") async throws {
            directory = try TestFiles.makeTemporaryDirectory(prefix: "backstop-spooled")
            // Not created here: without a keychain (so without a delivery queue) the daemon creates it itself.
            spool = directory + "/spool"
            port = try FreePort.reserveClosedPort()
            let config = directory + "/backstop.yaml"
            try """
            version: 1
            listen: [127.0.0.1:\(port)]
            log: {level: info}
            limits: {retry_buffer: 1MiB, max_request_body: \(maxBody)}
            spool: {dir: \(spool), max_bytes: \(maxBytes)}
            upstreams:
              - name: big
                match: {hosts: [big.test]}
                url: \(origin.baseURL)
                retry: {attempts: 3, methods: [PUT], backoff: {base: 10ms, max: 50ms}}
                timeouts: {per_try: 120s, total: 300s}
            """.write(toFile: config, atomically: true, encoding: .utf8)
            daemon = try DaemonProcess.start(
                binary: DaemonProcess.binaryPath(), arguments: ["run", "--config", config])
            try await daemon.waitUntilListening(port: port)
        }

        deinit { TestFiles.remove(directory) }
    }

    /// Sends a PUT of `size` bytes of `TestPattern` through the daemon in 1 MiB writes, calls `midway` once half
    /// of it is sent, and returns the response and the SHA-256 of what was sent (hex).
    static func put(
        _ size: Int, port: Int, midway: (() async throws -> Void)? = nil
    ) async throws -> (RawHTTPResponse, String) {
        let connection = try await RawHTTPConnection.connect(port: port)
        try await connection.send(
            "PUT http://big.test/upload HTTP/1.1\r\nHost: big.test\r\nContent-Length: \(size)\r\n\r\n")
        var hash = SHA256()
        var offset = 0
        let piece = 1 << 20
        while offset < size {
            let count = min(piece, size - offset)
            let bytes = TestPattern.bytes(offset: offset, count: count)
            hash.update(data: bytes)
            try await connection.send(bytes, startsRequest: false)
            offset += count
            if offset == size / 2 { try await midway?() }
        }
        let response = try await connection.nextResponse(timeout: .seconds(240))
        await connection.close()
        return (response, hash.finalize().map { String(format: "%02x", $0) }.joined())
    }

    /// Checks the daemon's files under `spool` while a body streams: no named file holds anything but the queue's,
    /// and the unnamed spool files it has open hold no run of the body's bytes. Returns how many spool files were
    /// open and their total size.
    static func scanSpool(_ setup: Setup, sentSoFar: Int) throws -> (files: Int, bytes: Int) {
        let names = try FileManager.default.contentsOfDirectory(atPath: setup.spool)
        #expect(names.allSatisfy { $0.hasPrefix("queue.") }, "named files in the spool: \(names)")
        // 64-byte runs of what was sent, at offsets inside and across chunks.
        let probes = [0, 1 << 16, (1 << 20) + 7, sentSoFar / 2 + 13, sentSoFar - 64].map {
            TestPattern.bytes(offset: $0, count: 64)
        }
        var files = 0
        var bytes = 0
        let fdDirectory = "/proc/\(setup.daemon.pid)/fd"
        for fd in try FileManager.default.contentsOfDirectory(atPath: fdDirectory) {
            guard let target = try? FileManager.default.destinationOfSymbolicLink(atPath: fdDirectory + "/" + fd),
                target.hasPrefix(setup.spool), !target.contains("queue.")
            else { continue }
            #expect(target.hasSuffix("(deleted)"), "a spool file with a name: \(target)")
            let contents = try Data(contentsOf: URL(fileURLWithPath: fdDirectory + "/" + fd))
            files += 1
            bytes += contents.count
            for probe in probes {
                #expect(contents.range(of: Data(probe)) == nil, "plaintext body bytes in the spool file")
            }
        }
        return (files, bytes)
    }

    @Test("8 MiB and 256 MiB bodies are sent again whole from the spool after a reset; daemon RSS under 60 MiB")
    func retriedFromSpool() async throws {
        for size in [8 << 20, 256 << 20] {
            let origin = try await HashingOrigin()
            let setup = try await Setup(origin: origin.origin)
            var scanned = (files: 0, bytes: 0)
            let (response, sent) = try await Self.put(size, port: setup.port) {
                // The first half went out: its sealed chunks are on disk by now (written before they are sent).
                let deadline = ContinuousClock.now + .seconds(30)
                repeat {
                    scanned = try Self.scanSpool(setup, sentSoFar: size / 2)
                    if scanned.bytes >= size / 4 { break }
                    try await Task.sleep(for: .milliseconds(20))
                } while ContinuousClock.now < deadline
            }
            #expect(scanned.files == 1 && scanned.bytes >= size / 4, "the body is in one spool file: \(scanned)")
            #expect(response.status == 200, "\(size): \(response.status) \(response.header("X-Backstop-Error") ?? "")")
            #expect(String(decoding: response.body, as: UTF8.self) == sent, "\(size) bytes arrived altered")
            #expect(response.header("X-Backstop-Attempts") == "2")
            #expect(origin.count == 2)
            let peak = try #require(setup.daemon.peakRSS)
            #expect(peak < 60 << 20, "\(size >> 20) MiB body: daemon peak RSS \(peak >> 20) MiB")
            // The request ended: its spool file is gone once the exchange lets go of the body, which can be just
            // after the client read the last byte of the response.
            try await Poll.until("the spool file closed after the \(size >> 20) MiB request", within: .seconds(10)) {
                try Self.scanSpool(setup, sentSoFar: size).files == 0
            }
            await setup.daemon.stop()
            try await origin.origin.shutdown()
        }
    }

    @Test("a body that does not fit spool.max_bytes beside another streams once, unkept, and is not retried")
    func doesNotFit() async throws {
        let origin = try await HashingOrigin()
        let setup = try await Setup(origin: origin.origin, maxBytes: "8MiB", maxBody: "7MiB")
        let size = 6 << 20
        var refused: RawHTTPResponse?
        // While the first body holds 6 MiB of the 8 MiB budget, a second one of 6 MiB cannot be spooled: it
        // streams, the origin resets it (the first request it reads whole), and it is not sent again.
        let (first, sent) = try await Self.put(size, port: setup.port) {
            // The first body's reservation exists once its spool file does (the half sent so far may still be in
            // the socket's buffer, not yet read by the daemon).
            try await Poll.until("the first body is being spooled", within: .seconds(10)) {
                try Self.scanSpool(setup, sentSoFar: size / 2).files == 1
            }
            refused = try await Self.put(size, port: setup.port).0
        }
        let second = try #require(refused)
        #expect(second.status == 502, "\(second.status) \(second.header("X-Backstop-Error") ?? "")")
        #expect(second.header("X-Backstop-Attempts") == "1")
        #expect(first.status == 200)
        #expect(String(decoding: first.body, as: UTF8.self) == sent)
        #expect(origin.count == 2)
        await setup.daemon.stop()
        try await origin.origin.shutdown()
    }
}
