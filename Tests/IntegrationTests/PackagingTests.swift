import BackstopTestSupport
import Foundation
import Testing

/// The systemd unit and the container image's runtime dependencies (docs/reference/operations.md).
@Suite("Packaging")
struct PackagingTests {
    private let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().path

    @Test("the systemd unit carries every hardening directive")
    func hardening() throws {
        let unit = try String(contentsOfFile: root + "/systemd/backstop.service", encoding: .utf8)
        let lines = Set(unit.split(separator: "\n").map { $0.trimmingCharacters(in: .whitespaces) })
        for directive in [
            "Type=notify", "ExecReload=/bin/kill -HUP $MAINPID", "WatchdogSec=30s", "DynamicUser=yes",
            "StateDirectory=backstop", "ConfigurationDirectory=backstop",
            "LoadCredential=keychain.key:/etc/backstop/keychain.key", "NoNewPrivileges=yes", "ProtectSystem=strict",
            "ProtectHome=yes", "PrivateTmp=yes", "PrivateDevices=yes",
            "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX AF_NETLINK", "SystemCallFilter=@system-service",
            "SystemCallErrorNumber=EPERM", "PrivateMounts=yes",
            "CapabilityBoundingSet=", "MemoryDenyWriteExecute=yes", "UMask=0077", "LimitCORE=0",
        ] {
            #expect(lines.contains(directive), "missing: \(directive)")
        }
    }

    @Test("systemd-analyze verify accepts the unit")
    func verify() async throws {
        let analyzer = "/usr/bin/systemd-analyze"
        guard FileManager.default.isExecutableFile(atPath: analyzer) else {
            Issue.record("systemd-analyze is not installed (apt-get install systemd); .ci/run installs it")
            return
        }
        // verify checks that ExecStart's binary exists: point it at the built one.
        let directory = try TestFiles.makeTemporaryDirectory()
        defer { TestFiles.remove(directory) }
        let unit = try String(contentsOfFile: root + "/systemd/backstop.service", encoding: .utf8)
            .replacingOccurrences(of: "/usr/local/bin/backstop", with: DaemonProcess.binaryPath())
        try unit.write(toFile: directory + "/backstop.service", atomically: true, encoding: .utf8)
        let result = try await TestProcess.run(analyzer, ["verify", directory + "/backstop.service"])
        #expect(result.status == 0, "\(result.standardOutput)\(result.standardError)")
    }

    @Test("the runtime image installs exactly the shared libraries the binary links")
    func runtimeDependencies() async throws {
        let result = try await TestProcess.run(
            "/bin/bash", [root + "/scripts/check-runtime-deps.sh", DaemonProcess.binaryPath()])
        #expect(result.status == 0, "\(result.standardOutput)\(result.standardError)")
        #expect(result.standardOutput.contains("libcurl4"))
    }

    @Test(
        "what gets installed is stripped: the image (unless KEEP_SYMBOLS=1), the unit's and the guide's install lines; a stripped binary runs"
    )
    func strippedInstall() async throws {
        let dockerfile = try String(contentsOfFile: root + "/Dockerfile", encoding: .utf8)
        #expect(dockerfile.contains("install -D -m 0755 $([ \"$KEEP_SYMBOLS\" = 1 ] || echo -s) "), "\(dockerfile)")
        #expect(dockerfile.contains("ARG KEEP_SYMBOLS=0"))
        let unit = try String(contentsOfFile: root + "/systemd/backstop.service", encoding: .utf8)
        #expect(unit.contains("install -s -m 0755 .build/release/backstop /usr/local/bin/backstop"))
        let guide = try String(contentsOfFile: root + "/docs/operations.md", encoding: .utf8)
        #expect(guide.contains("install -s -m 0755 .build/release/backstop /usr/local/bin/backstop"))
        #expect(!guide.contains("install -m 0755 .build/release/backstop"))

        let directory = try TestFiles.makeTemporaryDirectory()
        defer { TestFiles.remove(directory) }
        let installed = directory + "/backstop"
        let install = try await TestProcess.run(
            "/usr/bin/install", ["-s", "-m", "0755", DaemonProcess.binaryPath(), installed])
        #expect(install.status == 0, "\(install.standardError)")
        let sections = try await TestProcess.run("/usr/bin/readelf", ["-S", installed])
        #expect(!sections.standardOutput.contains(".symtab") && !sections.standardOutput.contains(".debug_info"))
        let version = try await TestProcess.run(installed, ["version"])
        #expect(version.status == 0 && version.standardOutput.hasPrefix("backstop "))
    }
}
