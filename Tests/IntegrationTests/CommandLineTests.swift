import BackstopKeychain
import BackstopTestSupport
import Foundation
import Testing

/// The `backstop` binary: `check`, `version`, exit codes, and `run` start-up and drain.
@Suite("Command line")
struct CommandLineTests {
    private let binary = DaemonProcess.binaryPath()

    private func writeConfig(_ text: String) throws -> (directory: String, path: String) {
        let directory = try TestFiles.makeTemporaryDirectory()
        let path = directory + "/backstop.yaml"
        try text.write(toFile: path, atomically: true, encoding: .utf8)
        return (directory, path)
    }

    @Test("backstop --version prints the version like `backstop version`")
    func versionFlag() async throws {
        let flag = try await TestProcess.run(binary, ["--version"])
        let command = try await TestProcess.run(binary, ["version"])
        #expect(flag.status == 0)
        #expect(flag.standardOutput.hasPrefix("backstop "))
        #expect(flag.standardOutput == command.standardOutput)
    }

    @Test("keychain init creates missing state directories (mode 0700), as run does")
    func initMakesStateDirectory() async throws {
        let (directory, path) = try writeConfig("")
        defer { TestFiles.remove(directory) }
        try "version: 1\nlisten: [127.0.0.1:18080]\nkeychain: {path: state/deep/kc.bkc, key_file: state/deep/kc.key}\n"
            .write(toFile: path, atomically: true, encoding: .utf8)
        let result = try await TestProcess.run(binary, ["keychain", "init", "--config", path])
        #expect(result.status == 0, "\(result.standardError)")
        for sub in ["/state", "/state/deep"] {
            let mode =
                (try FileManager.default.attributesOfItem(atPath: directory + sub)[.posixPermissions] as? Int) ?? 0
            #expect(mode == 0o700, "\(sub)")
        }
        #expect(FileManager.default.fileExists(atPath: directory + "/state/deep/kc.bkc"))
    }

    @Test("a standard output that cannot be written (a full disk, closed) is exit 1 with why, not a crash")
    func unwritableStandardOutput() async throws {
        let (directory, path) = try writeConfig(
            "version: 1\nlisten: [127.0.0.1:18080]\nkeychain: {path: kc.bkc, key_file: kc.key}\n")
        defer { TestFiles.remove(directory) }
        #expect(try await TestProcess.run(binary, ["keychain", "init", "--config", path]).status == 0)
        let set = try await TestProcess.run(
            "/bin/sh", ["-c", "printf v | \"$0\" keychain set a/b --config \"$1\"", binary, path])
        #expect(set.status == 0, "\(set.standardError)")
        for (command, redirect) in [("list", "> /dev/full"), ("get a/b", "> /dev/full"), ("list", ">&-")] {
            let result = try await TestProcess.run(
                "/bin/sh", ["-c", "\"$0\" keychain \(command) --config \"$1\" \(redirect)", binary, path])
            // Before the fix: Foundation's FileHandle.write trapped (SIGILL, 132).
            #expect(result.status == 1, "\(command) \(redirect): \(result.status) \(result.standardError.prefix(200))")
            #expect(result.standardError.hasPrefix("error: cannot write standard output: "), "\(result.standardError)")
        }
    }

    @Test(
        "a config file or a Public Suffix List that is a FIFO is refused at once as not a regular file (it held check until something wrote to it)"
    )
    func fifoFilesRefused() async throws {
        let directory = try TestFiles.makeTemporaryDirectory()
        defer { TestFiles.remove(directory) }
        #expect(mkfifo(directory + "/config.fifo", 0o644) == 0)
        let config = try await TestProcess.run(binary, ["check", "--config", directory + "/config.fifo"])
        #expect(config.status == 1)
        #expect((config.standardOutput + config.standardError).contains("not a regular file"), "\(config)")
        #expect(mkfifo(directory + "/psl.fifo", 0o644) == 0)
        let path = directory + "/intercept.yaml"
        try """
        version: 1
        listen: [127.0.0.1:18990]
        keychain: {path: \(directory)/k.bkc, key_file: \(directory)/k.key}
        upstreams:
          - {name: a, match: {hosts: ["*.example.com"]}, url: https://a.example.com, intercept: true}
        """.write(toFile: path, atomically: true, encoding: .utf8)
        let psl = try await TestProcess.run(
            "/usr/bin/env",
            ["BACKSTOP_PUBLIC_SUFFIX_LIST=" + directory + "/psl.fifo", binary, "check", "--config", path])
        #expect(psl.status == 1)
        #expect((psl.standardOutput + psl.standardError).contains("not a regular file"), "\(psl)")
    }

    @Test("check prints ok for the sample configs")
    func checkSamples() async throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().path
        for sample in ["config/backstop.yaml", "config/backstop.reference.yaml", "config/tour.yaml"] {
            let result = try await TestProcess.run(binary, ["check", "--config", root + "/" + sample])
            if sample.hasSuffix("reference.yaml"), !FileManager.default.fileExists(atPath: "/run/backstop") {
                // Its unix listener is in systemd's RuntimeDirectory, missing here: `run` could not bind it.
                #expect(result.status == 1)
                #expect(
                    result.standardOutput.hasSuffix(
                        "reference.yaml:9:5: listen[] unix:/run/backstop/proxy.sock: its directory /run/backstop "
                            + "cannot be used: No such file or directory\n"), "\(result.standardOutput)")
                #expect(result.standardOutput.split(separator: "\n").count == 1)
                continue
            }
            #expect(result.status == 0, "\(sample): \(result.standardOutput) \(result.standardError)")
            #expect(result.standardOutput == "ok\n")
        }
    }

    @Test(
        "check reports each error as FILE:LINE:COLUMN: message and exits 1",
        arguments: [
            // (config, expected line:column of the first error, a word the message must contain)
            (
                "version: 1\nlisten: [127.0.0.1:8080]\nupstreams:\n  - name: a\n    match: {hosts: [a.test]}\n    url: http://127.0.0.1:1\n    retyr: {}\n",
                "7:5", "retyr"
            ),
            (
                "version: 1\nlisten: [127.0.0.1:8080]\nupstreams:\n  - name: a\n    match: {hosts: [a.test]}\n    url: http://127.0.0.1:1\n    retry:\n      attempts: 0\n",
                "8:17", "attempts"
            ),
            (
                "version: 1\nlisten: [127.0.0.1:8080]\nupstreams:\n  - name: a\n    match: {hosts: [a.test]}\n    url: http://127.0.0.1:1\n    retry:\n      backoff: {base: 2s, max: 1s}\n",
                "8:", "base"
            ),
            ("version: 1\nlisten:\n  - 0.0.0.0:8080\n", "3:5", "allow_remote"),
            ("version: 1\nlisten: [127.0.0.1:8080]\nlimits:\n  client_idle_timeout: 10 parsecs\n", "4:24", "duration"),
            (
                "version: 1\nlisten: [127.0.0.1:8080]\nupstreams:\n  - name: a\n    match: {hosts: [a.test]}\n    url: http://127.0.0.1:1\n  - name: a\n    match: {hosts: [b.test]}\n    url: http://127.0.0.1:2\n",
                "7:", "duplicate"
            ),
            (
                "version: 1\nlisten: [127.0.0.1:8080]\nupstreams:\n  - name: a\n    match: {hosts: [a.test]}\n    url: http://127.0.0.1:1\n  - name: b\n    match: {hosts: [a.test]}\n    url: http://127.0.0.1:2\n",
                "8:", "overlap"
            ),
        ])
    func checkErrors(config: String, position: String, word: String) async throws {
        let (directory, path) = try writeConfig(config)
        defer { TestFiles.remove(directory) }
        let result = try await TestProcess.run(binary, ["check", "--config", path])
        #expect(result.status == 1)
        let first = result.standardOutput.split(separator: "\n").first.map(String.init) ?? ""
        #expect(first.hasPrefix("\(path):\(position)"), "got: \(result.standardOutput)")
        #expect(first.lowercased().contains(word), "got: \(first)")
    }

    @Test("check reports each unreadable CA bundle at its ca_file value: the upstream's and the token endpoint's")
    func checkCAFiles() async throws {
        let (directory, path) = try writeConfig(
            """
            version: 1
            listen: [127.0.0.1:8080]
            keychain: {path: kc.bkc, key_file: kc.key}
            upstreams:
              - name: a
                match: {hosts: [a.test]}
                url: https://a.test
                tls: {ca_file: missing-upstream-ca.pem}
                auth:
                  type: oauth2
                  token_url: https://auth.test/token
                  grant: client_credentials
                  client_id: backstop
                  client_secret_entry: a/secret
                  keychain_prefix: a
                  tls:
                    ca_file: missing-auth-ca.pem

            """)
        defer { TestFiles.remove(directory) }
        let result = try await TestProcess.run(binary, ["check", "--config", path])
        #expect(result.status == 1)
        let lines = result.standardOutput.split(separator: "\n").map(String.init)
        #expect(
            lines.contains {
                $0.hasPrefix(
                    "\(path):8:20: upstream 'a': tls.ca_file \(directory)/missing-upstream-ca.pem is not readable")
            }, "got: \(result.standardOutput)")
        #expect(
            lines.contains {
                $0.hasPrefix(
                    "\(path):17:18: upstream 'a': auth.tls.ca_file \(directory)/missing-auth-ca.pem is not readable")
            }, "got: \(result.standardOutput)")
        #expect(lines.count == 2, "got: \(result.standardOutput)")

        // A FIFO is readable but would block TLS (and every upstream with it) until something writes to it.
        #expect(mkfifo(directory + "/missing-upstream-ca.pem", 0o644) == 0)
        let fifo = try await TestProcess.run(binary, ["check", "--config", path])
        #expect(
            fifo.standardOutput.contains(
                "upstream 'a': tls.ca_file \(directory)/missing-upstream-ca.pem is not a regular file"),
            "got: \(fifo.standardOutput)")
    }

    @Test("check reports a unix listener whose directory is missing or not a directory, where its address was written")
    func checkUnixSocketDirectories() async throws {
        let (directory, path) = try writeConfig(
            """
            version: 1
            listen: [unix:missing/proxy.sock, {address: "unix:here.sock"}, "unix:file/x.sock"]
            admin: {listen: "unix:gone/admin.sock"}
            upstreams:
              - {name: a, match: {hosts: [a.test]}, url: http://127.0.0.1:9}

            """)
        defer { TestFiles.remove(directory) }
        try Data().write(to: URL(fileURLWithPath: directory + "/file"))
        let result = try await TestProcess.run(binary, ["check", "--config", path])
        #expect(result.status == 1)
        let lines = result.standardOutput.split(separator: "\n").map(String.init)
        #expect(
            lines == [
                "\(path):2:10: listen[] unix:\(directory)/missing/proxy.sock: its directory \(directory)/missing "
                    + "cannot be used: No such file or directory",
                "\(path):2:64: listen[] unix:\(directory)/file/x.sock: \(directory)/file is not a directory",
                "\(path):3:17: admin.listen unix:\(directory)/gone/admin.sock: its directory \(directory)/gone "
                    + "cannot be used: No such file or directory",
            ], "got: \(result.standardOutput)")
    }

    @Test(
        "check agrees with run on the state directories: a spool.dir inside the keychain's directory that run creates is ok, one inside another missing directory is not, and a keychain file name over 255 bytes is refused"
    )
    func checkStateDirectoriesAsRunMakesThem() async throws {
        let (directory, path) = try writeConfig(
            """
            version: 1
            listen: [127.0.0.1:8080]
            keychain: {path: state/k.bkc, key_file: state/k.key}
            spool: {dir: state/spool}
            upstreams:
              - {name: a, match: {hosts: [a.test]}, url: http://127.0.0.1:9}

            """)
        defer { TestFiles.remove(directory) }
        let fresh = try await TestProcess.run(binary, ["check", "--config", path])
        #expect(fresh.status == 0, "run creates state/ for the keychain before the spool: \(fresh.standardOutput)")

        let long = String(repeating: "k", count: 300)
        try """
        version: 1
        listen: [127.0.0.1:8080]
        keychain: {path: state/\(long).bkc, key_file: state/k.key}
        spool: {dir: other/spool}
        upstreams:
          - {name: a, match: {hosts: [a.test]}, url: http://127.0.0.1:9}

        """.write(toFile: path, atomically: true, encoding: .utf8)
        let refused = try await TestProcess.run(binary, ["check", "--config", path])
        #expect(refused.status == 1)
        let lines = refused.standardOutput.split(separator: "\n").map(String.init)
        #expect(lines.count == 2, "\(refused.standardOutput)")
        #expect(
            lines.first?.hasPrefix("\(path):3:18: keychain.path \(directory)/state/\(long).bkc cannot be used: ")
                == true,
            "\(lines)")
        #expect(
            lines.last?.hasSuffix(
                "spool.dir \(directory)/other/spool does not exist and cannot be created: \(directory)/other is not a "
                    + "writable directory") == true, "\(lines)")
    }

    @Test("check reports file problems beside schema errors, in file order: every problem in one run")
    func checkFilesBesideSchemaErrors() async throws {
        let (directory, path) = try writeConfig(
            """
            version: 1
            listen: [127.0.0.1:8080]
            upstreams:
              - name: a
                match: {hosts: [a.test]}
                url: https://a.test
                tls: {ca_file: missing-ca.pem}
                retyr: {}

            """)
        defer { TestFiles.remove(directory) }
        let result = try await TestProcess.run(binary, ["check", "--config", path])
        #expect(result.status == 1)
        let lines = result.standardOutput.split(separator: "\n").map(String.init)
        #expect(lines.count == 2, "\(result.standardOutput)")
        #expect(lines.first?.hasPrefix("\(path):7:20: upstream 'a': tls.ca_file ") == true, "\(lines)")
        #expect(lines.last?.hasPrefix("\(path):8:5: ") == true && lines.last?.contains("retyr") == true, "\(lines)")
    }

    @Test("check reports a clients entry's unknown user and group at the value that names them")
    func checkUnknownUnixAccounts() async throws {
        let (directory, path) = try writeConfig(
            """
            version: 1
            listen: [127.0.0.1:8080]
            upstreams:
              - {name: a, match: {hosts: [a.test]}, url: http://a.test}
            clients:
              - name: x
                match:
                  unix_user: no-such-user-zz
                upstreams: [a]
              - name: y
                match: {unix_group: no-such-group-zz}
                upstreams: "*"

            """)
        defer { TestFiles.remove(directory) }
        let result = try await TestProcess.run(binary, ["check", "--config", path])
        #expect(result.status == 1)
        #expect(
            result.standardOutput.split(separator: "\n").map(String.init) == [
                "\(path):8:18: client 'x': unix_user 'no-such-user-zz' is not a user on this host",
                "\(path):11:25: client 'y': unix_group 'no-such-group-zz' is not a group on this host",
            ])
    }

    @Test("check --online: a static auth entry with CR/LF is reported at its entry (never its value); fixed, ok")
    func checkOnlineHeaderValue() async throws {
        let (directory, path) = try writeConfig(
            """
            version: 1
            listen: [127.0.0.1:8080]
            keychain: {path: kc.bkc, key_file: kc.key}
            upstreams:
              - name: a
                match: {hosts: [a.test]}
                url: http://127.0.0.1:1
                auth: {type: static, entry: a/token}

            """)
        defer { TestFiles.remove(directory) }
        let opened = try KeychainBootstrap.open(path: directory + "/kc.bkc", key: .file(path: directory + "/kc.key"))
        try opened.keychain.set("a/token", value: Array("abc\r\nX-Injected: yes".utf8))
        let bad = try await TestProcess.run(binary, ["check", "--online", "--config", path])
        #expect(bad.status == 1)
        #expect(
            bad.standardOutput.hasPrefix(
                "\(path):8:33: upstream 'a': auth.entry: keychain entry 'a/token' holds a control character"),
            "\(bad.standardOutput)")
        #expect(!bad.standardOutput.contains("X-Injected"))
        try opened.keychain.set("a/token", value: Array("abc".utf8))
        let good = try await TestProcess.run(binary, ["check", "--online", "--config", path])
        #expect(good.status == 0, "\(good.standardOutput)")
        #expect(good.standardOutput == "ok\n")
    }

    @Test("check prints one line per error whatever a value holds: line breaks and terminal escapes are escaped")
    func checkEscapesValues() async throws {
        let (directory, path) = try writeConfig(
            "version: 1\nlisten: [\"127.0.0.1:${EVIL}\"]\nupstreams:\n  - {name: \"a\\nb\\e[31mX\", match: {hosts: [a.test]}, url: http://127.0.0.1:1}\n"
        )
        defer { TestFiles.remove(directory) }
        let result = try await TestProcess.run(
            "/usr/bin/env", ["EVIL=1\ntime=2026 level=error msg=forged", binary, "check", "--config", path])
        #expect(result.status == 1)
        let lines = result.standardOutput.split(separator: "\n", omittingEmptySubsequences: false).dropLast()
        #expect(lines.count == 2, "\(result.standardOutput)")
        #expect(lines.allSatisfy { $0.hasPrefix(path + ":") }, "\(result.standardOutput)")
        #expect(result.standardOutput.contains("1\\ntime=2026 level=error msg=forged"))
        #expect(result.standardOutput.contains("a\\nb\\u001b[31mX"))
        #expect(!result.standardOutput.unicodeScalars.contains { $0.value == 0x1B })
    }

    @Test("a command without its subcommand is a usage error (exit 2), its help on stderr; --help is not (exit 0)")
    func missingSubcommand() async throws {
        for arguments in [[], ["keychain"], ["tokens"], ["ca"], ["deliveries"]] {
            let result = try await TestProcess.run(binary, arguments)
            #expect(result.status == 2, "\(arguments)")
            #expect(result.standardOutput.isEmpty, "\(arguments): \(result.standardOutput)")
            #expect(result.standardError.contains("SUBCOMMANDS"), "\(arguments): \(result.standardError)")
            #expect(result.standardError.contains("error: missing subcommand: one of "), "\(arguments)")
        }
        let help = try await TestProcess.run(binary, ["--help"])
        #expect(help.status == 0)
        #expect(help.standardOutput.contains("SUBCOMMANDS"))
        #expect(try await TestProcess.run(binary, ["keychain", "--help"]).status == 0)
    }

    @Test(
        "a malformed option value is a usage error (exit 2) naming the option, before the config is read: --drain-timeout, an empty --new-key-file"
    )
    func malformedOptionBeforeConfig() async throws {
        let missing = "/nonexistent/backstop-test.yaml"
        for (arguments, option) in [
            (["run", "--drain-timeout", "5", "--config", missing], "--drain-timeout"),
            (["keychain", "rekey", "--new-key-file", "", "--config", missing], "--new-key-file"),
        ] {
            let result = try await TestProcess.run(binary, arguments)
            #expect(result.status == 2, "\(arguments): \(result.standardError)")
            #expect(result.standardError.contains(option), "\(arguments): \(result.standardError)")
            #expect(!result.standardError.contains(missing), "the config is not read: \(result.standardError)")
        }
    }

    @Test("version prints the version; an unknown flag is a usage error (exit 2)")
    func versionAndUsage() async throws {
        let version = try await TestProcess.run(binary, ["version"])
        #expect(version.status == 0)
        #expect(version.standardOutput.hasPrefix("backstop "))
        let usage = try await TestProcess.run(binary, ["check", "--no-such-flag"])
        #expect(usage.status == 2)
    }

    @Test(
        "run refuses a ca_file that is not a regular file (a FIFO would hold every upstream), and a reload naming one is rejected"
    )
    func runRefusesBlockingCAFile() async throws {
        let origin = try await TestOrigin.start { _ in .text(200, "up") }
        let port = try FreePort.reserveClosedPort()
        func config(caFile: String?) -> String {
            """
            version: 1
            listen: [127.0.0.1:\(port)]
            upstreams:
              - name: app
                match: {hosts: [app.test]}
                url: \(origin.baseURL)
              - name: secure
                match: {hosts: [secure.test]}
                url: https://127.0.0.1:9
            \(caFile.map { "    tls: {ca_file: \($0)}" } ?? "")
            """
        }
        let (directory, path) = try writeConfig(config(caFile: nil))
        defer { TestFiles.remove(directory) }
        let fifo = directory + "/ca.fifo"
        #expect(mkfifo(fifo, 0o644) == 0)
        try config(caFile: fifo).write(toFile: path, atomically: true, encoding: .utf8)
        let refused = try await TestProcess.run(binary, ["run", "--config", path])
        #expect(refused.status == 1)
        let output = refused.standardOutput + refused.standardError
        #expect(output.contains("not a regular file") && output.contains("refusing to start"), "\(output)")
        // Started without it, a reload that names it is rejected: the running config stays.
        try config(caFile: nil).write(toFile: path, atomically: true, encoding: .utf8)
        let daemon = try DaemonProcess.start(binary: binary, arguments: ["run", "--config", path])
        try await daemon.waitUntilListening(port: port)
        try config(caFile: fifo).write(toFile: path, atomically: true, encoding: .utf8)
        daemon.send(signal: SIGHUP)
        try await daemon.waitForOutput(timeout: .seconds(10)) {
            $0.contains("reload rejected") && $0.contains("not a regular file")
        }
        let response = try await RawHTTP.exchange(
            port: port, request: RawHTTP.request("GET", "http://app.test/r", host: "app.test"), timeout: .seconds(10))
        #expect(response.bodyString == "up")
        await daemon.stop()
        try await origin.shutdown()
    }

    @Test("run serves, answers /healthz and /readyz, and exits 0 on SIGTERM")
    func runAndStop() async throws {
        let origin = try await TestOrigin.start { _ in .text(200, "up") }
        let port = try FreePort.reserveClosedPort()
        let adminPort = try FreePort.reserveClosedPort()
        let (directory, path) = try writeConfig(
            """
            version: 1
            listen: [127.0.0.1:\(port)]
            admin: {listen: 127.0.0.1:\(adminPort)}
            upstreams:
              - name: app
                match: {hosts: [app.test]}
                url: \(origin.baseURL)
            """)
        defer { TestFiles.remove(directory) }
        let daemon = try DaemonProcess.start(binary: binary, arguments: ["run", "--config", path])
        try await daemon.waitUntilListening(port: port)
        try await daemon.waitUntilListening(port: adminPort)
        let response = try await RawHTTP.exchange(
            port: port, request: RawHTTP.request("GET", "http://app.test/r", host: "app.test"), timeout: .seconds(10))
        #expect(response.bodyString == "up")
        let health = try await RawHTTP.exchange(
            port: adminPort, request: RawHTTP.request("GET", "/healthz"), timeout: .seconds(5))
        #expect(health.status == 200)
        let ready = try await RawHTTP.exchange(
            port: adminPort, request: RawHTTP.request("GET", "/readyz"), timeout: .seconds(5))
        #expect(ready.status == 200)
        try await daemon.waitForOutput(timeout: .seconds(5)) {
            $0.contains("status=200") && $0.contains("upstream=app")
        }
        daemon.send(signal: SIGTERM)
        let status = try await daemon.waitForExit(timeout: .seconds(10))
        #expect(status == 0)
        await daemon.stop()
        try await origin.shutdown()
    }
}
