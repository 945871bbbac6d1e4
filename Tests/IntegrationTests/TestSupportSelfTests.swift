import BackstopTestSupport
import Foundation
import Testing

/// Proves the test origin and raw client behave as the proxy tests assume.
@Suite("Test support self-tests")
struct TestSupportSelfTests {
    private let timeout: Duration = .seconds(10)

    @Test func respondRecordsTheRequestAndAnswersWithContentLength() async throws {
        let origin = try await TestOrigin.start { _ in .text(201, "hello", headers: [("X-Origin", "yes")]) }
        let request = RawHTTP.request(
            "POST", "/a/b?q=1&q=2", headers: [("X-Test", "one"), ("x-test", "two")], body: Array("payload".utf8))
        let response = try await RawHTTP.exchange(port: origin.port, request: request, timeout: timeout)
        try await origin.shutdown()

        #expect(response.status == 201)
        #expect(response.bodyString == "hello")
        #expect(response.header("content-length") == "5")
        #expect(response.header("X-ORIGIN") == "yes")
        let recorded = try #require(origin.requests.first)
        #expect(recorded.index == 0)
        #expect(recorded.method == "POST")
        #expect(recorded.uri == "/a/b?q=1&q=2")
        #expect(recorded.version == "HTTP/1.1")
        #expect(recorded.headers(named: "X-TEST") == ["one", "two"])
        #expect(recorded.header("host") == "localhost")
        #expect(recorded.bodyString == "payload")
        #expect(origin.connectionCount == 1)
    }

    @Test func chunkedResponseArrivesWhole() async throws {
        let chunks = ["ab", "", "cd", "ef"].map { Array($0.utf8) }
        let origin = try await TestOrigin.start { _ in
            .chunked(status: 200, chunks: chunks, interval: .milliseconds(5))
        }
        let response = try await RawHTTP.exchange(
            port: origin.port, request: "GET / HTTP/1.1\r\nHost: x\r\n\r\n",
            timeout: timeout)
        try await origin.shutdown()
        #expect(response.header("transfer-encoding") == "chunked")
        #expect(response.bodyString == "abcdef")
    }

    @Test(arguments: [true, false])
    func streamSendsTheTestPattern(chunked: Bool) async throws {
        let size = 1024 * 1024 + 7
        let origin = try await TestOrigin.start { _ in
            .stream(status: 200, totalBytes: size, chunkSize: 50_000, chunked: chunked)
        }
        let response = try await RawHTTP.exchange(port: origin.port, request: RawHTTP.request("/big"), timeout: timeout)
        try await origin.shutdown()
        #expect(response.header("content-length") == (chunked ? nil : String(size)))
        #expect(response.body.count == size)
        #expect(TestPattern.firstMismatch(in: response.body) == nil)
        #expect(TestPattern.verify(response.body, expectedLength: size))
    }

    @Test func testPatternDetectsReorderedChunks() {
        let chunk = 64 * 1024
        let swapped = TestPattern.bytes(offset: chunk, count: chunk) + TestPattern.bytes(offset: 0, count: chunk)
        #expect(TestPattern.firstMismatch(in: swapped) == 0)
        #expect(!TestPattern.verify(TestPattern.bytes(count: 10), expectedLength: 11))
    }

    @Test func slowReaderStillReceivesEverything() async throws {
        let size = 256 * 1024
        let origin = try await TestOrigin.start { _ in .stream(status: 200, totalBytes: size, chunked: false) }
        let response = try await RawHTTP.exchange(
            port: origin.port, request: RawHTTP.request("/"), timeout: timeout, readDelayPerChunk: .milliseconds(2))
        try await origin.shutdown()
        #expect(TestPattern.verify(response.body, expectedLength: size))
    }

    @Test func resetIsAConnectionError() async throws {
        let origin = try await TestOrigin.start { _ in .reset }
        let error = await #expect(throws: RawHTTPError.self) {
            try await RawHTTP.exchange(port: origin.port, request: RawHTTP.request("/"), timeout: timeout)
        }
        try await origin.shutdown()
        #expect(error?.isConnectionError == true)
        #expect(origin.requestCount == 1)
    }

    @Test func hangTimesOutAndShutdownClosesTheConnection() async throws {
        let origin = try await TestOrigin.start { _ in .hang }
        let connection = try await RawHTTPConnection.connect(port: origin.port)
        let error = await #expect(throws: RawHTTPError.self) {
            try await connection.exchange(RawHTTP.request("/"), timeout: .milliseconds(200))
        }
        #expect(error == .timeout(.milliseconds(200), waitingFor: "a response"))
        #expect(try await origin.waitForRequests(1, timeout: timeout).count == 1)
        #expect(!connection.isClosed)

        try await origin.shutdown()
        try await connection.waitForClose(timeout: timeout)
        #expect(connection.isClosed)
    }

    @Test func keepAliveServesSequentialRequestsOnOneConnection() async throws {
        let origin = try await TestOrigin.start(
            script: TestOrigin.sequence([.text(503, "busy"), .text(429, "slow down")], then: .text(200, "ok")))
        let connection = try await RawHTTPConnection.connect(port: origin.port)
        var statuses: [Int] = []
        for path in ["/1", "/2", "/3"] {
            statuses.append(try await connection.exchange(RawHTTP.request(path), timeout: timeout).status)
        }
        await connection.close()
        try await origin.shutdown()
        #expect(statuses == [503, 429, 200])
        #expect(origin.connectionCount == 1)
        #expect(origin.requests.map(\.index) == [0, 1, 2])
        #expect(origin.requests.map(\.uri) == ["/1", "/2", "/3"])
        #expect(Set(origin.requests.map(\.connectionID)).count == 1)
    }

    @Test func pipelinedRequestsAreAnsweredInOrder() async throws {
        let origin = try await TestOrigin.start { request in .text(200, request.uri) }
        let responses = try await RawHTTP.exchangeMany(
            port: origin.port, requests: ["/a", "/b", "/c"].map { RawHTTP.request($0) }, timeout: timeout)
        try await origin.shutdown()
        #expect(responses.map(\.bodyString) == ["/a", "/b", "/c"])
        #expect(origin.connectionCount == 1)
    }

    @Test func connectionCloseIsHonoured() async throws {
        let origin = try await TestOrigin.start { _ in .text(200, "bye") }
        let connection = try await RawHTTPConnection.connect(port: origin.port)
        let response = try await connection.exchange(
            RawHTTP.request("/", headers: [("Connection", "close")]), timeout: timeout)
        try await connection.waitForClose(timeout: timeout)
        try await origin.shutdown()
        #expect(response.header("connection") == "close")
        #expect(response.bodyString == "bye")
    }

    @Test func closeDelimitedBodyEndsAtClose() async throws {
        let origin = try await TestOrigin.start { _ in .closeDelimited(status: 200, body: Array("until close".utf8)) }
        let response = try await RawHTTP.exchange(port: origin.port, request: RawHTTP.request("/"), timeout: timeout)
        try await origin.shutdown()
        #expect(response.header("content-length") == nil)
        #expect(response.header("transfer-encoding") == nil)
        #expect(response.bodyString == "until close")
    }

    @Test func headResponsesCarryNoBody() async throws {
        let origin = try await TestOrigin.start { _ in .text(200, "not sent") }
        let connection = try await RawHTTPConnection.connect(port: origin.port)
        let head = try await connection.exchange(RawHTTP.request("HEAD", "/"), timeout: timeout)
        let get = try await connection.exchange(RawHTTP.request("GET", "/"), timeout: timeout)
        await connection.close()
        try await origin.shutdown()
        #expect(head.header("content-length") == "8")
        #expect(head.body.isEmpty)
        #expect(get.bodyString == "not sent")
    }

    @Test func delayedResponseHeadArrivesBeforeSlowBody() async throws {
        let origin = try await TestOrigin.start { _ in
            .delay(.milliseconds(20), then: .chunked(status: 200, chunks: [[1], [2]], interval: .seconds(30)))
        }
        let connection = try await RawHTTPConnection.connect(port: origin.port)
        try await connection.send(RawHTTP.request("/"))
        let head = try await connection.waitForResponseHead(timeout: timeout)
        try await connection.waitForBodyBytes(atLeast: 1, timeout: timeout)
        #expect(head.status == 200)
        #expect(connection.responsesReceived == 0)
        await connection.close()
        try await origin.shutdown()
    }

    @Test func largeUploadWithExpectContinueIsRecorded() async throws {
        let upload = TestPattern.bytes(count: 3 * 1024 * 1024)
        let origin = try await TestOrigin.start { request in .text(200, String(request.body.count)) }
        let request = RawHTTP.request("PUT", "/up", headers: [("Expect", "100-continue")], body: upload)
        let response = try await RawHTTP.exchange(port: origin.port, request: request, timeout: timeout)
        try await origin.shutdown()
        #expect(response.status == 200)
        #expect(response.bodyString == String(upload.count))
        #expect(origin.requests.first?.body == upload)
    }

    @Test func waitForRequestsThrowsOnTimeout() async throws {
        let origin = try await TestOrigin.start { _ in .text(200, "") }
        await #expect(throws: TestOriginError.self) {
            try await origin.waitForRequests(1, timeout: .milliseconds(50))
        }
        try await origin.shutdown()
    }

    @Test func reservedClosedPortRefusesConnections() async throws {
        let port = try FreePort.reserveClosedPort()
        let error = await #expect(throws: RawHTTPError.self) {
            try await RawHTTPConnection.connect(port: port)
        }
        guard case .connectFailed = error else {
            Issue.record("expected connectFailed, got \(String(describing: error))")
            return
        }
    }

    @Test func slowReaderHoldsTheStreamingOriginBack() async throws {
        let size = 32 * 1024 * 1024
        let origin = try await TestOrigin.start { _ in .stream(status: 200, totalBytes: size, chunked: true) }
        let connection = try await RawHTTPConnection.connect(port: origin.port, readDelayPerChunk: .milliseconds(5))
        try await connection.send(RawHTTP.request("/"))
        try await connection.waitForBodyBytes(atLeast: 256 * 1024, timeout: timeout)
        let sent = origin.bodyBytesSent
        await connection.close()
        try await origin.shutdown()
        // Socket buffers hold a few MiB at most; an origin ignoring backpressure would be done by now.
        #expect(sent < size / 2, "origin wrote \(sent) bytes")
        #expect(sent >= 256 * 1024)
    }

    @Test func unixSocketExchanges() async throws {
        let directory = try TestFiles.makeTemporaryDirectory()
        defer { TestFiles.remove(directory) }
        let path = directory + "/origin.sock"
        let origin = try await TestOrigin.start(unixPath: path) { request in .text(200, "unix " + request.uri) }
        let single = try await RawHTTP.exchange(unixPath: path, request: RawHTTP.request("/one"), timeout: timeout)
        let many = try await RawHTTP.exchangeMany(
            unixPath: path, requests: [RawHTTP.request("/a"), RawHTTP.request("/b")], timeout: timeout)
        try await origin.shutdown()
        #expect(single.bodyString == "unix /one")
        #expect(many.map(\.bodyString) == ["unix /a", "unix /b"])
        #expect(origin.connectionCount == 2)
    }

    @Test func tlsOriginIsTrustedThroughTheGeneratedCA() async throws {
        let directory = try TestFiles.makeTemporaryDirectory()
        defer { TestFiles.remove(directory) }
        let certificates = try TestCertificates.generate(in: directory)
        let origin = try await TestOrigin.start(tls: certificates.serverIdentity) { _ in .text(200, "secure") }

        let trusted = try await TestProcess.run(
            "/usr/bin/curl", ["-sS", "--max-time", "10", "--cacert", certificates.caCertPath, origin.baseURL + "/x"])
        let untrusted = try await TestProcess.run("/usr/bin/curl", ["-sS", "--max-time", "10", origin.baseURL + "/x"])
        try await origin.shutdown()

        #expect(origin.baseURL == "https://localhost:\(origin.port)")
        #expect(trusted.status == 0, "\(trusted.standardError)")
        #expect(trusted.standardOutput == "secure")
        #expect(untrusted.status != 0)
        #expect(origin.requests.map(\.uri) == ["/x"])
    }

    @Test("ChildProcess: 1 MiB of stdin through cat comes back whole, stderr apart, the exit code kept")
    func childProcessPipes() throws {
        let input = (0..<(1 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 2_654_435_761 >> 13) }
        let child = try ChildProcess.spawn(
            "/bin/sh", ["-c", "cat; echo problem >&2; exit 3"], standardInput: .bytes(input), standardOutput: .pipe,
            standardError: .pipe)
        let outputs = child.readOutputs(within: .seconds(60))
        #expect(!outputs.timedOut)
        #expect(outputs.standardOutput == input)
        #expect(String(decoding: outputs.standardError, as: UTF8.self) == "problem\n")
        #expect(child.terminationStatus == 3)
        #expect(!child.killedBySignal)
    }

    @Test("ChildProcess: past its time limit the child is killed, and what it wrote before is kept")
    func childProcessTimeLimit() throws {
        let child = try ChildProcess.spawn(
            "/bin/sh", ["-c", "echo before; exec sleep 30"], standardOutput: .pipe, standardError: .null)
        let started = ContinuousClock.now
        let outputs = child.readOutputs(within: .milliseconds(300))
        #expect(ContinuousClock.now - started < .seconds(10))
        #expect(outputs.timedOut)
        #expect(String(decoding: outputs.standardOutput, as: UTF8.self) == "before\n")
        #expect(child.killedBySignal)
        #expect(child.terminationStatus == SIGKILL)
    }

    @Test("ChildProcess: the time limit holds for a child that closed its output but runs on")
    func childProcessTimeLimitWithoutOutput() throws {
        let child = try ChildProcess.spawn(
            "/bin/sh", ["-c", "exec >&- 2>&-; exec sleep 30"], standardOutput: .pipe, standardError: .null)
        let started = ContinuousClock.now
        let outputs = child.readOutputs(within: .milliseconds(300))
        #expect(ContinuousClock.now - started < .seconds(10))
        #expect(outputs.timedOut)
        #expect(child.killedBySignal)
    }

    @Test("ChildProcess: the child inherits no descriptor of the test process beyond its three streams")
    func childProcessInheritsNothing() throws {
        let leaked = open("/dev/null", O_RDONLY)  // no O_CLOEXEC: exec alone would pass it on
        #expect(leaked > 2)
        defer { close(leaked) }
        let child = try ChildProcess.spawn("/bin/ls", ["/proc/self/fd"], standardOutput: .pipe, standardError: .null)
        let outputs = child.readOutputs(within: .seconds(30))
        let descriptors = Set(String(decoding: outputs.standardOutput, as: UTF8.self).split(separator: "\n"))
        #expect(child.terminationStatus == 0)
        #expect(descriptors.isSuperset(of: ["0", "1", "2"]))
        // ls itself opens the directory it lists (the lowest free number, 3); nothing else may be there.
        #expect(descriptors.subtracting(["0", "1", "2", "3"]).isEmpty, "\(descriptors.sorted())")
        #expect(!descriptors.contains("\(leaked)") || leaked == 3)
    }
}
