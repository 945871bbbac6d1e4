import CProcessControl

#if canImport(Glibc)
import Glibc
#endif

/// Keeps the daemon's secrets (the keychain key, tokens, the interception CA's key) out of core files
/// (docs/reference/operations.md#core-files): the process becomes non-dumpable, so the kernel writes no core and
/// hands none to systemd-coredump, other processes of its user cannot ptrace it or read its memory, and its
/// /proc/PID files belong to root; and its core size limit becomes 0, soft and hard, so not even a process that
/// regained dumpability could write one. Done first thing in `run`, before the key is read.
enum CoreDumps {
    /// Applies both; returns what failed (empty when both took effect), for warnings once logging is set up.
    static func disable() -> [String] {
        var problems: [String] = []
        if backstop_set_dumpable(0) != 0 {
            problems.append("prctl(PR_SET_DUMPABLE, 0) failed: \(String(cString: strerror(errno)))")
        }
        var limit = rlimit()
        // The unit's LimitCORE=0 has already done it: no need for a call the unit's syscall filter might not allow.
        if getrlimit(Int32(RLIMIT_CORE.rawValue), &limit) == 0, limit.rlim_cur == 0, limit.rlim_max == 0 {
            return problems
        }
        var zero = rlimit(rlim_cur: 0, rlim_max: 0)
        if setrlimit(Int32(RLIMIT_CORE.rawValue), &zero) != 0 {
            problems.append("setrlimit(RLIMIT_CORE, 0) failed: \(String(cString: strerror(errno)))")
        }
        return problems
    }
}
