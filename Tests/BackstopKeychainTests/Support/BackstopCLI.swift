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

    /// Runs the binary to completion (killed after `deadline`), feeding `stdin` and collecting its output.
    static func run(
        _ arguments: [String], stdin: [UInt8] = [], deadline: TimeInterval = 60, environment: [String: String] = [:]
    ) throws -> Result {
        let process = try start(arguments, stdin: stdin, environment: environment)
        let watchdog = DispatchWorkItem { if process.isRunning { kill(process.processIdentifier, SIGKILL) } }
        DispatchQueue.global().asyncAfter(deadline: .now() + deadline, execute: watchdog)
        defer { watchdog.cancel() }
        return finish(process)
    }

    /// `environment` is added to the test runner's own.
    static func start(_ arguments: [String], stdin: [UInt8] = [], environment: [String: String] = [:]) throws -> Process
    {
        // A child that exits without reading all of stdin must cost an EPIPE, not a SIGPIPE of the test runner.
        signal(SIGPIPE, SIG_IGN)
        let process = Process()
        process.executableURL = executable
        process.arguments = arguments
        if !environment.isEmpty {
            process.environment = ProcessInfo.processInfo.environment.merging(environment) { _, new in new }
        }
        let input = Pipe()
        process.standardInput = input
        process.standardOutput = Pipe()
        process.standardError = Pipe()
        try process.run()
        // A secret is at most 1 MiB, more than a pipe buffer: write on another thread so a child killed before
        // reading cannot block us (the write then fails with EPIPE, which Foundation reports, not raises).
        let writer = input.fileHandleForWriting
        let bytes = Data(stdin)
        DispatchQueue.global().async {
            try? writer.write(contentsOf: bytes)
            try? writer.close()
        }
        return process
    }

    static func finish(_ process: Process) -> Result {
        let out = (process.standardOutput as! Pipe).fileHandleForReading.readDataToEndOfFile()
        let err = (process.standardError as! Pipe).fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return Result(
            status: process.terminationStatus, stdout: String(decoding: out, as: UTF8.self),
            stderr: String(decoding: err, as: UTF8.self), killedBySignal: process.terminationReason == .uncaughtSignal)
    }
}
