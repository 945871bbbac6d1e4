import BackstopTestSupport
import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// A running daemon writes no core file (docs/reference/operations.md#core-files): it is non-dumpable and its core
/// limit is 0, whatever limit it was started with.
@Suite("Core dumps")
struct CoreDumpTests {
    @Test(
        "run, started with a core limit of 1 MiB, sets it to 0 (soft and hard) and is non-dumpable: its /proc/PID files belong to root, not to its user"
    )
    func disabledAtStart() async throws {
        let directory = try TestFiles.makeTemporaryDirectory()
        defer { TestFiles.remove(directory) }
        // Readable by the unprivileged user the daemon runs as when this test runs as root.
        chmod(directory, 0o755)
        let port = try FreePort.reserveClosedPort()
        let path = directory + "/backstop.yaml"
        try "version: 1\nlisten: [127.0.0.1:\(port)]\n".write(toFile: path, atomically: true, encoding: .utf8)
        chmod(path, 0o644)
        // A non-dumpable process's /proc/PID files belong to root: observable only for a daemon that is not root.
        let nobody: UInt32 = 65534
        let runAs =
            getuid() == 0 ? ["/usr/bin/setpriv", "--reuid=\(nobody)", "--regid=\(nobody)", "--clear-groups"] : []
        // A copy beside the config: the checkout (CI's clone) may sit in a directory that user cannot enter.
        var binary = DaemonProcess.binaryPath()
        if getuid() == 0 {
            try FileManager.default.copyItem(atPath: binary, toPath: directory + "/backstop")
            binary = directory + "/backstop"
        }
        let daemon = try DaemonProcess.start(
            binary: "/usr/bin/prlimit",
            arguments: ["--core=1048576:unlimited", "--"] + runAs + [binary, "run", "--config", path])
        var failure: (any Error)?
        do {
            try await daemon.waitUntilListening(port: port)

            let limits = try String(contentsOfFile: "/proc/\(daemon.pid)/limits", encoding: .utf8)
            let core = try #require(limits.split(separator: "\n").first { $0.hasPrefix("Max core file size") })
            let values = core.dropFirst("Max core file size".count).split(
                separator: " ", omittingEmptySubsequences: true)
            #expect(values.prefix(2) == ["0", "0"], "\(core)")

            let status = try String(contentsOfFile: "/proc/\(daemon.pid)/status", encoding: .utf8)
            let uidLine = try #require(status.split(separator: "\n").first { $0.hasPrefix("Uid:") })
            let realUID = try #require(
                uidLine.split(whereSeparator: { $0 == "\t" || $0 == " " }).dropFirst().first.flatMap { UInt32($0) })
            #expect(realUID == (getuid() == 0 ? nobody : getuid()))
            // The files under /proc/PID (this kernel keeps the directory itself with the process's user).
            for file in ["status", "fd", "environ"] {
                var info = stat()
                #expect(stat("/proc/\(daemon.pid)/\(file)", &info) == 0)
                #expect(
                    info.st_uid == 0,
                    "/proc/\(daemon.pid)/\(file) belongs to uid \(info.st_uid): the daemon is dumpable")
            }
            #expect(!daemon.output.contains("core dumps may not be disabled"), "\(daemon.output)")
        } catch {
            failure = error
        }
        await daemon.stop()
        if let failure { throw failure }
    }
}
