import Foundation

/// An `LD_PRELOAD` library that makes real system calls of a child process (`backstop`, `backstop-queue-probe`)
/// fail (or kill it) at one chosen step, so crash-safety is tested on the real binary and the real filesystem
/// rather than on a fake.
///
/// `BACKSTOP_FAULT` selects the fault:
/// - `write:SUBSTR` — `write(2)` to a file whose path contains SUBSTR fails with EIO;
/// - `fsync:SUBSTR` — `fsync(2)` of a regular file whose path contains SUBSTR fails with EIO;
/// - `kill-on-fsync:SUBSTR` — the process is killed (SIGKILL) inside that `fsync(2)`;
/// - `kill-on-fsync-number:N:SUBSTR` — killed inside the N-th (1-based) `fsync(2)` or `fdatasync(2)` of files
///   whose path contains SUBSTR, counted across threads (a commit's data written, not yet synced);
/// - `kill-after-rename` — the process is killed right after the first successful `rename(2)`;
/// - `fsync-dir-after-rename` — every `fsync(2)` of a directory after a successful `rename(2)` fails with EIO.
/// Paths are read from `/proc/self/fd` (an unnamed `O_TMPFILE` file shows as `DIR/#N (deleted)`).
public enum FaultShim {
    static let source = #"""
        #define _GNU_SOURCE
        #include <dlfcn.h>
        #include <errno.h>
        #include <signal.h>
        #include <stdio.h>
        #include <stdlib.h>
        #include <string.h>
        #include <sys/stat.h>
        #include <unistd.h>

        static int renamed = 0;

        static int fd_path_contains(int fd, const char *needle) {
            char link[64], target[4096];
            snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
            ssize_t n = readlink(link, target, sizeof target - 1);
            if (n < 0) return 0;
            target[n] = 0;
            return strstr(target, needle) != NULL;
        }

        static const char *fault_arg(const char *kind) {
            const char *spec = getenv("BACKSTOP_FAULT");
            size_t len = strlen(kind);
            if (!spec || strncmp(spec, kind, len) != 0 || spec[len] != ':') return NULL;
            return spec + len + 1;
        }

        static int fault_is(const char *kind) {
            const char *spec = getenv("BACKSTOP_FAULT");
            return spec && strcmp(spec, kind) == 0;
        }

        ssize_t write(int fd, const void *buf, size_t count) {
            static ssize_t (*real)(int, const void *, size_t);
            if (!real) real = dlsym(RTLD_NEXT, "write");
            const char *needle = fault_arg("write");
            if (needle && fd > 2 && fd_path_contains(fd, needle)) { errno = EIO; return -1; }
            return real(fd, buf, count);
        }

        static int syncs = 0;

        static void kill_on_numbered_sync(int fd) {
            const char *arg = fault_arg("kill-on-fsync-number");
            if (!arg) return;
            char *rest;
            long n = strtol(arg, &rest, 10);
            if (*rest != ':' || !fd_path_contains(fd, rest + 1)) return;
            if (__atomic_add_fetch(&syncs, 1, __ATOMIC_SEQ_CST) == n) kill(getpid(), SIGKILL);
        }

        int fdatasync(int fd) {
            static int (*real)(int);
            if (!real) real = dlsym(RTLD_NEXT, "fdatasync");
            kill_on_numbered_sync(fd);
            return real(fd);
        }

        int fsync(int fd) {
            static int (*real)(int);
            if (!real) real = dlsym(RTLD_NEXT, "fsync");
            struct stat st;
            int is_dir = fstat(fd, &st) == 0 && S_ISDIR(st.st_mode);
            const char *needle;
            if (!is_dir) kill_on_numbered_sync(fd);
            if (!is_dir && (needle = fault_arg("fsync")) && fd_path_contains(fd, needle)) { errno = EIO; return -1; }
            if (!is_dir && (needle = fault_arg("kill-on-fsync")) && fd_path_contains(fd, needle)) kill(getpid(), SIGKILL);
            if (is_dir && renamed && fault_is("fsync-dir-after-rename")) { errno = EIO; return -1; }
            return real(fd);
        }

        int rename(const char *from, const char *to) {
            static int (*real)(const char *, const char *);
            if (!real) real = dlsym(RTLD_NEXT, "rename");
            int rc = real(from, to);
            if (rc == 0) {
                renamed = 1;
                if (fault_is("kill-after-rename")) kill(getpid(), SIGKILL);
            }
            return rc;
        }
        """#

    /// Builds the library once per test process; nil (with the reason) when no C compiler is available.
    public static let library: Result<String, ShimUnavailable> = {
        let directory = NSTemporaryDirectory() + "backstop-fault-shim-\(getpid())"
        try? FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let sourcePath = directory + "/shim.c"
        let libraryPath = directory + "/libfault.so"
        do {
            try source.write(toFile: sourcePath, atomically: true, encoding: .utf8)
        } catch {
            return .failure(ShimUnavailable(reason: "cannot write \(sourcePath)"))
        }
        for compiler in ["/opt/swift/usr/bin/clang", "/usr/bin/clang", "/usr/bin/cc", "/usr/bin/gcc"]
        where FileManager.default.isExecutableFile(atPath: compiler) {
            guard
                let process = try? ChildProcess.spawn(
                    compiler, ["-shared", "-fPIC", "-O1", "-o", libraryPath, sourcePath, "-ldl"],
                    standardOutput: .null)
            else { continue }
            process.waitUntilExit()
            if process.terminationStatus == 0 { return .success(libraryPath) }
        }
        return .failure(ShimUnavailable(reason: "no C compiler could build the fault-injection library"))
    }()

    public struct ShimUnavailable: Error { public var reason: String }
}
