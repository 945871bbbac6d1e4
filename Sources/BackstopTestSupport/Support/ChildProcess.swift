import CProcessControl
import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// A child process started with `posix_spawn` and reaped with `waitpid`: how `DaemonProcess`, `TestProcess` and
/// `SpawnedProcess` start processes (a few tests and `FaultShim` still use `Process` directly, and move here next).
///
/// Not Foundation's `Process`: on this toolchain its `run()` copies the whole 256-byte `d_name` of every
/// `/proc/self/fd` entry it lists, which can read past the end of `readdir`'s buffer and crash the test process
/// (SIGSEGV in `memcpy` under `Process.run()`, seen once in a whole-suite run here; fixed upstream in
/// swift-corelibs-foundation after the 6.3 release). The child gets stdin from `/dev/null`, stdout and stderr in
/// files, no other descriptor of the test process, and a process group of its own (as `Process` gave it).
public final class ChildProcess: Sendable {
    public let pid: pid_t
    /// The raw `waitpid` status once the child is reaped.
    private let reaped = Mutex<Int32?>(nil)

    private init(pid: pid_t) { self.pid = pid }

    /// Starts `executable` with `arguments`. `standardOutput`: a file (created, or appended to); `standardError`: another
    /// file, or nil for the same one as stdout. `environment` nil: this process's.
    public static func spawn(
        _ executable: String, _ arguments: [String], environment: [String: String]? = nil,
        workingDirectory: String? = nil, standardOutput: String, standardError: String? = nil
    ) throws -> ChildProcess {
        var actions = posix_spawn_file_actions_t()
        try check(posix_spawn_file_actions_init(&actions), executable, "spawn file actions")
        defer { posix_spawn_file_actions_destroy(&actions) }
        var added = [
            posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0),
            posix_spawn_file_actions_addopen(&actions, 1, standardOutput, O_WRONLY | O_CREAT | O_APPEND, 0o600),
        ]
        if let standardError {
            added.append(
                posix_spawn_file_actions_addopen(&actions, 2, standardError, O_WRONLY | O_CREAT | O_APPEND, 0o600))
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
        let spawned =
            envp.map { posix_spawn(&pid, executable, &actions, &attributes, argv, $0) }
            ?? posix_spawn(&pid, executable, &actions, &attributes, argv, environ)
        try check(spawned, executable, "spawn")
        return ChildProcess(pid: pid)
    }

    /// The raw status when the child has exited (reaping it), nil while it runs. Never blocks.
    private func poll() -> Int32? {
        reaped.withLock { reaped in
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

    /// The child ended by a signal.
    public var killedBySignal: Bool {
        guard let status = poll() else { return false }
        return (status & 0x7F) != 0 && (status & 0x7F) != 0x7F
    }

    /// Blocks the calling thread until the child exits (for tools that depend on nothing in this process).
    public func waitUntilExit() {
        reaped.withLock { reaped in
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
    }

    private static func check(_ result: Int32, _ executable: String, _ step: String) throws {
        guard result != 0 else { return }
        throw SpawnedProcessError("\(executable): \(step): \(String(cString: strerror(result)))")
    }
}
