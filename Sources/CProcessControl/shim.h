// prctl(2) is variadic, and Swift cannot call a variadic C function: fixed-arity wrappers, one per use. And three
// glibc functions Swift's Glibc module does not show.
#ifndef BACKSTOP_PROCESS_CONTROL_H
#define BACKSTOP_PROCESS_CONTROL_H

#ifdef __linux__
#include <fcntl.h>
#include <spawn.h>
#include <sys/prctl.h>

// glibc declares pipe2 only under _GNU_SOURCE, and defining that here would change how this module sees glibc's
// types (`fd_set`) against Swift's Glibc module, failing a clean build. Declared as glibc has it instead.
extern int pipe2(int fds[2], int flags);

/// prctl(PR_SET_DUMPABLE, dumpable): 0 on success, -1 with errno set.
static inline int backstop_set_dumpable(int dumpable) {
    return prctl(PR_SET_DUMPABLE, (unsigned long)dumpable, 0UL, 0UL, 0UL);
}

/// prctl(PR_GET_DUMPABLE): 0 or 1 (2 under fs.suid_dumpable=2), or -1 with errno set.
static inline int backstop_get_dumpable(void) {
    return prctl(PR_GET_DUMPABLE, 0UL, 0UL, 0UL, 0UL);
}

/// posix_spawn_file_actions_addclosefrom_np (glibc 2.34+), which Swift's Glibc module does not show: the child closes
/// every descriptor from `from` up. 0 on success, else an error number.
static inline int backstop_spawn_close_from(posix_spawn_file_actions_t *actions, int from) {
    return posix_spawn_file_actions_addclosefrom_np(actions, from);
}

/// posix_spawn_file_actions_addchdir_np (glibc 2.29+), likewise not shown: the child changes to `path` before it
/// runs the program. 0 on success, else an error number.
static inline int backstop_spawn_chdir(posix_spawn_file_actions_t *actions, const char *path) {
    return posix_spawn_file_actions_addchdir_np(actions, path);
}

/// pipe2(fds, O_CLOEXEC): a pipe whose ends no process spawned meanwhile by another thread inherits. 0 on success,
/// -1 with errno set.
static inline int backstop_pipe_cloexec(int fds[2]) {
    return pipe2(fds, O_CLOEXEC);
}
#endif

#endif
