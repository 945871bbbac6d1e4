#!/usr/bin/env python3
"""Idle keep-alive clients for bench/run.sh: opens N TCP connections to 127.0.0.1:PORT, sends one keep-alive
request on each, reads every response, keeps all N open while it samples VmRSS of PID, then closes them.
Prints one JSON object. Every wait has a deadline.

usage: idle_clients.py PORT N PID [HOST] [HOLD_SECONDS]
"""
import json
import resource
import selectors
import socket
import sys
import time

PORT, N, PID = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
HOST = sys.argv[4] if len(sys.argv) > 4 else "origin.test"
HOLD = float(sys.argv[5]) if len(sys.argv) > 5 else 3.0
DEADLINE = 60.0  # seconds, for connecting and for reading all responses

soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
want = max(4096, N + 64)
if soft < want:
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard) if hard != resource.RLIM_INFINITY else want, hard))


def status_kb(key):
    try:
        with open(f"/proc/{PID}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def connect_all():
    socks = []
    end = time.monotonic() + DEADLINE
    for _ in range(N):
        if time.monotonic() > end:
            break
        s = socket.create_connection(("127.0.0.1", PORT), timeout=10)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        socks.append(s)
    return socks


def parse(buf):
    """Returns (status, complete) for a buffered response with Content-Length (or chunked, to the 0 chunk)."""
    head, sep, body = buf.partition(b"\r\n\r\n")
    if not sep:
        return None, False
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(b":")
        headers[k.strip().lower()] = v.strip()
    if b"content-length" in headers:
        return status, len(body) >= int(headers[b"content-length"])
    if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        return status, body.endswith(b"0\r\n\r\n")
    return status, True


rss_before = status_kb("VmRSS")
anon_before = status_kb("RssAnon")
t0 = time.monotonic()
socks = connect_all()
request = f"GET / HTTP/1.1\r\nHost: {HOST}\r\nUser-Agent: backstop-bench\r\n\r\n".encode()
for s in socks:
    s.sendall(request)

sel = selectors.DefaultSelector()
bufs = {}
for s in socks:
    s.setblocking(False)
    sel.register(s, selectors.EVENT_READ)
    bufs[s] = b""
statuses = {}
closed_early = 0
end = time.monotonic() + DEADLINE
while len(statuses) + closed_early < len(socks) and time.monotonic() < end:
    for key, _ in sel.select(timeout=1.0):
        s = key.fileobj
        try:
            data = s.recv(65536)
        except BlockingIOError:
            continue
        except OSError:
            data = b""
        if not data:
            closed_early += 1
            sel.unregister(s)
            continue
        bufs[s] += data
        status, done = parse(bufs[s])
        if done:
            statuses[s] = status
            sel.unregister(s)
setup_s = time.monotonic() - t0

# Hold the connections idle, sampling the daemon's RSS.
samples = []
hold_end = time.monotonic() + HOLD
while time.monotonic() < hold_end:
    samples.append(status_kb("VmRSS") or 0)
    time.sleep(0.25)
rss_open = status_kb("VmRSS")
anon_open = status_kb("RssAnon")

# Connections the daemon closed while they were idle read as EOF now.
still_open = 0
for s in socks:
    try:
        if s.recv(1) != b"":  # unexpected bytes, but the connection is still open
            still_open += 1
    except BlockingIOError:  # nothing to read: open and idle
        still_open += 1
    except OSError:
        pass
for s in socks:
    s.close()
time.sleep(1.0)
rss_after = status_kb("VmRSS")

print(json.dumps({
    "connections": N,
    "opened": len(socks),
    "responses_2xx": sum(1 for v in statuses.values() if 200 <= v < 300),
    "responses": len(statuses),
    "closed_early": closed_early,
    "still_open_after_hold": still_open,
    "setup_s": round(setup_s, 3),
    "rss_before_kb": rss_before,
    "rss_open_kb": rss_open,
    "rss_before_anon_kb": anon_before,
    "rss_open_anon_kb": anon_open,
    "rss_open_max_kb": max(samples) if samples else rss_open,
    "rss_after_close_kb": rss_after,
    "hwm_kb": status_kb("VmHWM"),
}))
