#!/usr/bin/env python3
"""Counts TCP connection attempts (SYN without ACK) to one port on the loopback interface, from start until
SIGTERM/SIGINT, then prints the count. bench/outage.sh uses it to count what each proxy sends to an endpoint
whose process is down: the kernel refuses those connections, so nothing in user space sees them otherwise.

A classic BPF filter on an AF_PACKET socket keeps every other packet in the kernel: the script wakes only for
the packets it counts. Needs root (CAP_NET_RAW).

    python3 bench/syn_counter.py PORT      # prints "ready" on stderr once counting
"""
import ctypes
import signal
import socket
import struct
import sys

ETH_P_ALL = 0x0003
SO_ATTACH_FILTER = 26
PACKET_HOST = 0

# Classic BPF opcodes.
LDH_ABS, LDB_ABS, LDH_IND, LDB_IND, LDX_MSH = 0x28, 0x30, 0x48, 0x50, 0xB1
JA, JEQ, JSET, AND, RET = 0x05, 0x15, 0x45, 0x54, 0x06


def assemble(lines):
    """`lines`: (label or None, code, k, jump-if-true label, jump-if-false label); jumps resolved to offsets
    (None: the next instruction). For JA (always), the true label becomes k."""
    where = {label: index for index, (label, *_rest) in enumerate(lines) if label}
    out = []
    for index, (_label, code, k, true, false) in enumerate(lines):
        jt = where[true] - index - 1 if true else 0
        jf = where[false] - index - 1 if false else 0
        if code == JA:
            k, jt, jf = jt, 0, 0
        out.append(struct.pack("HBBI", code, jt, jf, k))
    return len(lines), b"".join(out)


def syn_filter(port):
    """IPv4 or IPv6 behind the loopback's 14-byte Ethernet-style header; TCP; destination `port`; SYN set, ACK
    clear. Accepted packets are cut to 64 bytes: only their number matters."""
    return assemble([
        (None, LDH_ABS, 12, None, None),            # ethertype
        (None, JEQ, 0x0800, None, "v6"),
        (None, LDB_ABS, 23, None, None),            # IPv4 protocol
        (None, JEQ, 6, None, "drop"),
        (None, LDH_ABS, 20, None, None),            # flags and fragment offset
        (None, JSET, 0x1FFF, "drop", None),         # not the first fragment
        (None, LDX_MSH, 14, None, None),            # X = IPv4 header length
        (None, LDH_IND, 16, None, None),            # TCP destination port
        (None, JEQ, port, None, "drop"),
        (None, LDB_IND, 27, None, None),            # TCP flags
        (None, JA, 0, "flags", None),
        ("v6", JEQ, 0x86DD, None, "drop"),          # (reached with the ethertype in A)
        (None, LDB_ABS, 20, None, None),            # next header: loopback TCP has no extension headers
        (None, JEQ, 6, None, "drop"),
        (None, LDH_ABS, 56, None, None),            # TCP destination port
        (None, JEQ, port, None, "drop"),
        (None, LDB_ABS, 67, None, None),            # TCP flags
        ("flags", AND, 0x12, None, None),           # SYN | ACK
        (None, JEQ, 0x02, "accept", "drop"),
        ("drop", RET, 0, None, None),
        ("accept", RET, 64, None, None),
    ])


def main():
    port = int(sys.argv[1])
    count, program = syn_filter(port)
    code = ctypes.create_string_buffer(program)
    fprog = struct.pack("HL", count, ctypes.addressof(code))
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
    s.bind(("lo", 0))
    seen = 0

    def stop(*_):
        print(seen, flush=True)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print("ready", file=sys.stderr, flush=True)
    while True:
        _, address = s.recvfrom(128)
        # Loopback traffic is seen leaving and arriving: count arrivals only.
        if address[2] == PACKET_HOST:
            seen += 1


if __name__ == "__main__":
    main()
