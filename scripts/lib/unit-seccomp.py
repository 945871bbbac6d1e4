#!/usr/bin/env python3
"""Runs a command under the system call filter a systemd unit's `SystemCallFilter=` lines describe, as systemd would
build it (x86_64 only), for scripts/check-systemd.sh: systemd is not PID 1 on build machines, so the unit itself
cannot be started there.

    python3 scripts/lib/unit-seccomp.py UNIT_FILE COMMAND [ARG ...]

The allowed set follows systemd's rules: the first line is an allow list; later lines add names, or take them away
when they start with `~`. Group names (`@system-service`) are expanded with `systemd-analyze syscall-filter`. A call
outside the set fails with the unit's `SystemCallErrorNumber=` (an errno name), or kills the process with SIGSYS
when it has none, as systemd does (a filter cannot log: run the command under `strace -f` to see which call).
The `socket()` families of `RestrictAddressFamilies=` are not filtered."""
import ctypes
import errno
import os
import platform
import re
import struct
import subprocess
import sys

# The exit status when the filter cannot be set up here (no systemd-analyze, not x86_64, seccomp refused by a
# container): the caller skips the check rather than failing it.
CANNOT_RUN = 97


def cannot_run(message):
    print("unit-seccomp: " + message, file=sys.stderr)
    sys.exit(CANNOT_RUN)


def expand(name, seen):
    """The system call names of `name` (a group, recursively, or a single call)."""
    if not name.startswith("@"):
        return {name}
    try:
        output = subprocess.run(
            ["systemd-analyze", "syscall-filter", name], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        cannot_run("systemd-analyze syscall-filter %s: %s" % (name, error))
    names = set()
    for line in output.splitlines()[1:]:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("@"):
            if line not in seen:
                seen.add(line)
                names |= expand(line, seen)
        else:
            names.add(line)
    return names


def unit_filter(path):
    """(allowed names, errno number or None) from the unit's last-wins/accumulating filter lines."""
    allowed = None
    error_number = None
    for raw in open(path, encoding="utf-8"):
        line = raw.strip()
        if line.startswith("SystemCallFilter="):
            value = line.split("=", 1)[1].strip()
            deny = value.startswith("~")
            names = set()
            for word in value.lstrip("~").split():
                names |= expand(word, set())
            if allowed is None:
                if deny:
                    sys.exit("unit-seccomp: a deny list first is not supported")
                allowed = names
            elif deny:
                allowed -= names
            else:
                allowed |= names
        elif line.startswith("SystemCallErrorNumber="):
            error_number = getattr(errno, line.split("=", 1)[1].strip())
    if allowed is None:
        sys.exit("unit-seccomp: the unit has no SystemCallFilter=")
    return allowed, error_number


def main():
    if platform.machine() != "x86_64":
        cannot_run("x86_64 only")
    if len(sys.argv) < 3:
        sys.exit("usage: unit-seccomp.py UNIT_FILE COMMAND [ARG ...]")
    allowed, error_number = unit_filter(sys.argv[1])
    try:
        header = open("/usr/include/x86_64-linux-gnu/asm/unistd_64.h", encoding="utf-8").read()
    except OSError as error:
        cannot_run("system call numbers: %s" % error)
    numbers = {m.group(1): int(m.group(2)) for m in re.finditer(r"#define __NR_(\w+) (\d+)", header)}
    allow_action = 0x7FFF0000  # SECCOMP_RET_ALLOW
    deny_action = 0x80000000 if error_number is None else 0x00050000 | error_number  # KILL_PROCESS or ERRNO
    statement = lambda code, k: struct.pack("HBBI", code, 0, 0, k)
    jump = lambda code, k, true, false: struct.pack("HBBI", code, true, false, k)
    program = [statement(0x20, 4), jump(0x15, 0xC000003E, 1, 0), statement(0x06, 0x80000000), statement(0x20, 0)]
    for number in sorted({numbers[name] for name in allowed if name in numbers}):
        program += [jump(0x15, number, 0, 1), statement(0x06, allow_action)]
    program.append(statement(0x06, deny_action))
    code = b"".join(program)
    buffer = ctypes.create_string_buffer(code)

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = SockFprog(len(code) // 8, ctypes.addressof(buffer))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        cannot_run("PR_SET_NO_NEW_PRIVS failed")
    if libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        cannot_run("PR_SET_SECCOMP failed: errno %d" % ctypes.get_errno())
    os.execvp(sys.argv[2], sys.argv[2:])


main()
