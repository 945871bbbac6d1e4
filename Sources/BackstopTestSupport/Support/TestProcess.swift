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
        let status: Int32 = try await withCheckedThrowingContinuation { continuation in
            prepared.process.terminationHandler = { process in
                continuation.resume(returning: process.terminationStatus)
            }
            do {
                try prepared.process.run()
            } catch {
                prepared.process.terminationHandler = nil
                continuation.resume(throwing: error)
            }
        }
        return try prepared.finish(status: status)
    }

    /// Runs `executable` and blocks until it exits; for tools that depend on nothing in this process.
    public static func runBlocking(_ executable: String, _ arguments: [String]) throws -> TestProcessResult {
        let prepared = try Prepared(executable: executable, arguments: arguments)
        try prepared.process.run()
        prepared.process.waitUntilExit()
        return try prepared.finish(status: prepared.process.terminationStatus)
    }

    private struct Prepared {
        let process = Process()
        let outputURL: URL
        let errorURL: URL

        init(executable: String, arguments: [String]) throws {
            let directory = URL(fileURLWithPath: NSTemporaryDirectory())
            let token = UUID().uuidString
            outputURL = directory.appendingPathComponent("backstop-proc-\(token).out")
            errorURL = directory.appendingPathComponent("backstop-proc-\(token).err")
            _ = FileManager.default.createFile(atPath: outputURL.path, contents: nil)
            _ = FileManager.default.createFile(atPath: errorURL.path, contents: nil)
            process.executableURL = URL(fileURLWithPath: executable)
            process.arguments = arguments
            process.standardInput = FileHandle.nullDevice
            process.standardOutput = try FileHandle(forWritingTo: outputURL)
            process.standardError = try FileHandle(forWritingTo: errorURL)
        }

        func finish(status: Int32) throws -> TestProcessResult {
            defer {
                try? FileManager.default.removeItem(at: outputURL)
                try? FileManager.default.removeItem(at: errorURL)
            }
            for handle in [process.standardOutput, process.standardError] {
                try (handle as? FileHandle)?.close()
            }
            return TestProcessResult(
                status: status,
                standardOutput: String(decoding: try Data(contentsOf: outputURL), as: UTF8.self),
                standardError: String(decoding: try Data(contentsOf: errorURL), as: UTF8.self)
            )
        }
    }
}
