import BackstopTestSupport
import Foundation

/// The built `backstop` executable, for tests that need real separate processes (locks, `kill -9`).
/// Found relative to this file, so it works from any working directory once `swift build` has run.
enum BackstopCLI {
    static let executable: URL = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent(".build/debug/backstop")

    /// Whether the binary exists and has the `keychain` command (it may be stale or not built yet).
    static let isAvailable: Bool = {
        guard FileManager.default.isExecutableFile(atPath: executable.path) else { return false }
        return (try? run(["keychain", "--help"]).status) == 0
    }()

    struct Result {
        var status: Int32
        var stdout: String
        var stderr: String
        var killedBySignal: Bool
    }

    /// Runs the binary to completion (its process group killed after `deadline`), feeding `stdin` and collecting
    /// its output.
    static func run(
        _ arguments: [String], stdin: [UInt8] = [], deadline: Duration = .seconds(60),
        environment: [String: String] = [:]
    ) throws -> Result {
        finish(try start(arguments, stdin: stdin, environment: environment), within: deadline)
    }

    /// `environment` is added to the test runner's own. `stdin` is written as the child reads it, on a thread of
    /// its own (a secret is at most 1 MiB, more than a pipe holds).
    static func start(
        _ arguments: [String], stdin: [UInt8] = [], environment: [String: String] = [:]
    ) throws
        -> ChildProcess
    {
        try ChildProcess.spawn(
            executable.path, arguments,
            environment: environment.isEmpty
                ? nil : ProcessInfo.processInfo.environment.merging(environment) { _, new in new },
            standardInput: .bytes(stdin), standardOutput: .pipe, standardError: .pipe)
    }

    static func finish(_ process: ChildProcess, within deadline: Duration = .seconds(60)) -> Result {
        let outputs = process.readOutputs(within: deadline)
        return Result(
            status: process.terminationStatus, stdout: String(decoding: outputs.standardOutput, as: UTF8.self),
            stderr: String(decoding: outputs.standardError, as: UTF8.self), killedBySignal: process.killedBySignal)
    }
}
