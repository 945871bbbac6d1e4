import Foundation

/// The outcome of a finished child process.
public struct TestProcessResult: Sendable {
    public let status: Int32
    public let standardOutput: String
    public let standardError: String
}

/// Runs helper tools (`openssl`, `curl`) from tests.
public enum TestProcess {
    /// Runs `executable` and suspends (without blocking a thread) until it exits. Use this from async tests whose
    /// child talks to servers in the same process: blocking the cooperative pool would stall those servers. A tool
    /// that never ends fails its test after ten minutes.
    public static func run(_ executable: String, _ arguments: [String]) async throws -> TestProcessResult {
        try await SpawnedProcess.run(executable, arguments, timeout: .seconds(600))
    }

    /// Runs `executable` and blocks until it exits; for tools that depend on nothing in this process. Both output
    /// pipes are read together, so a chatty child never blocks on a full pipe.
    public static func runBlocking(_ executable: String, _ arguments: [String]) throws -> TestProcessResult {
        let child = try ChildProcess.spawn(executable, arguments, standardOutput: .pipe, standardError: .pipe)
        let outputs = child.readOutputs(within: .seconds(600))
        guard !outputs.timedOut else { throw SpawnedProcessError("\(executable) did not finish within 600 s") }
        return TestProcessResult(
            status: child.exitCode, standardOutput: String(decoding: outputs.standardOutput, as: UTF8.self),
            standardError: String(decoding: outputs.standardError, as: UTF8.self))
    }
}
