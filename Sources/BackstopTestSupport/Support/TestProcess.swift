import Foundation

/// The outcome of a finished child process.
public struct TestProcessResult: Sendable {
    public let status: Int32
    public let standardOutput: String
    public let standardError: String
}

/// Runs helper tools (`openssl`, `curl`) from tests.
///
/// Output goes to temporary files rather than pipes, so a chatty child can never block on a full pipe while we wait
/// for it to exit.
public enum TestProcess {
    /// Runs `executable` and suspends (without blocking a thread) until it exits. Use this from async tests whose
    /// child talks to servers in the same process: blocking the cooperative pool would stall those servers.
    public static func run(_ executable: String, _ arguments: [String]) async throws -> TestProcessResult {
        let prepared = try Prepared(executable: executable, arguments: arguments)
        // A tool that never ends fails its test; the child is killed and reaped when `prepared` goes.
        try await Poll.until("\(executable) to exit", within: .seconds(600), every: .milliseconds(5)) {
            !prepared.child.isRunning
        }
        return try prepared.finish()
    }

    /// Runs `executable` and blocks until it exits; for tools that depend on nothing in this process.
    public static func runBlocking(_ executable: String, _ arguments: [String]) throws -> TestProcessResult {
        let prepared = try Prepared(executable: executable, arguments: arguments)
        prepared.child.waitUntilExit()
        return try prepared.finish()
    }

    private struct Prepared {
        let child: ChildProcess
        let outputPath: String
        let errorPath: String

        init(executable: String, arguments: [String]) throws {
            let token = UUID().uuidString
            outputPath = NSTemporaryDirectory() + "backstop-proc-\(token).out"
            errorPath = NSTemporaryDirectory() + "backstop-proc-\(token).err"
            child = try ChildProcess.spawn(
                executable, arguments, standardOutput: .file(outputPath), standardError: .file(errorPath))
        }

        func finish() throws -> TestProcessResult {
            defer {
                unlink(outputPath)
                unlink(errorPath)
            }
            return TestProcessResult(
                status: child.terminationStatus,
                standardOutput: String(decoding: try Data(contentsOf: URL(fileURLWithPath: outputPath)), as: UTF8.self),
                standardError: String(decoding: try Data(contentsOf: URL(fileURLWithPath: errorPath)), as: UTF8.self)
            )
        }
    }
}
