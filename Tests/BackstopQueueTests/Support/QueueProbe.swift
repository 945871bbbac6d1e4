import BackstopTestSupport
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// The built `backstop-queue-probe` (a dependency of this test target, so `swift build --build-tests` makes it), run
/// as a separate process: to kill it with SIGKILL, to give it a mount namespace of its own, or to measure its memory.
enum QueueProbe {
    static let executable: String = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent(".build/debug/backstop-queue-probe").path

    static var isBuilt: Bool { FileManager.default.isExecutableFile(atPath: executable) }

    /// Body sizes the large-body test spools: 8 and 32 MiB, and 256 MiB with `BACKSTOP_BIG_BODIES=1` (about four
    /// minutes in a debug build, so not in every CI run; the memory bound it checks is the same at every size).
    static let bigBodySizes: [Int] =
        ProcessInfo.processInfo.environment["BACKSTOP_BIG_BODIES"] == "1"
        ? [8 << 20, 32 << 20, 256 << 20] : [8 << 20, 32 << 20]

    /// A running probe whose stdout is read line by line.
    final class Running {
        let process: ChildProcess
        private var pending: [UInt8] = []
        private(set) var lines: [String] = []
        /// What the probe wrote to stderr, once `finish()` has read it.
        private(set) var standardError = ""

        /// Runs the probe, or `executable` (`unshare`, which then runs the probe).
        init(
            _ arguments: [String], environment: [String: String] = [:], executable: String = QueueProbe.executable
        ) throws {
            process = try ChildProcess.spawn(
                executable, arguments,
                environment: ProcessInfo.processInfo.environment.merging(environment) { _, new in new },
                standardOutput: .pipe, standardError: .pipe)
        }

        /// Reads until `enough(lines)` holds, the output ends, or `deadline` passes; true when `enough` held.
        func read(until deadline: ContinuousClock.Instant, _ enough: ([String]) -> Bool) -> Bool {
            guard let fd = process.standardOutputDescriptor else { return enough(lines) }
            var buffer = [UInt8](repeating: 0, count: 65536)
            while !enough(lines) {
                let left = deadline - .now
                if left <= .zero { return false }
                var poller = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
                let ready = poll(&poller, 1, Int32(min(100, (left / .milliseconds(1)).rounded(.up))))
                if ready <= 0 { continue }
                let n = buffer.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
                if n <= 0 { return enough(lines) }
                take(buffer[..<n])
            }
            return true
        }

        private func take(_ bytes: ArraySlice<UInt8>) {
            pending += bytes
            while let newline = pending.firstIndex(of: UInt8(ascii: "\n")) {
                lines.append(String(decoding: pending[..<newline], as: UTF8.self))
                pending.removeSubrange(...newline)
            }
        }

        /// SIGKILL now, then everything it printed before dying.
        func kill() {
            Glibc.kill(process.pid, SIGKILL)
            finish()
        }

        /// Waits for the exit and reads what is left (past `timeout` the probe is killed).
        func finish(within timeout: Duration = .seconds(300)) {
            let outputs = process.readOutputs(within: timeout)
            take(outputs.standardOutput[...])
            standardError = String(decoding: outputs.standardError, as: UTF8.self)
        }

        var killed: Bool { process.killedBySignal }
    }

    /// Runs the probe to completion and returns its last line parsed as JSON.
    static func run(
        _ arguments: [String], executable: String = QueueProbe.executable, timeout: Duration = .seconds(300)
    )
        throws -> (json: [String: Any], stderr: String)
    {
        let running = try Running(arguments, executable: executable)
        running.finish(within: timeout)
        let last = running.lines.last ?? ""
        let object = (try? JSONSerialization.jsonObject(with: Data(last.utf8))) as? [String: Any] ?? [:]
        return (object, running.standardError)
    }
}
