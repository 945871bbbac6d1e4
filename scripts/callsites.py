#!/usr/bin/env python3
"""Where the calls to some functions come from, by source line, per request.

Reads a callgrind profile made with per-instruction positions (`KEEP_PROFILES=DIR IR_DUMP_INSTR=1 bash
scripts/instructions.sh BINARY`), takes every call to a function whose name matches PATTERN, and maps each call
site's address to its source line (inlined frames included) with `llvm-symbolizer` on the unstripped BINARY
(instructions.sh counts a copy stripped of its DWARF 5, which valgrind 3.19 cannot read; the code and its
addresses are the same). Prints the calls per request by line, the lines with most first
(docs/performance.md#measuring-a-change).

    python3 scripts/callsites.py PROFILE BINARY REQUESTS [PATTERN] [N]
    python3 scripts/callsites.py DIR/backstop.callgrind /tmp/backstop 6003 '^swift_(retain|release)$' 60

PATTERN defaults to Swift's reference counting (`swift_retain`, `swift_release`, their `_n` and bridge-object
forms); REQUESTS is the count instructions.sh printed for the profile.
"""
import collections
import re
import subprocess
import sys


def parse(path, binary_pattern, pattern):
    """(caller address in BINARY, calls) for every call to a function matching `pattern`."""
    names = {}  # compressed ids of fn= / cfn= / ob=
    sites = collections.Counter()
    callers = {}  # site address -> the calling function's (mangled) name
    function = None
    obj = None
    callee = None
    pending = None  # calls count waiting for its call-site line
    addr = 0

    def name_of(kind, value):
        m = re.match(r"\((\d+)\)(?: (.*))?", value)
        if not m:
            return value
        key = (kind, m.group(1))
        if m.group(2) is not None:
            names[key] = m.group(2)
        return names.get(key, "")

    def position(token, current):
        if token.startswith("0x"):
            return int(token, 16)
        if token.startswith("+"):
            return current + int(token[1:], 16 if token[1:].startswith("0x") else 10)
        if token.startswith("-"):
            return current - int(token[1:], 16 if token[1:].startswith("0x") else 10)
        if token == "*":
            return current
        return int(token)

    with open(path) as f:
        for line in f:
            if line.startswith("ob="):
                obj = name_of("ob", line[3:].strip())
            elif line.startswith("cob="):
                name_of("ob", line[4:].strip())  # only to learn a compressed name the file may use again
            elif line.startswith("fn="):
                function = name_of("fn", line[3:].strip())
            elif line.startswith("cfn="):
                callee = name_of("fn", line[4:].strip())
            elif line.startswith("calls="):
                pending = int(line[6:].split()[0])
            elif line and (line[0] in "+-*" or line.startswith("0x")):
                addr = position(line.split()[0], addr)
                if pending is not None:
                    if callee and re.search(pattern, callee) and obj and re.search(binary_pattern, obj):
                        sites[addr] += pending
                        callers[addr] = function
                    pending = None
    return sites, callers


BACK = 48  # bytes looked back from a call for the nearest source line


def symbolize(binary, addresses):
    """address -> list of 'function (file:line)' frames, innermost first.

    Reference counting the optimizer inserts has line 0: such a call is named by the nearest instruction before it
    (at most BACK bytes back, in the same function) that has a line, marked with `~`.
    """
    queries = [a - d for a in addresses for d in range(BACK)]
    out = subprocess.run(
        ["llvm-symbolizer", "--obj=" + binary, "--inlining", "--demangle", "--functions=short"],
        input="\n".join(hex(q) for q in queries) + "\n", capture_output=True, text=True).stdout
    blocks = out.strip("\n").split("\n\n")
    frames = {}
    for n, address in enumerate(addresses):
        chosen = None
        for d in range(BACK):
            lines = blocks[n * BACK + d].split("\n")
            chain = [(lines[i], lines[i + 1].split("/Sources/")[-1]) for i in range(0, len(lines) - 1, 2)]
            if d == 0:
                chosen = chain
                if chain and not re.search(r":0:0$", chain[0][1]):
                    break
                continue
            if chain and chain[-1][0] == chosen[-1][0] and not re.search(r":0:0$", chain[0][1]):
                chosen = [(chain[0][0] + " ~", chain[0][1])] + chain[1:]
                break
        frames[address] = [f"{fn} ({where})" for fn, where in chosen or []]
    return frames


def demangle(names):
    """mangled -> short demangled name (swift demangle --simplified)."""
    names = sorted(n for n in names if n)
    out = subprocess.run(["swift", "demangle", "--simplified", "--compact"], input="\n".join(names) + "\n",
                         capture_output=True, text=True).stdout.split("\n")
    return {name: (out[i] if i < len(out) and out[i] else name)[:150] for i, name in enumerate(names)}


def main():
    if len(sys.argv) < 4:
        print(__doc__)
        sys.exit(2)
    profile, binary, requests = sys.argv[1], sys.argv[2], float(sys.argv[3])
    pattern = sys.argv[4] if len(sys.argv) > 4 else r"^swift_(retain|release|bridgeObjectRetain|bridgeObjectRelease)(_n)?$"
    limit = int(sys.argv[5]) if len(sys.argv) > 5 else 60
    # The profile names the stripped copy instructions.sh ran (backstop-N): match on the object's role, not path.
    sites, callers = parse(profile, r"/backstop-\d+$", pattern)
    frames = symbolize(binary, sorted(sites))
    demangled = demangle(set(callers.values()))
    by_line = collections.Counter()
    for address, calls in sites.items():
        chain = frames.get(address) or ["?"]
        where = " <- ".join(chain[:3])
        if where.startswith("?? "):
            # No line anywhere near (an outlined copy or destroy, a thunk): the function callgrind saw.
            where = "in " + demangled.get(callers.get(address), "?")
        by_line[where] += calls
    total = sum(by_line.values())
    print(f"{total / requests:.1f} calls per request matching {pattern}")
    for where, calls in by_line.most_common(limit):
        print(f"{calls / requests:7.2f}  {where[:230]}")


if __name__ == "__main__":
    main()
