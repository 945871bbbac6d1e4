import BackstopTestSupport
import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// What a newcomer and an operator read from the binary, checked against the binary and the docs: sample configs
/// that take their ports from the environment, a bind failure that names the address, `check` refusing values that
/// could not be sent, the `ca init` messages and `X-Backstop-Attempts` as the docs quote them.
@Suite("Operator messages")
struct OperatorMessagesTests {
    private let binary = DaemonProcess.binaryPath()
    private static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().path

    /// `binary` with `variables` added to this process's environment.
    private func run(_ arguments: [String], _ variables: [String: String] = [:]) async throws -> TestProcessResult {
        try await TestProcess.run("/usr/bin/env", variables.map { "\($0)=\($1)" }.sorted() + [binary] + arguments)
    }

    private func writeConfig(_ text: String, in directory: String) throws -> String {
        let path = directory + "/backstop.yaml"
        try text.write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    // MARK: ports from the environment (README, config/backstop.yaml, config/tour.yaml)

    @Test(
        "the sample config and the tour listen where BACKSTOP_LISTEN and BACKSTOP_ADMIN say; the tour's origins follow TOUR_*_PORT"
    )
    func samplePortsFromEnvironment() async throws {
        for sample in ["config/backstop.yaml", "config/tour.yaml"] {
            let directory = try TestFiles.makeTemporaryDirectory()
            defer { TestFiles.remove(directory) }
            // A copy: the sample's keychain (state/…) is created next to the config, not in the repository.
            let path = try writeConfig(String(contentsOfFile: Self.root + "/" + sample, encoding: .utf8), in: directory)
            let (port, admin) = (try FreePort.reserveClosedPort(), try FreePort.reserveClosedPort())
            let origin = try await TestOrigin.start { _ in .text(200, "tour origin") }
            let variables = [
                "BACKSTOP_LISTEN": "127.0.0.1:\(port)", "BACKSTOP_ADMIN": "127.0.0.1:\(admin)",
                "TOUR_FILES_PORT": "\(origin.port)", "TOUR_FLAKY_PORT": "\(origin.port)",
            ]
            let check = try await run(["check", "--config", path], variables)
            #expect(check.standardOutput == "ok\n", "\(sample): \(check.standardOutput)\(check.standardError)")
            let daemon = try DaemonProcess.start(
                binary: "/usr/bin/env", arguments: variables.map { "\($0)=\($1)" } + [binary, "run", "--config", path])
            do {
                try await daemon.waitUntilListening(port: port)
                try await daemon.waitUntilListening(port: admin)
                // The start line may reach the pipe after the sockets accept connections.
                try? await daemon.waitForOutput(timeout: .seconds(5)) { $0.contains("listeners=127.0.0.1:\(port)") }
                #expect(daemon.output.contains("listeners=127.0.0.1:\(port)"), "\(daemon.output)")
                if sample.hasSuffix("tour.yaml") {
                    let response = try await RawHTTP.exchange(
                        port: port,
                        request: RawHTTP.request("GET", "http://files.local/README.md", host: "files.local"),
                        timeout: .seconds(10))
                    #expect(response.bodyString == "tour origin")
                }
            } catch {
                Issue.record("\(sample): \(error)")
            }
            await daemon.stop()
            try await origin.shutdown()
        }
    }

    @Test("check: an unset variable without a default, or a malformed reference, is FILE:LINE:COLUMN and exit 1")
    func variableErrors() async throws {
        let directory = try TestFiles.makeTemporaryDirectory()
        defer { TestFiles.remove(directory) }
        let path = try writeConfig(
            "version: 1\nlisten: [\"${SECMISC_UNSET_LISTEN}\"]\nadmin: {listen: \"${X\"}\n", in: directory)
        let result = try await run(["check", "--config", path])
        #expect(result.status == 1)
        let lines = result.standardOutput.split(separator: "\n").map(String.init)
        #expect(
            lines.first
                == "\(path):2:10: 'listen[]': environment variable SECMISC_UNSET_LISTEN is not set (give a default with ${SECMISC_UNSET_LISTEN:-VALUE})",
            "\(lines)")
        #expect(
            lines.dropFirst().first
                == "\(path):3:17: 'admin.listen': '${X' is not a variable reference: write ${NAME} or "
                + "${NAME:-default} (NAME: letters, digits, _), or $${ for a literal ${", "\(lines)")
        #expect(lines.count == 2, "\(lines)")
    }

    // MARK: check refusals (issue 25, finding 11)

    @Test(
        "check refuses CR LF in auth.scheme and a wildcard over a public suffix, each at its value; the list must be there"
    )
    func checkRefusals() async throws {
        let directory = try TestFiles.makeTemporaryDirectory()
        defer { TestFiles.remove(directory) }
        let path = try writeConfig(
            """
            version: 1
            listen: [127.0.0.1:18080]
            keychain: {path: kc.bkc, key_file: kc.key}
            intercept: {}
            upstreams:
              - name: api
                match: {hosts: [api.example.com, "*.com"]}
                url: https://api.example.com
                intercept: true
                auth: {type: static, entry: api/token, scheme: "Bearer\\r\\nX-Evil: 1"}
            """, in: directory)
        let result = try await run(["check", "--config", path])
        #expect(result.status == 1)
        let lines = result.standardOutput.split(separator: "\n").map(String.init)
        #expect(lines.count == 2, "\(lines)")
        #expect(
            lines.first?.hasPrefix("\(path):7:38: upstream 'api' intercepts '*.com', but 'com' is a public suffix")
                == true, "\(lines)")
        #expect(
            lines.last
                == "\(path):10:52: upstream 'api': auth.scheme contains a control character, CR (U+000D) at character 7: it could not be sent as written",
            "\(lines)")

        let missing = try await run(
            ["check", "--config", path], ["BACKSTOP_PUBLIC_SUFFIX_LIST": directory + "/none.dat"])
        #expect(missing.status == 1)
        #expect(
            missing.standardOutput.contains(
                "\(path):9:16: an upstream intercepts, and checking its hosts needs the Public Suffix List, but \(directory)/none.dat cannot be used (No such file or directory)"
            ), "\(missing.standardOutput)")
    }

    // MARK: bind failures (finding 20)

    @Test("run on a port that is taken: one clear line naming the address and the setting, exit 1")
    func bindFailure() async throws {
        let directory = try TestFiles.makeTemporaryDirectory()
        defer { TestFiles.remove(directory) }
        let taken = try RawListener.bound()
        defer { close(taken.descriptor) }
        let path = try writeConfig("version: 1\nlisten: [127.0.0.1:\(taken.port)]\n", in: directory)
        let result = try await run(["run", "--config", path])
        #expect(result.status == 1)
        #expect(
            result.standardError.contains(
                "error=\"cannot listen on 127.0.0.1:\(taken.port) (listen): Address already in use (errno 98)\""),
            "\(result.standardError)")
        #expect(!result.standardError.contains("bind(descriptor"))

        let free = try FreePort.reserveClosedPort()
        let adminPath = try writeConfig(
            "version: 1\nlisten: [127.0.0.1:\(free)]\nadmin: {listen: 127.0.0.1:\(taken.port)}\n", in: directory)
        let admin = try await run(["run", "--config", adminPath])
        #expect(admin.status == 1)
        #expect(
            admin.standardError.contains(
                "cannot listen on 127.0.0.1:\(taken.port) (admin.listen): Address already in use"),
            "\(admin.standardError)")
    }

    // MARK: the docs quote the binary (finding 20)

    @Test("ca init: the refusal the docs quote is the one the binary prints")
    func caInitMessages() async throws {
        let directory = try TestFiles.makeTemporaryDirectory()
        defer { TestFiles.remove(directory) }
        let path = try writeConfig(
            "version: 1\nlisten: [127.0.0.1:18080]\nkeychain: {path: kc.bkc, key_file: kc.key}\n", in: directory)
        let first = try await run(["ca", "init", "--config", path])
        #expect(first.status == 0)
        let created = first.standardOutput.split(separator: "\n").map(String.init)
        let second = try await run(["ca", "init", "--config", path])
        #expect(second.status == 1)
        let refusal = second.standardError.trimmingCharacters(in: .newlines)
        for page in ["docs/reference/cli.md", "docs/reference/https-clients.md"] {
            let text = try String(contentsOfFile: Self.root + "/" + page, encoding: .utf8)
            let lines = text.split(separator: "\n").map(String.init)
            #expect(lines.contains(refusal), "\(page) does not quote: \(refusal)")
            // The success lines, up to the keychain path and the fingerprint.
            #expect(created.count == 3)
            #expect(
                lines.contains {
                    $0.hasPrefix("created root CA 'Backstop local interception CA' in ca/root of keychain /")
                }, "\(page)")
            #expect(lines.contains(created.last ?? "-"), "\(page)")
        }
    }

    @Test(
        "X-Backstop-Attempts: on Backstop's own errors after attempts were made, not on refusals before any; errors.md says so"
    )
    func attemptsOnOwnErrors() async throws {
        let closed = try FreePort.reserveClosedPort()
        let proxy = try await ProxyHarness.start(
            """
            upstreams:
              - name: gone
                match: {hosts: [gone.test]}
                url: http://127.0.0.1:\(closed)
                retry: {attempts: 2, backoff: {base: 10ms, max: 10ms}}
            """)
        let unreachable = try await proxy.get("http://gone.test/x", host: "gone.test")
        #expect(unreachable.status == 502)
        #expect(unreachable.header("X-Backstop-Error") == "upstream-unreachable")
        #expect(unreachable.header("X-Backstop-Attempts") == "2")
        let refused = try await proxy.get("http://other.test/x", host: "other.test")
        #expect(refused.header("X-Backstop-Error") == "no-route")
        #expect(refused.header("X-Backstop-Attempts") == nil)
        await proxy.stop()
        let errors = try String(contentsOfFile: Self.root + "/docs/reference/errors.md", encoding: .utf8)
        #expect(
            errors.contains(
                "An error Backstop makes after it tried the upstream carries `X-Backstop-Attempts: N` as well"))
        #expect(!errors.contains("carries `X-Backstop-Attempts: N` instead"))
    }
}

/// A listening TCP socket on 127.0.0.1 owned by the test: the port is taken for as long as it is open.
struct RawListener {
    let descriptor: Int32
    let port: Int

    static func bound() throws -> RawListener {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw POSIXError(.EMFILE) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = 0
        inet_pton(AF_INET, "127.0.0.1", &address.sin_addr)
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, length) == 0 && listen(fd, 1) == 0 && getsockname(fd, $0, &length) == 0
            }
        }
        guard bound else {
            close(fd)
            throw POSIXError(.EADDRINUSE)
        }
        return RawListener(descriptor: fd, port: Int(UInt16(bigEndian: address.sin_port)))
    }
}
