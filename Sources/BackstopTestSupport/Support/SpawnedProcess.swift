import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Runs a command (`ChildProcess`) and polls for its exit, with stdin from `/dev/null` and stdout and stderr in files,
/// within a time limit. Also for commands whose own children outlive them (`pg_ctl start` leaves a server running):
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
        guard await Poll.holds(within: timeout, every: .milliseconds(10), { !child.isRunning }) else {
            kill(child.pid, SIGKILL)
            child.waitUntilExit()
            throw SpawnedProcessError("\(executable) did not finish within \(timeout)")
        }
        let code = child.killedBySignal ? 128 + child.terminationStatus : child.terminationStatus
        let out = (try? String(contentsOfFile: outPath, encoding: .utf8)) ?? ""
        let err = (try? String(contentsOfFile: errPath, encoding: .utf8)) ?? ""
        return TestProcessResult(status: code, standardOutput: out, standardError: err)
    }
}

public struct SpawnedProcessError: Error, CustomStringConvertible {
    public let description: String
    init(_ description: String) { self.description = description }
}
