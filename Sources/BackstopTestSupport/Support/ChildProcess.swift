import CProcessControl
import Foundation
import NIOConcurrencyHelpers

#if canImport(Glibc)
import Glibc
#endif

/// A child process started with `posix_spawn` and reaped with `waitpid`: how every test and test helper starts a
/// process.
///
/// Not Foundation's `Process`: on this toolchain its `run()` copies the whole 256-byte `d_name` of every
/// `/proc/self/fd` entry it lists, which can read past the end of `readdir`'s buffer and crash the test process
/// (SIGSEGV in `memcpy` under `Process.run()`, seen once in a whole-suite run here; fixed upstream in
/// swift-corelibs-foundation after the 6.3 release). The child gets the standard streams asked for, no other
/// descriptor of the test process, and a process group of its own (as `Process` gave it).
public final class ChildProcess: Sendable {
    /// What a child reads on stdin.
    public enum Input: Sendable {
        case null
        /// These bytes through a pipe, then end of file. A thread of its own writes them, so a child that reads
        /// slowly (or is killed before it reads) never blocks the test; a secret goes this way, never into a file.
        case bytes([UInt8])
    }

    /// Where a child's stdout or stderr goes.
    public enum Output: Sendable {
        case null
        /// A file, created or appended to.
        case file(String)
        /// A pipe this process reads: `readOutputs(within:)`, or `standardOutputDescriptor` line by line.
        case pipe
    }

    /// What `readOutputs(within:)` collected.
    public struct Outputs: Sendable {
        public var standardOutput: [UInt8]
        public var standardError: [UInt8]
        /// The time limit passed and the child's process group was killed.
        public var timedOut: Bool
    }

    public let pid: pid_t
    /// The raw `waitpid` status once the child is reaped.
    private let reaped = NIOLockedValueBox<Int32?>(nil)
    /// This process's ends of the output pipes, closed once read to the end (or when the child goes).
    private let pipes: NIOLockedValueBox<(output: Int32?, error: Int32?)>

    private init(pid: pid_t, output: Int32?, error: Int32?) {
        self.pid = pid
        self.pipes = NIOLockedValueBox((output, error))
    }

    /// Starts `executable` with `arguments`. `standardError` nil: the same as stdout. `environment` nil: this
    /// process's.
    public static func spawn(
        _ executable: String, _ arguments: [String], environment: [String: String]? = nil,
        workingDirectory: String? = nil, standardInput: Input = .null, standardOutput: Output,
        standardError: Output? = nil
    ) throws -> ChildProcess {
        // Every descriptor made here is this process's until the spawn has copied it; the child's ends close below
        // whatever happens, ours on a failure.
        var childEnds: [Int32] = []
        var ourEnds: [Int32] = []
        var spawned = false
        defer {
            for fd in childEnds { close(fd) }
            if !spawned { for fd in ourEnds { close(fd) } }
        }
        func makePipe() throws -> (read: Int32, write: Int32) {
            var ends: [Int32] = [-1, -1]
            guard backstop_pipe_cloexec(&ends) == 0 else {
                throw SpawnedProcessError("\(executable): pipe: \(String(cString: strerror(errno)))")
            }
            return (ends[0], ends[1])
        }

        var actions = posix_spawn_file_actions_t()
        try check(posix_spawn_file_actions_init(&actions), executable, "spawn file actions")
        defer { posix_spawn_file_actions_destroy(&actions) }
        var added: [Int32] = []
        var inputWriter: (fd: Int32, bytes: [UInt8])?
        switch standardInput {
        case .null:
            added.append(posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0))
        case .bytes(let bytes):
            let ends = try makePipe()
            childEnds.append(ends.read)
            ourEnds.append(ends.write)
            added.append(posix_spawn_file_actions_adddup2(&actions, ends.read, 0))
            inputWriter = (ends.write, bytes)
        }
        func direct(_ output: Output, to target: Int32) throws -> Int32? {
            switch output {
            case .null:
                added.append(posix_spawn_file_actions_addopen(&actions, target, "/dev/null", O_WRONLY, 0))
                return nil
            case .file(let path):
                added.append(
                    posix_spawn_file_actions_addopen(&actions, target, path, O_WRONLY | O_CREAT | O_APPEND, 0o600))
                return nil
            case .pipe:
                let ends = try makePipe()
                childEnds.append(ends.write)
                ourEnds.append(ends.read)
                added.append(posix_spawn_file_actions_adddup2(&actions, ends.write, target))
                return ends.read
            }
        }
        let outputReader = try direct(standardOutput, to: 1)
        var errorReader: Int32?
        if let standardError {
            errorReader = try direct(standardError, to: 2)
        } else {
            added.append(posix_spawn_file_actions_adddup2(&actions, 1, 2))
        }
        if let workingDirectory {
            added.append(backstop_spawn_chdir(&actions, workingDirectory))
        }
        // Nothing else inherited: a child that outlives its test (a server `pg_ctl start` leaves) would otherwise hold
        // whatever descriptors the test process had open without close-on-exec.
        added.append(backstop_spawn_close_from(&actions, 3))
        for result in added { try check(result, executable, "spawn file actions") }

        var attributes = posix_spawnattr_t()
        try check(posix_spawnattr_init(&attributes), executable, "spawn attributes")
        defer { posix_spawnattr_destroy(&attributes) }
        try check(posix_spawnattr_setpgroup(&attributes, 0), executable, "spawn attributes")
        try check(posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETPGROUP)), executable, "spawn attributes")

        let argv: [UnsafeMutablePointer<CChar>?] = ([executable] + arguments).map { strdup($0) } + [nil]
        defer { for pointer in argv { free(pointer) } }
        let envp: [UnsafeMutablePointer<CChar>?]? = environment.map {
            $0.map { strdup("\($0.key)=\($0.value)") } + [nil]
        }
        defer { for pointer in envp ?? [] { free(pointer) } }
        var pid: pid_t = 0
        let result =
            envp.map { posix_spawn(&pid, executable, &actions, &attributes, argv, $0) }
            ?? posix_spawn(&pid, executable, &actions, &attributes, argv, Glibc.environ)
        try check(result, executable, "spawn")
        spawned = true
        if let inputWriter { feed(inputWriter.bytes, to: inputWriter.fd) }
        return ChildProcess(pid: pid, output: outputReader, error: errorReader)
    }

    /// Writes `bytes` to `fd` on a thread of its own, then closes it. A child gone before reading everything ends
    /// the write with EPIPE: SIGPIPE is ignored for that, or it would end the test process.
    private static func feed(_ bytes: [UInt8], to fd: Int32) {
        signal(SIGPIPE, SIG_IGN)
        Thread.detachNewThread {
            var offset = 0
            while offset < bytes.count {
                let written = bytes[offset...].withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
                if written > 0 {
                    offset += written
                } else if written < 0 && errno == EINTR {
                    continue
                } else {
                    break
                }
            }
            close(fd)
        }
    }

    /// This process's end of the stdout pipe (`.pipe` only), for reading line by line; still owned by the child
    /// value, which closes it.
    public var standardOutputDescriptor: Int32? { pipes.withLockedValue { $0.output } }

    /// Reads the output pipes until they end and the child exits, then reaps it; past `timeout` the child's process
    /// group is killed and what it wrote before is still returned (reading goes on 5 s more, for a grandchild holding a
    /// pipe).
    public func readOutputs(within timeout: Duration) -> Outputs {
        var open = pipes.withLockedValue { pipes -> [(fd: Int32, isError: Bool)] in
            defer { pipes = (nil, nil) }
            return [pipes.output.map { ($0, false) }, pipes.error.map { ($0, true) }].compactMap { $0 }
        }
        var outputs = Outputs(standardOutput: [], standardError: [], timedOut: false)
        var deadline = ContinuousClock.now + timeout
        var buffer = [UInt8](repeating: 0, count: 65536)
        while !open.isEmpty {
            let left = deadline - .now
            if left <= .zero {
                if outputs.timedOut { break }
                outputs.timedOut = true
                kill(-pid, SIGKILL)
                deadline = .now + .seconds(5)
                continue
            }
            var polled = open.map { pollfd(fd: $0.fd, events: Int16(POLLIN), revents: 0) }
            let milliseconds = Int32(min(60_000, (left / .milliseconds(1)).rounded(.up)))
            let ready = Glibc.poll(&polled, nfds_t(polled.count), milliseconds)
            if ready < 0 && errno != EINTR { break }
            for (index, entry) in polled.enumerated().reversed() where entry.revents != 0 {
                let count = buffer.withUnsafeMutableBytes { read(entry.fd, $0.baseAddress, $0.count) }
                if count > 0 {
                    if open[index].isError {
                        outputs.standardError += buffer[..<count]
                    } else {
                        outputs.standardOutput += buffer[..<count]
                    }
                } else if count == 0 || errno != EINTR {
                    close(entry.fd)
                    open.remove(at: index)
                }
            }
        }
        for entry in open { close(entry.fd) }
        // The pipes ended (or there were none) but the child may still run: the same time limit holds for its exit.
        while isRunning && !outputs.timedOut {
            if ContinuousClock.now >= deadline {
                outputs.timedOut = true
                kill(-pid, SIGKILL)
            } else {
                _ = Glibc.poll(nil, 0, 5)
            }
        }
        waitUntilExit()
        return outputs
    }

    /// The raw status when the child has exited (reaping it), nil while it runs. Never blocks.
    private func poll() -> Int32? {
        reaped.withLockedValue { reaped in
            if let reaped { return reaped }
            var status: Int32 = 0
            let result = waitpid(pid, &status, WNOHANG)
            if result == pid {
                reaped = status
            } else if result < 0 && errno == ECHILD {
                // Not ours to wait for any more (cannot happen unless something else reaped it): gone all the same.
                reaped = 0xFF00
            }
            return reaped
        }
    }

    public var isRunning: Bool { poll() == nil }

    /// As Foundation's `Process.terminationStatus`: the exit code, or the number of the signal that ended the child;
    /// 0 while it runs.
    public var terminationStatus: Int32 {
        guard let status = poll() else { return 0 }
        return (status & 0x7F) == 0 ? (status >> 8) & 0xFF : status & 0x7F
    }

    /// The status as a shell reports it: the exit code, or 128 plus the number of the signal that ended the child.
    public var exitCode: Int32 { killedBySignal ? 128 + terminationStatus : terminationStatus }

    /// The child ended by a signal.
    public var killedBySignal: Bool {
        guard let status = poll() else { return false }
        return (status & 0x7F) != 0 && (status & 0x7F) != 0x7F
    }

    /// Blocks the calling thread until the child exits (for tools that depend on nothing in this process).
    public func waitUntilExit() {
        reaped.withLockedValue { reaped in
            guard reaped == nil else { return }
            var status: Int32 = 0
            while true {
                let result = waitpid(pid, &status, 0)
                if result == pid { break }
                if result < 0 && errno != EINTR {
                    status = 0xFF00
                    break
                }
            }
            reaped = status
        }
    }

    /// A child still running when its owner goes is killed and reaped: no test leaves a process or a zombie behind.
    deinit {
        if isRunning {
            kill(pid, SIGKILL)
            waitUntilExit()
        }
        let left = pipes.withLockedValue { $0 }
        for fd in [left.output, left.error].compactMap({ $0 }) { close(fd) }
    }

    private static func check(_ result: Int32, _ executable: String, _ step: String) throws {
        guard result != 0 else { return }
        throw SpawnedProcessError("\(executable): \(step): \(String(cString: strerror(result)))")
    }
}
