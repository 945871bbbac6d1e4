import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Runs a command (`ChildProcess`) and polls for its exit without blocking a thread, with stdin from `/dev/null` and
/// stdout and stderr in files, within a time limit. Also for commands whose own children outlive them (`pg_ctl start` leaves a server running):
/// Foundation's `Process` was seen here to miss such a child's exit now and then and wait forever.
public enum SpawnedProcess {
    public static func run(
        _ executable: String, _ arguments: [String], timeout: Duration = .seconds(120)
    ) async throws
        -> TestProcessResult
    {
        let directory = NSTemporaryDirectory()
        let token = UUID().uuidString
        let outPath = directory + "backstop-spawn-\(token).out"
        let errPath = directory + "backstop-spawn-\(token).err"
        defer {
            unlink(outPath)
            unlink(errPath)
        }
        let child = try ChildProcess.spawn(
            executable, arguments, standardOutput: .file(outPath), standardError: .file(errPath))
        // A child that runs past the limit is killed and reaped when `child` goes.
        guard await Poll.holds(within: timeout, every: .milliseconds(10), { !child.isRunning }) else {
            throw SpawnedProcessError("\(executable) did not finish within \(timeout)")
        }
        // Invalid UTF-8 (a tool writing binary) is replaced, never the whole output dropped.
        func text(_ path: String) -> String {
            String(decoding: FileManager.default.contents(atPath: path) ?? Data(), as: UTF8.self)
        }
        return TestProcessResult(status: child.exitCode, standardOutput: text(outPath), standardError: text(errPath))
    }
}

public struct SpawnedProcessError: Error, CustomStringConvertible {
    public let description: String
    init(_ description: String) { self.description = description }
}
