#!/usr/bin/env python3
"""Throughput and round-trip latency of an upgraded connection (docs/reference/behaviour.md#upgrades) against a
blind CONNECT tunnel to the same origin, through one backstop binary, all on 127.0.0.1.

The origin answers any handshake `101 Switching Protocols` and then echoes raw bytes. The relay case sends the
handshake to Backstop as a proxied request (Backstop makes it over libcurl's CONNECT_ONLY connection); the tunnel
case sends `CONNECT` first, then the same handshake inside the tunnel. Then, on each: 2,000 one-byte round trips
(median and p99 latency), and 256 MiB echoed back in 64 KiB writes (MiB/s, both directions at once).

    python3 scripts/upgrade-relay-bench.py BINARY          # e.g. .build-release/release/backstop
"""
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time


def echo_origin():
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen(16)

    def serve(conn):
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = conn.recv(65536)
            if not chunk:
                return
            head += chunk
        conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
        rest = head.split(b"\r\n\r\n", 1)[1]
        if rest:
            conn.sendall(rest)
        while True:
            chunk = conn.recv(1 << 16)
            if not chunk:
                conn.close()
                return
            conn.sendall(chunk)

    def accept():
        while True:
            conn, _ = server.accept()
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return server.getsockname()[1]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def read_head(sock):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            raise RuntimeError("closed during the head: %r" % data)
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    assert not rest, rest
    return head.decode()


HANDSHAKE = "GET {target} HTTP/1.1\r\nHost: {host}\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n"


def open_relay(proxy):
    sock = socket.create_connection(("127.0.0.1", proxy))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(HANDSHAKE.format(target="http://echo.test/x", host="echo.test").encode())
    head = read_head(sock)
    assert head.startswith("HTTP/1.1 101"), head
    return sock


def open_tunnel(proxy, origin):
    sock = socket.create_connection(("127.0.0.1", proxy))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(("CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % (origin, origin)).encode())
    assert read_head(sock).startswith("HTTP/1.1 200"), "tunnel refused"
    sock.sendall(HANDSHAKE.format(target="/x", host="127.0.0.1").encode())
    assert read_head(sock).startswith("HTTP/1.1 101")
    return sock


def latency(sock, rounds=2000):
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        sock.sendall(b"x")
        assert sock.recv(1) == b"x"
        times.append(time.perf_counter() - started)
    times.sort()
    return statistics.median(times) * 1e6, times[int(len(times) * 0.99)] * 1e6


def throughput(sock, total=256 << 20):
    block = os.urandom(1 << 16)
    received = [0]

    def reader():
        while received[0] < total:
            chunk = sock.recv(1 << 20)
            if not chunk:
                break
            received[0] += len(chunk)

    thread = threading.Thread(target=reader)
    started = time.perf_counter()
    thread.start()
    sent = 0
    while sent < total:
        sock.sendall(block)
        sent += len(block)
    thread.join()
    elapsed = time.perf_counter() - started
    assert received[0] == total, received[0]
    return total / elapsed / (1 << 20)


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    binary = sys.argv[1]
    origin = echo_origin()
    proxy = free_port()
    work = tempfile.mkdtemp(prefix="backstop-upgrade-bench.")
    config = os.path.join(work, "proxy.yaml")
    with open(config, "w") as f:
        f.write(
            "version: 1\nlisten: [\"127.0.0.1:%d\"]\nlog: {access_log: false}\n"
            "tunnels: {allow: [\"127.0.0.1:%d\"], deny_addresses: []}\n"
            "upstreams:\n  - {name: echo, match: {hosts: [echo.test]}, url: \"http://127.0.0.1:%d\"}\n"
            % (proxy, origin, origin))
    daemon = subprocess.Popen([binary, "run", "--config", config], stderr=open(os.path.join(work, "log"), "w"))
    try:
        deadline = time.time() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", proxy)).close()
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.05)
        print("| path | round trip median (µs) | p99 (µs) | echo throughput (MiB/s) |")
        print("|---|---:|---:|---:|")
        for name, opener in [("upgrade relay (CONNECT_ONLY)", lambda: open_relay(proxy)),
                             ("CONNECT tunnel (NIO)", lambda: open_tunnel(proxy, origin))]:
            sock = opener()
            median, p99 = latency(sock)
            rate = throughput(sock)
            sock.close()
            print("| %s | %.0f | %.0f | %.0f |" % (name, median, p99, rate))
    finally:
        daemon.terminate()
        daemon.wait()


if __name__ == "__main__":
    main()
