import CProcessControl
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Runs a command with `posix_spawn` and reaps it with `waitpid` on a thread of its own, with stdin from
/// `/dev/null` and stdout and stderr in files. For commands whose own children outlive them (`pg_ctl start` leaves a
/// server running): Foundation's `Process` was seen here to miss such a child's exit now and then and wait forever.
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
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        let added = [
            posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0),
            posix_spawn_file_actions_addopen(&actions, 1, outPath, O_WRONLY | O_CREAT | O_TRUNC, 0o600),
            posix_spawn_file_actions_addopen(&actions, 2, errPath, O_WRONLY | O_CREAT | O_TRUNC, 0o600),
            // Nothing else inherited: a server the command leaves running (pg_ctl start) would otherwise hold
            // whatever descriptors the test process had open without close-on-exec (a caller's lock file, a pipe a
            // CI harness reads to its end) for as long as it runs.
            backstop_spawn_close_from(&actions, 3),
        ]
        if let failed = added.first(where: { $0 != 0 }) {
            throw SpawnedProcessError("\(executable): spawn file actions: \(String(cString: strerror(failed)))")
        }
        let argv: [UnsafeMutablePointer<CChar>?] = ([executable] + arguments).map { strdup($0) } + [nil]
        defer { for pointer in argv { free(pointer) } }
        var pid: pid_t = 0
        let spawned = posix_spawn(&pid, executable, &actions, nil, argv, environ)
        guard spawned == 0 else {
            throw SpawnedProcessError("\(executable): \(String(cString: strerror(spawned)))")
        }
        let deadline = ContinuousClock.now + timeout
        var status: Int32 = 0
        while true {
            let reaped = waitpid(pid, &status, WNOHANG)
            if reaped == pid { break }
            if reaped < 0 && errno != EINTR {
                throw SpawnedProcessError("waitpid: \(String(cString: strerror(errno)))")
            }
            if ContinuousClock.now > deadline {
                kill(pid, SIGKILL)
                _ = waitpid(pid, &status, 0)
                throw SpawnedProcessError("\(executable) did not finish within \(timeout)")
            }
            try await Task.sleep(for: .milliseconds(10))
        }
        let code = (status & 0x7f) == 0 ? (status >> 8) & 0xff : 128 + (status & 0x7f)
        let out = (try? String(contentsOfFile: outPath, encoding: .utf8)) ?? ""
        let err = (try? String(contentsOfFile: errPath, encoding: .utf8)) ?? ""
        return TestProcessResult(status: code, standardOutput: out, standardError: err)
    }
}

public struct SpawnedProcessError: Error, CustomStringConvertible {
    public let description: String
    init(_ description: String) { self.description = description }
}
