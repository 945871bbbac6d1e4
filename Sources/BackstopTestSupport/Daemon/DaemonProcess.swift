import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// The real `backstop` binary running as a child process, for tests that need a separate address space
/// (memory ceilings, signals, exit codes, several daemons sharing files).
public final class DaemonProcess: Sendable {
    public let pid: Int32
    private let process: ChildProcess
    private let stderrPath: String

    /// The built binary: `<repo>/.build/debug/backstop`, found from a test file's `#filePath`.
    public static func binaryPath(testFile: String = #filePath) -> String {
        var url = URL(fileURLWithPath: testFile)
        while url.path != "/" {
            url.deleteLastPathComponent()
            let candidate = url.appendingPathComponent(".build/debug/backstop").path
            if FileManager.default.isExecutableFile(atPath: candidate) { return candidate }
        }
        return ".build/debug/backstop"
    }

    /// Starts `backstop run --config configPath` with stderr sent to a file in the config's directory.
    public static func start(
        binary: String, arguments: [String], environment: [String: String]? = nil, workingDirectory: String? = nil
    ) throws -> DaemonProcess {
        let stderrPath = NSTemporaryDirectory() + "backstop-daemon-\(UUID().uuidString).log"
        let child = try ChildProcess.spawn(
            binary, arguments, environment: environment, workingDirectory: workingDirectory,
            standardOutput: .file(stderrPath))
        return DaemonProcess(process: child, stderrPath: stderrPath)
    }

    private init(process: ChildProcess, stderrPath: String) {
        self.process = process
        self.pid = process.pid
        self.stderrPath = stderrPath
    }

    /// A test that never called `stop()` (it failed first, or only needed the daemon while it ran) leaves neither a
    /// daemon running (`ChildProcess` kills and reaps it) nor its log in the temporary directory.
    deinit { unlink(stderrPath) }

    /// Everything the daemon wrote to stdout and stderr so far (invalid UTF-8 replaced, never dropped: a scan for
    /// secrets must see every line).
    public var output: String {
        guard let data = FileManager.default.contents(atPath: stderrPath) else { return "" }
        return String(decoding: data, as: UTF8.self)
    }

    public var isRunning: Bool { process.isRunning }

    /// The file the daemon's stdout and stderr go to (for scans that must not hold the whole log in memory).
    public var logPath: String { stderrPath }

    /// Waits until `host:port` accepts TCP connections (the daemon bound its listener).
    public func waitUntilListening(port: Int, host: String = "127.0.0.1", timeout: Duration = .seconds(20)) async throws
    {
        let listening = try await Poll.holds(within: timeout, every: .milliseconds(25)) {
            guard process.isRunning else {
                throw DaemonProcessError.exited(status: process.terminationStatus, output: output)
            }
            return Self.canConnect(host: host, port: port)
        }
        guard listening else { throw DaemonProcessError.notListening(port: port, output: output) }
    }

    /// Waits until `predicate(output)` holds.
    public func waitForOutput(timeout: Duration, _ predicate: (String) -> Bool) async throws {
        guard await Poll.holds(within: timeout, every: .milliseconds(25), { predicate(output) }) else {
            throw DaemonProcessError.outputNotSeen(output: output)
        }
    }

    public func send(signal: Int32) { kill(pid, signal) }

    /// Waits for the process to exit; returns its exit status. Kills it (SIGKILL) if the timeout passes.
    @discardableResult
    public func waitForExit(timeout: Duration) async throws -> Int32 {
        guard await Poll.holds(within: timeout, every: .milliseconds(20), { !process.isRunning }) else {
            kill(pid, SIGKILL)
            throw DaemonProcessError.didNotExit(output: output)
        }
        return process.terminationStatus
    }

    /// Stops the daemon (SIGTERM, then SIGKILL after 10 s) and removes its log file.
    public func stop() async {
        if process.isRunning {
            kill(pid, SIGTERM)
            _ = try? await waitForExit(timeout: .seconds(10))
        }
        unlink(stderrPath)
    }

    /// Peak resident set size in bytes (`VmHWM`), or nil once the process is gone.
    public var peakRSS: Int? { memoryField("VmHWM") }
    /// Current resident set size in bytes (`VmRSS`).
    public var currentRSS: Int? { memoryField("VmRSS") }

    /// Reads `VmHWM`/`VmRSS` (kB) from `/proc/PID/status`.
    public func memoryField(_ name: String) -> Int? {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else { return nil }
        for line in text.split(separator: "\n") where line.hasPrefix(name + ":") {
            let digits = line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first
            return digits.flatMap { Int($0) }.map { $0 * 1024 }
        }
        return nil
    }

    private static func canConnect(host: String, port: Int) -> Bool {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        inet_pton(AF_INET, host, &address.sin_addr)
        let result = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        return result == 0
    }
}

/// Why a daemon under test misbehaved; carries its output for the failure message.
public enum DaemonProcessError: Error, CustomStringConvertible {
    case exited(status: Int32, output: String)
    case notListening(port: Int, output: String)
    case outputNotSeen(output: String)
    case didNotExit(output: String)

    public var description: String {
        switch self {
        case .exited(let status, let output): "daemon exited with status \(status):\n\(output)"
        case .notListening(let port, let output): "daemon never listened on port \(port):\n\(output)"
        case .outputNotSeen(let output): "expected daemon output not seen:\n\(output)"
        case .didNotExit(let output): "daemon did not exit in time:\n\(output)"
        }
    }
}
